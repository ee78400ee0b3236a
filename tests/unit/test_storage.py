import os

import pytest

from raytf import ConfigError
from raytf._internal.storage import RunStorage


def test_json_is_replaced_whole_and_no_temporary_is_left(tmp_path):
    storage = RunStorage(str(tmp_path / "root"), "run-1")
    assert storage.uri == str(tmp_path / "root" / "run-1")
    storage.write_json("history.json", [{"loss": 1.0}])
    storage.write_json("history.json", [{"loss": 1.0}, {"loss": 0.5}])
    assert storage.read_json("history.json") == [{"loss": 1.0}, {"loss": 0.5}]
    assert os.listdir(storage.root) == ["history.json"]


def test_home_is_expanded(monkeypatch, tmp_path):
    monkeypatch.setenv("HOME", str(tmp_path))
    assert RunStorage("~/results", "r").root == str(tmp_path / "results" / "r")


def test_unknown_uri_scheme_is_a_config_error():
    with pytest.raises(ConfigError, match="RunConfig.storage_path='nope://x'"):
        RunStorage("nope://x", "r")


def test_a_uri_keeps_its_query_after_the_run_name(tmp_path):
    storage = RunStorage(f"file://{tmp_path}/root?unused=1", "run")
    assert storage.uri == f"file://{tmp_path}/root/run?unused=1"
    assert storage.root == f"{tmp_path}/root/run"


def test_a_storage_path_that_is_a_file_or_unwritable_is_a_config_error_naming_it(tmp_path):
    import os

    import pytest

    from raytf._internal.storage import RunStorage
    from raytf.errors import ConfigError

    a_file = tmp_path / "results"
    a_file.write_text("not a directory")
    with pytest.raises(ConfigError) as info:
        RunStorage(str(a_file), "run")
    assert str(a_file / "run") in str(info.value) and "RunConfig.storage_path" in str(info.value)
    if os.geteuid() == 0:  # root writes through permission bits; sysfs is read-only for everyone
        read_only = "/sys/fs"
        make = lambda: RunStorage(read_only, "run")  # noqa: E731
    else:
        read_only = tmp_path / "read-only"
        (read_only / "run").mkdir(parents=True)
        read_only.joinpath("run").chmod(0o555)
        make = lambda: RunStorage(str(read_only), "run").check_writable()  # noqa: E731
    with pytest.raises(ConfigError) as info:
        make()
    assert f"{read_only}/run" in str(info.value) and "this user can write" in str(info.value)


# Credentials in a storage URI (pyarrow takes S3 keys only as s3://KEY:SECRET@bucket/...).
KEY, SECRET, TOKEN = "AKIAFAKEKEY0001", "SECRETFAKEVALUE0001", "SESSIONFAKE0001"


@pytest.mark.parametrize("uri, shown", [
    (f"s3://{KEY}:{SECRET}@bucket/runs", "s3://***:***@bucket/runs"),
    (f"s3://{KEY}:{SECRET}/with/slash+plus@bucket/runs?region=us-east-1",
     "s3://***:***@bucket/runs?region=us-east-1"),  # an AWS secret's unescaped / is not a path
    (f"s3://bucket/runs?endpoint_override=127.0.0.1:9000&session_token={TOKEN}&scheme=http",
     "s3://bucket/runs?endpoint_override=127.0.0.1:9000&session_token=***&scheme=http"),
    (f"abfs://{KEY}@container/p?account_key={SECRET}&sig={TOKEN}", "abfs://***@container/p?account_key=***&sig=***"),
    ("s3://bucket/dir@v1/runs?region=us-east-1", "s3://bucket/dir@v1/runs?region=us-east-1"),  # no user info
    ("/local/dir@1", "/local/dir@1"),
])
def test_credentials_in_a_storage_uri_are_redacted(uri, shown):
    from raytf._internal.redact import redact, scrub

    assert redact(uri) == shown
    leaked = f"open {uri} failed (as pyarrow may repeat a part: {uri.partition('://')[2]}; {uri.partition('?')[2]})"
    assert all(secret not in scrub(leaked, uri) for secret in (KEY, SECRET, TOKEN))


def test_no_error_or_repr_of_raytfs_shows_the_credentials_of_a_storage_uri(tmp_path):
    """pyarrow's refusals (a typo in an option, keys in the query) and raytf's configs."""
    import raytf

    for uri in (f"s3://{KEY}:{SECRET}@bucket/p?endpoint_overide=127.0.0.1:1",
                f"s3://bucket/p?access_key={KEY}&secret_key={SECRET}"):
        with pytest.raises(ConfigError) as raised:
            RunStorage(uri, "r")
        assert KEY not in str(raised.value) and SECRET not in str(raised.value), raised.value
        assert "RunConfig.storage_path='s3://" in str(raised.value)
    config = raytf.RunConfig(name="r", storage_path=f"s3://{KEY}:{SECRET}@bucket/p")
    assert SECRET not in repr(config) and KEY not in repr(config) and "s3://***:***@bucket/p" in repr(config)
    assert config.storage_path == f"s3://{KEY}:{SECRET}@bucket/p"  # the filesystem still opens with it
    with pytest.raises(ConfigError) as raised:
        raytf.RunConfig(storage_path=f"s3://{KEY}:{SECRET}@bucket/p", storage_filesystem=__import__(
            "pyarrow.fs").fs.LocalFileSystem())
    assert SECRET not in str(raised.value)


def test_the_run_spec_shows_the_redacted_uri_and_only_a_launched_script_gets_the_credentials():
    """get_context().run_path (every worker) is the redacted URI; RAYTF_RUN_DIR, which a launched
    script opens itself, keeps them."""
    from raytf._internal.protocol import RankInfo, RunSpec, TaskId, TensorflowSettings, WorkerSpec
    from raytf._internal.worker import payloads, ps_payloads

    storage = RunStorage.__new__(RunStorage)  # the URI's parts, without opening a bucket
    storage._given, storage.uri = f"s3://{KEY}:{SECRET}@bucket/p?region=us-east-1", "s3://***:***@bucket/p/r?region=us-east-1"
    settings = TensorflowSettings(communication="auto", collective_timeout_s=None, intra_op_threads=1,
                                  inter_op_threads=1, use_gpu=False)
    run = RunSpec(run_name="r", run_path=storage.uri, run_uri=f"s3://{KEY}:{SECRET}@bucket/p/r?region=us-east-1",
                  payload=b"", tensorflow=settings)
    rank = RankInfo(world_rank=0, world_size=1, local_rank=0, local_world_size=1, node_rank=0, num_nodes=1)
    spec = WorkerSpec(role="worker", rank=rank, tf_config="{}", attempt=0, task=TaskId("worker", 0))
    context = ps_payloads.ps_context(run, spec)
    assert SECRET not in repr(context) and context.run_path == "s3://***:***@bucket/p/r?region=us-east-1"
    env = payloads.script_environment(run, spec)
    assert env["RAYTF_RUN_DIR"] == run.run_uri
    assert env["RAYTF_CHECKPOINT_DIR"] == f"s3://{KEY}:{SECRET}@bucket/p/r/script_checkpoints?region=us-east-1"


def test_a_refused_write_is_a_storage_error_naming_the_path_and_leaves_no_temporary(tmp_path):
    """history.json or a lease claim written to storage that refuses it (here: its place taken by a
    directory, as root ignores a read-only mode) fails with the path and the cause, and the
    temporary it wrote first is removed."""
    import raytf
    from raytf._internal.storage import write_json

    (tmp_path / "history.json").mkdir()
    with pytest.raises(raytf.StorageError) as raised:
        write_json(RunStorage(str(tmp_path), "x").filesystem, str(tmp_path / "history.json"), [1])
    assert str(tmp_path / "history.json") in str(raised.value) and "IsADirectoryError" in str(raised.value)
    assert isinstance(raised.value, OSError) and isinstance(raised.value, raytf.RaytfError)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["history.json", "x"]  # no history.json.tmp-*

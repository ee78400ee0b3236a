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

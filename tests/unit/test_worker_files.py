"""Where a parameter-server worker keeps its shard files on its node: keyed by the run's identity,
made safely, and removed. No Ray, no TensorFlow."""

import os
import stat
import tempfile

import pytest

from raytf._internal.data.worker_files import ShardFileWriter, shard_directory
from raytf._internal.protocol import RunSpec, TensorflowSettings
from raytf.errors import DatasetShardError


def run(path="/results/a/ps", name="ps", token="lease-1"):
    return RunSpec(run_name=name, run_path=path, payload=b"", lease_token=token, tensorflow=TensorflowSettings(
        communication="ring", collective_timeout_s=None, intra_op_threads=1, inter_op_threads=1, use_gpu=False))


@pytest.fixture
def tmp_root(tmp_path, monkeypatch):
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    return tmp_path


def test_runs_of_one_name_in_other_storage_or_under_another_driver_never_share_a_directory(tmp_root):
    first = shard_directory(run(), 0)
    assert first == shard_directory(run(), 0)  # a replacement worker of the same driver finds it
    assert first != shard_directory(run(), 1)
    assert first != shard_directory(run(path="/results/b/ps"), 0)  # same name, other storage_path
    assert first != shard_directory(run(token="lease-2"), 0)  # the next driver of the same run
    assert first.startswith(os.path.join(str(tmp_root), f"raytf-shards-{os.getuid()}") + os.sep)


def test_a_planted_link_is_removed_not_followed_and_the_directory_is_private_and_cleaned_up(tmp_root):
    target = tmp_root / "attacker"
    target.mkdir()
    (target / "keep").write_text("theirs")
    directory = shard_directory(run(), 0)
    os.mkdir(os.path.dirname(os.path.dirname(directory)), 0o700)
    os.mkdir(os.path.dirname(directory), 0o700)
    os.symlink(target, directory)
    writer = ShardFileWriter(directory)
    assert not os.path.islink(directory) and os.path.isdir(directory)
    assert stat.S_IMODE(os.lstat(directory).st_mode) == 0o700
    with open(os.path.join(directory, "train.x.0"), "w") as f:
        f.write("rows")
    assert sorted(os.listdir(target)) == ["keep"]  # nothing written through the link, nothing deleted
    writer.close()
    assert not os.path.lexists(directory) and not os.path.lexists(os.path.dirname(directory))
    assert os.path.isdir(os.path.dirname(os.path.dirname(directory)))  # the per-user parent stays, 0700


@pytest.mark.parametrize("plant", ["link", "open"])
def test_a_shared_parent_that_is_a_link_or_open_to_others_is_refused(tmp_root, plant):
    directory = shard_directory(run(), 0)
    base = os.path.dirname(os.path.dirname(directory))
    (tmp_root / "elsewhere").mkdir()
    if plant == "link":
        os.symlink(tmp_root / "elsewhere", base)
    else:
        os.mkdir(base)
        os.chmod(base, 0o777)
    with pytest.raises(DatasetShardError) as info:
        ShardFileWriter(directory)
    assert base in str(info.value) and "Remove it" in str(info.value)
    assert os.listdir(tmp_root / "elsewhere") == []

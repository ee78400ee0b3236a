"""The newest committed checkpoint kept in host memory on the chief's node, and restarts that read
it (CheckpointConfig(restore_from_memory=True)), without Ray: a real WorkerSession reporting to
the driver's real report handler and checkpoint manager (test_async_checkpoints.Run), shared
memory and the temporary directory moved under the test's own directory."""

import os

import pytest

import raytf
from raytf._internal.checkpoint import memory, snapshot
from raytf._internal.protocol import CheckpointUpload, StorageRef
from raytf.checkpoint import StateCheckpoint
from tests.unit.test_async_checkpoints import Run, directory_checkpoint

pytestmark = pytest.mark.unit


@pytest.fixture(autouse=True)
def memory_roots(snapshot_roots, monkeypatch):
    shm, _ = snapshot_roots
    monkeypatch.setattr(memory, "_swept", True)  # sweep_once is tested on its own
    monkeypatch.setattr(memory, "_owner", "")
    monkeypatch.setattr(memory, "_live_groups", None)
    return shm


class Files(StateCheckpoint):
    """A state checkpoint whose writing is one file (TensorFlow's files are tested elsewhere)."""

    def __init__(self, text):
        super().__init__({"text": text})

    def write(self, directory):
        with open(os.path.join(directory, "state.txt"), "w") as out:
            out.write(self.trackables["text"])

    def host_copy(self):
        return None  # written at once, as the state of an object that cannot copy itself is


def copies(shm):
    """{run directory: sorted checkpoint names} of the memory copies in ``shm``."""
    return {d.name: sorted(p.name for p in d.iterdir() if p.name != memory.OWNER)
            for d in shm.iterdir() if d.name.startswith(memory.PREFIX)}


def restarted(run, tmp_path, **options):
    """The run's next attempt on the same node: a new driver's resume point, a new session."""
    return Run(tmp_path, memory=True, resume=run.manager.resume_point(), **options)


@pytest.mark.parametrize("upload", [CheckpointUpload.ASYNC, CheckpointUpload.SYNC])
def test_the_newest_commit_stays_in_memory_and_a_restart_on_the_node_restores_from_it(tmp_path, memory_roots, upload):
    run = Run(tmp_path, memory=True, upload=upload)
    run.session.report({"epoch": 0}, checkpoint=Files("epoch 0"))
    run.session.report({"epoch": 1}, checkpoint=Files("epoch 1"))
    run.session.finish_uploads()
    assert list(copies(memory_roots).values()) == [["checkpoint_000001"]]  # the newest only
    assert not [p for p in memory_roots.iterdir() if p.name.startswith(snapshot.PREFIX)]  # renamed, not copied

    again = restarted(run, tmp_path)
    checkpoint = again.session.get_checkpoint()
    assert checkpoint.path.startswith(str(memory_roots)) and checkpoint.epoch == 1
    assert open(os.path.join(checkpoint.path, "state.txt")).read() == "epoch 1"
    assert again.session.progress().restored_from == "memory"
    assert again.session.get_checkpoint() is checkpoint  # decided once per attempt


def test_a_copy_that_does_not_match_the_committed_manifest_falls_back_to_storage(tmp_path, memory_roots, caplog):
    run = Run(tmp_path, memory=True)
    run.session.report({"epoch": 0}, checkpoint=Files("epoch 0"))
    run.session.finish_uploads()
    [run_dir] = copies(memory_roots)
    with open(memory_roots / run_dir / "checkpoint_000000" / "state.txt", "w") as out:
        out.write("epoch X")  # the same size, other bytes: only the CRC32 tells

    again = restarted(run, tmp_path)
    checkpoint = again.session.get_checkpoint()
    assert checkpoint.path == run.manager.path_of(run.manager.entries[-1])
    with checkpoint.as_directory() as files:
        assert open(os.path.join(files, "state.txt")).read() == "epoch 0"
    assert again.session.progress().restored_from == "storage"
    assert "does not match the committed one" in caplog.text and "does not match its checksum" in caplog.text
    assert copies(memory_roots) == {run_dir: []}  # the bad copy is gone


def test_a_copy_of_an_older_checkpoint_is_never_used_and_is_removed(tmp_path, memory_roots):
    run = Run(tmp_path, memory=True)
    run.session.report({"epoch": 0}, checkpoint=Files("epoch 0"))
    run.session.finish_uploads()
    [run_dir] = copies(memory_roots)
    kept = memory_roots / run_dir / "checkpoint_000000"
    os.rename(kept, memory_roots / "elsewhere")
    run.session.report({"epoch": 1}, checkpoint=directory_checkpoint(tmp_path, "epoch 1")[0])
    run.session.finish_uploads()
    os.rename(memory_roots / "elsewhere", kept)  # as if checkpoint 1's copy were on another node
    (memory_roots / run_dir / "checkpoint_000001").rename(memory_roots / "other-node")

    again = restarted(run, tmp_path)
    assert again.session.get_checkpoint().epoch == 1
    assert again.session.progress().restored_from == "storage"
    assert not kept.exists()


def test_a_refused_commit_keeps_no_copy_and_frees_its_snapshot(tmp_path, memory_roots):
    run = Run(tmp_path, refuse="the run's lease is lost", memory=True)
    run.session.report({"epoch": 0}, checkpoint=Files("epoch 0"))
    run.session._uploads.wait()
    assert not copies(memory_roots) and not list(memory_roots.iterdir())


def test_without_restore_from_memory_nothing_stays_and_restarts_read_storage(tmp_path, memory_roots):
    run = Run(tmp_path, memory=False)
    run.session.report({"epoch": 0}, checkpoint=Files("epoch 0"))
    run.session.finish_uploads()
    assert not list(memory_roots.iterdir())
    again = Run(tmp_path, memory=False, resume=run.manager.resume_point())
    assert again.session.get_checkpoint().path == run.manager.path_of(run.manager.entries[-1])
    assert again.session.progress().restored_from == "storage"


def test_the_copies_of_runs_whose_placement_group_is_gone_are_swept(tmp_path, memory_roots, monkeypatch):
    import socket

    with socket.socket() as probe:  # a port nothing listens on: a cluster that is gone
        probe.bind(("127.0.0.1", 0))
        gone = f"127.0.0.1:{probe.getsockname()[1]}"
    alive = socket.create_server(("127.0.0.1", 0))  # another cluster's GCS, up
    other = f"127.0.0.1:{alive.getsockname()[1]}"
    owners = [("10.0.0.1:6379", "live"), ("10.0.0.1:6379", "removed"), (other, "removed"), (gone, "live"), ("", "")]
    for cluster, group in owners:
        storage = StorageRef(raytf.Checkpoint("/").filesystem, str(tmp_path / f"{cluster}-{group}"))
        snap = memory_roots / f"snap-{cluster}-{group}"
        snap.mkdir()
        memory.configure(cluster, group, set)
        memory.keep(storage, "checkpoint_000003", str(snap))
    monkeypatch.setattr(memory, "_swept", False)
    memory.configure("10.0.0.1:6379", "live", lambda: {"live"})

    def left():
        return sorted(open(memory_roots / d / memory.OWNER).read() for d in copies(memory_roots)
                      if (memory_roots / d / memory.OWNER).exists())

    orphan = memory_roots / f"{memory.PREFIX}killed-before-its-owner-file" / "checkpoint_000001"
    orphan.mkdir(parents=True)  # a worker killed between keeping a copy and naming its owner
    memory.sweep_once()
    # A live cluster's copy (another ray start on the machine) is not this one's to judge, a cluster
    # that no longer listens left its copy behind, and one without an owner is left while it is new.
    assert left() == ["", "10.0.0.1:6379 live", f"{other} removed"] and orphan.exists()
    memory.configure("10.0.0.1:6379", "live", set)
    memory.sweep_once()  # once per process: the next snapshot does not ask Ray again
    assert left() == ["", "10.0.0.1:6379 live", f"{other} removed"]
    old = __import__("time").time() - memory.ORPHAN_AGE_S - 1
    for path in memory_roots.rglob("*"):
        os.utime(path, (old, old))
    memory.sweep(str(memory_roots))  # past ORPHAN_AGE_S with no owner: swept (and "live" is gone now)
    assert left() == [f"{other} removed"] and not orphan.parent.exists()
    alive.close()


def test_restore_from_memory_is_on_by_default_and_must_be_a_bool():
    assert raytf.CheckpointConfig().restore_from_memory is True
    with pytest.raises(raytf.ConfigError, match="CheckpointConfig.restore_from_memory must be True or False"):
        raytf.CheckpointConfig(restore_from_memory="yes")

"""Asynchronous checkpoints (CheckpointConfig(upload="async")) from a worker's report to the
driver's index, without Ray: a real WorkerSession, the driver's real report handler, checkpoint
manager and history on a temp dir, joined by a sink that plays the controller (it hands each
report to the handler and acknowledges a checkpoint's commit, as controller._watch does)."""

import json
import os
import shutil
import threading
import time

import numpy as np
import pyarrow.fs as pafs
import pytest

import raytf
from raytf._internal.checkpoint import snapshot as _snapshot
from raytf._internal.checkpoint import state as _state
from raytf._internal.checkpoint.manager import CheckpointManager
from raytf._internal.driver.history import RunHistory, report_handler
from raytf._internal.driver.progress import ProgressDisplay
from raytf._internal.protocol import CheckpointUpload, ReportStage, ResumePoint, StorageRef
from raytf._internal.storage import RunStorage
from raytf._internal.checkpoint import saver as _saver_module
from raytf._internal.worker.session import WorkerSession
from raytf.errors import CheckpointError, RaytfError
from raytf.session import TrainContext

pytestmark = pytest.mark.unit


class Run:
    """One chief's session (asynchronous uploads) and the driver side it reports to. ``gate``,
    while clear, holds back the driver's handling of uploaded checkpoints (a slow commit)."""

    def __init__(self, tmp_path, refuse=None, *, memory=False, resume=ResumePoint(), upload=CheckpointUpload.ASYNC):
        self.storage = RunStorage(str(tmp_path / "results"), "run")
        self.manager = CheckpointManager(self.storage.filesystem, self.storage.root)
        self.history = RunHistory(self.storage, ProgressDisplay("run", 0), 0, [])
        self.on_report = report_handler(self.manager, self.history, 0)
        self.gate = threading.Event()
        self.gate.set()
        self.refuse = refuse  # a commit error the driver answers instead of committing
        self.received = []
        context = TrainContext(0, 1, 0, 1, 0, 1, 0, "run", self.storage.uri, "{}")
        self.session = WorkerSession(
            context, strategy=None, sink=self.sink, resume=resume,
            storage=StorageRef(self.storage.filesystem, self.storage.root), upload=upload,
            restore_from_memory=memory,
        )

    def sink(self, report):
        self.received.append(report)
        if report.stage is ReportStage.UPLOADED:
            assert self.gate.wait(30)
        error = self.refuse or self.on_report(report)
        if report.checkpoint is not None:
            self.session.acknowledge(report.seq, error)

    def index(self):
        path, fs = self.manager.dir + "/index.json", self.storage.filesystem
        if fs.get_file_info(path).type == pafs.FileType.NotFound:
            return []
        return [c["name"] for c in json.loads(fs.open_input_stream(path).read())["checkpoints"]]


def directory_checkpoint(tmp_path, text):
    source = tmp_path / "user"
    source.mkdir(exist_ok=True)
    (source / "weights.txt").write_text(text)
    return raytf.Checkpoint.from_directory(source), source


def test_report_returns_before_the_commit_the_directory_may_go_at_once_and_the_history_names_the_commit(tmp_path):
    run = Run(tmp_path)
    run.gate.clear()
    checkpoint, source = directory_checkpoint(tmp_path, "epoch 0")
    before = time.time()
    run.session.report({"epoch": 0, "loss": 1.0}, checkpoint=checkpoint)  # returns with the commit held back
    shutil.rmtree(source)  # the user deletes the directory as soon as report returns
    assert run.index() == []
    [entry] = run.history.entries
    assert entry["epoch"] == 0 and "checkpoint" not in entry  # the metrics are recorded at once
    assert run.received[0].stage is ReportStage.PENDING
    run.gate.set()
    run.session.finish_uploads()  # what train_fn's end waits for
    assert run.index() == ["checkpoint_000000"]
    assert entry["checkpoint"] == "checkpoint_000000" and entry["committed_at"] >= before
    with raytf.Checkpoint(run.manager.path_of(run.manager.entries[-1])).as_directory() as committed:
        assert open(f"{committed}/weights.txt").read() == "epoch 0"
    written = json.loads((tmp_path / "results" / "run" / "history.json").read_text())
    assert written[0]["checkpoint"] == "checkpoint_000000"  # written with the commit


def test_a_chiefs_checkpoint_is_on_its_way_from_before_its_halt_check_until_its_commit(tmp_path):
    """What the chief answers a halt (actor.halt: ``session.uploading``): a report with an
    asynchronous checkpoint is on its way from before its halt check, through its snapshot, until
    its commit, so a halt that lands while the snapshot is taken still waits for its upload; a
    report after the halt raises and sets nothing out."""
    halted = threading.Event()
    run = Run(tmp_path)
    run.session._halted = halted.is_set
    run.gate.clear()  # the driver's commit held back
    snapshotting, go_on = threading.Event(), threading.Event()
    snapshot = run.session._saver.snapshot

    def slow_snapshot(*args):
        snapshotting.set()
        assert go_on.wait(30)
        return snapshot(*args)

    run.session._saver.snapshot = slow_snapshot
    checkpoint, _ = directory_checkpoint(tmp_path, "epoch 0")
    assert not run.session.uploading()
    reporting = threading.Thread(target=run.session.report, args=({"epoch": 0}, checkpoint))
    reporting.start()
    assert snapshotting.wait(30)
    halted.set()  # the halt lands while the snapshot is taken: no upload has started yet
    assert run.session.uploading()
    go_on.set()
    reporting.join(30)
    assert run.session.uploading()  # now in flight, its commit held back
    run.gate.set()
    run.session.finish_uploads()
    assert not run.session.uploading() and run.index() == ["checkpoint_000000"]
    with pytest.raises(RaytfError, match="the run is stopping"):
        run.session.report({"epoch": 1}, checkpoint=checkpoint)
    assert not run.session.uploading()


def test_a_checkpoint_waits_for_the_previous_ones_commit_and_metrics_alone_do_not(tmp_path):
    run = Run(tmp_path)
    run.gate.clear()
    first, _ = directory_checkpoint(tmp_path, "one")
    run.session.report({"epoch": 0}, checkpoint=first)
    run.session.report({"step": 5})  # no checkpoint: does not wait
    second = threading.Thread(target=run.session.report, args=({"epoch": 1}, first))
    second.start()
    second.join(0.5)
    assert second.is_alive(), "a second checkpoint went ahead while the first was in flight"
    run.gate.set()
    second.join(30)
    run.session.finish_uploads()
    assert run.index() == ["checkpoint_000000", "checkpoint_000001"]
    assert [e.get("checkpoint") for e in run.history.entries] == ["checkpoint_000000", None, "checkpoint_000001"]


def test_a_failing_upload_is_tried_again_and_a_lasting_failure_is_raised_by_the_next_report(tmp_path, monkeypatch):
    monkeypatch.setattr(_saver_module, "_BACKOFF_S", 0.01)
    run = Run(tmp_path)
    upload = run.session._saver.upload_snapshot
    tries = []

    def flaky(seq, directory):  # storage that fails the first try of every checkpoint after the first
        tries.append(seq)
        if seq >= 1 and tries.count(seq) == 1 or seq >= 2:
            raise OSError("storage unavailable")
        return upload(seq, directory)

    monkeypatch.setattr(run.session._saver, "upload_snapshot", flaky)
    checkpoint, _ = directory_checkpoint(tmp_path, "w")
    for epoch in range(2):
        run.session.report({"epoch": epoch}, checkpoint=checkpoint)
    run.session.finish_uploads()
    assert run.index() == ["checkpoint_000000", "checkpoint_000001"]  # the second took two tries
    run.session.report({"epoch": 2}, checkpoint=checkpoint)  # fails every try
    with pytest.raises(CheckpointError, match="checkpoint_000002 was not uploaded: OSError: storage unavailable"):
        run.session.finish_uploads()
    with pytest.raises(CheckpointError, match="last committed checkpoint is intact"):
        run.session.report({"loss": 1.0})  # the next report raises it too
    assert tries.count(2) == _saver_module.UPLOAD_TRIES
    assert run.index() == ["checkpoint_000000", "checkpoint_000001"]


def test_a_commit_the_driver_refuses_is_raised_by_the_next_report(tmp_path):
    run = Run(tmp_path, refuse="the run's lease is lost")
    checkpoint, _ = directory_checkpoint(tmp_path, "w")
    run.session.report({"epoch": 0}, checkpoint=checkpoint)
    with pytest.raises(CheckpointError, match="checkpoint_000000 was not committed: the run's lease is lost"):
        run.session.report({"epoch": 1}, checkpoint=checkpoint)


@pytest.mark.parametrize("updates", ["dense", "sparse"])
def test_a_state_checkpoint_is_the_state_at_report_time_while_training_goes_on(tmp_path, monkeypatch, updates):
    # The report returns once the state is copied in host memory; a background thread writes the
    # files while training updates the variables: in place on a dense variable (TensorFlow copies
    # on write), and on a table that sparse updates put in copy-on-read mode.
    import tensorflow as tf

    run = Run(tmp_path)
    run.gate.clear()
    table = tf.Variable(tf.zeros([256, 64]))
    step = tf.Variable(0, dtype=tf.int64)
    rows = tf.constant(list(range(256)))
    seen = []
    original = _snapshot.take

    def take(checkpoint, *, keep, background=False):
        assert background  # an asynchronous report writes the state from a host copy, in the background
        seen.append(original(checkpoint, keep=keep, background=background))
        return seen[-1]

    def train():
        if updates == "dense":
            table.assign_add(tf.ones([256, 64]))
        else:
            tf.gather(table, rows)
            table.scatter_add(tf.IndexedSlices(tf.ones([256, 64]), rows))
        step.assign_add(1)

    monkeypatch.setattr(_snapshot, "take", take)
    train()
    run.session.report({"step": 1}, checkpoint=raytf.Checkpoint.from_state(table=table, step=step))
    for _ in range(3):  # training goes on while the files are written and the upload waits
        train()
    if _snapshot._roots()[0] == _snapshot.SHARED_MEMORY:
        assert seen[0].startswith(_snapshot.SHARED_MEMORY + "/")  # the snapshot is in memory
    run.gate.set()
    run.session.finish_uploads()
    restored_table, restored_step = tf.Variable(tf.zeros([256, 64])), tf.Variable(0, dtype=tf.int64)
    raytf.Checkpoint(run.manager.path_of(run.manager.entries[-1])).restore_state(table=restored_table,
                                                                               step=restored_step)
    assert int(restored_step.numpy()) == 1
    np.testing.assert_array_equal(restored_table.numpy(), np.ones([256, 64]))
    assert not os.path.exists(seen[0])  # the snapshot is freed once committed


def test_a_state_too_large_for_shared_memory_is_written_to_disk_and_a_failed_write_fails_its_checkpoint(
        snapshot_roots, monkeypatch, caplog):
    import tensorflow as tf

    _, disk = snapshot_roots
    table = tf.Variable(tf.ones([1024, 256]))  # 1 MiB
    monkeypatch.setattr(_snapshot, "free_bytes", lambda root: 1 << 20)  # with the index, not enough
    directory = _snapshot.take(raytf.Checkpoint.from_state(table=table), keep=True, background=True)
    _snapshot.ready(directory)
    assert directory.startswith(str(disk)) and os.path.exists(os.path.join(directory, "state.index"))
    assert "does not fit in" in caplog.text and _snapshot._roots() == [str(disk)]
    _snapshot.discard(directory)

    def full(*args):  # the disk fills up after report returned
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(_state._tf_hooks, "write_copies", full)
    directory = _snapshot.take(raytf.Checkpoint.from_state(table=table), keep=True, background=True)
    with pytest.raises(CheckpointError, match=r"writing the checkpoint's state into .*tmp failed .*No space left"):
        _snapshot.ready(directory)
    assert not os.path.exists(directory)


def test_a_snapshot_that_does_not_fit_in_shared_memory_goes_to_the_temporary_directory(tmp_path, monkeypatch, caplog):
    full = tmp_path / "shm"
    full.mkdir()
    monkeypatch.setattr(_snapshot, "SHARED_MEMORY", str(full))
    monkeypatch.setattr(_snapshot, "_disk_only", False)
    monkeypatch.setattr(_snapshot.tempfile, "tempdir", str(tmp_path / "disk"))
    (tmp_path / "disk").mkdir()

    class TooBig:  # a checkpoint whose writing runs out of room in shared memory only
        def write(self, directory):
            if directory.startswith(str(full)):
                raise OSError(28, "No space left on device")
            open(f"{directory}/state", "w").write("x")

    monkeypatch.setattr("raytf.checkpoint.StateCheckpoint", TooBig)
    kept = _snapshot.take(TooBig(), keep=True)
    assert kept.startswith(str(tmp_path / "disk")) and open(f"{kept}/state").read() == "x"
    assert "did not fit in" in caplog.text and not list(full.iterdir())
    assert _snapshot._roots() == [str(tmp_path / "disk")]  # the rest of the process skips shared memory


def test_upload_must_be_async_or_sync():
    assert raytf.CheckpointConfig().upload == "async"
    with pytest.raises(raytf.ConfigError, match="CheckpointConfig.upload must be 'async'.*or 'sync'"):
        raytf.CheckpointConfig(upload="later")


def test_snapshots_of_processes_that_died_are_swept_away_and_live_ones_kept(tmp_path):
    import subprocess
    import sys

    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    for pid in (int(dead.stdout), os.getpid()):
        (tmp_path / f"{_snapshot.PREFIX}{pid}-abc").mkdir()
    (tmp_path / "unrelated").mkdir()
    _snapshot.sweep(str(tmp_path))
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [f"{_snapshot.PREFIX}{os.getpid()}-abc", "unrelated"])


def test_a_restores_local_copy_of_a_remote_checkpoint_is_named_by_its_process_and_swept_once_it_is_gone(
        tmp_path, monkeypatch):
    """A worker raytf stops is killed, so its exit hook never removes the local copy a restore from
    storage made (the checkpoint's size, in the node's temporary directory): the next copy on the
    node removes those of processes that are gone, and keeps live ones'."""
    import subprocess
    import sys
    import tempfile

    from raytf import checkpoint as _checkpoint

    temp = tmp_path / "temp"
    temp.mkdir()
    monkeypatch.setattr(tempfile, "tempdir", str(temp))
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    left = temp / f"raytf-restore-{int(dead.stdout)}-abc"
    left.mkdir()
    (left / "state.data").write_bytes(b"x" * 1024)
    source = tmp_path / "checkpoint"
    source.mkdir()
    (source / "weights.txt").write_text("w")
    copy = _checkpoint._kept_copy(raytf.Checkpoint(str(source), pafs.LocalFileSystem()))
    assert not left.exists()
    assert os.path.basename(copy).startswith(f"raytf-restore-{os.getpid()}-")
    with open(os.path.join(copy, "weights.txt")) as f:
        assert f.read() == "w"
    _checkpoint._kept_copy(raytf.Checkpoint(str(source), pafs.LocalFileSystem()))
    assert os.path.exists(copy)  # this process's own copy stays while it lives


def test_an_upload_that_storage_lost_part_of_is_found_before_the_commit_and_tried_again(tmp_path, monkeypatch, caplog):
    from raytf._internal.checkpoint import saver as _saver

    monkeypatch.setattr(_saver_module, "_BACKOFF_S", 0.01)
    real, calls = _saver.upload, []

    def lossy(checkpoint, fs, directory, name):  # the first upload's data file vanishes without an error
        path = real(checkpoint, fs, directory, name)
        calls.append(name)
        if len(calls) == 1:
            fs.delete_file(f"{path}/weights.txt")
        return path

    monkeypatch.setattr(_saver, "upload", lossy)
    run = Run(tmp_path)
    checkpoint, _ = directory_checkpoint(tmp_path, "w")
    run.session.report({"epoch": 0}, checkpoint=checkpoint)
    run.session.finish_uploads()
    assert calls == ["checkpoint_000000", "checkpoint_000000"] and run.index() == ["checkpoint_000000"]
    assert "incomplete in storage after its upload" in caplog.text


class Ranks:
    """Two ranks' sessions making collective reports (``ranks="all"``) to the driver's real report
    handler, which acknowledges each rank once the round's merged checkpoint is committed."""

    def __init__(self, tmp_path, upload=CheckpointUpload.ASYNC):
        self.storage = RunStorage(str(tmp_path / "results"), "run")
        self.manager = CheckpointManager(self.storage.filesystem, self.storage.root)
        self.history = RunHistory(self.storage, ProgressDisplay("run", 0), 0, [])
        self.on_report = report_handler(self.manager, self.history, 0,
                                        acknowledge=lambda rank, seq, error: self.sessions[rank].acknowledge(seq, error))
        self.gate = threading.Event()
        self.gate.set()
        self.lock = threading.Lock()  # the controller handles one report at a time
        storage = StorageRef(self.storage.filesystem, self.storage.root)
        self.sessions = [
            WorkerSession(TrainContext(rank, 2, rank, 2, 0, 1, 0, "run", self.storage.uri, "{}"), strategy=None,
                          sink=self.sink, storage=storage, upload=upload)
            for rank in (0, 1)
        ]

    def sink(self, report):
        if report.stage is ReportStage.UPLOADED and report.part.files is not None:  # an upload's arrival
            assert self.gate.wait(30)
        with self.lock:
            self.on_report(report)

    def report_all(self, metrics, checkpoints, **kw):
        """Every rank's report, each from its own thread (as on two workers); returns once all have."""
        threads = [threading.Thread(target=s.report, args=(metrics, c, "all"), kwargs=kw)
                   for s, c in zip(self.sessions, checkpoints)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
        return not any(t.is_alive() for t in threads)

    def committed_files(self):
        with raytf.Checkpoint(self.manager.path_of(self.manager.entries[-1])).as_directory() as files:
            return {name: open(os.path.join(files, name)).read() for name in sorted(os.listdir(files))
                    if not name.startswith(".")}


def rank_checkpoint(tmp_path, rank, text):
    source = tmp_path / f"rank-{rank}"
    source.mkdir(exist_ok=True)
    (source / f"part-{rank}.txt").write_text(text)
    return raytf.Checkpoint.from_directory(source), source


def test_an_asynchronous_collective_report_returns_before_the_merge_and_commits_every_ranks_files(tmp_path):
    ranks = Ranks(tmp_path)
    ranks.gate.clear()  # the uploads wait: the reports must return all the same
    (zero, zero_dir), (one, one_dir) = rank_checkpoint(tmp_path, 0, "a"), rank_checkpoint(tmp_path, 1, "b")
    assert ranks.report_all({"epoch": 0}, [zero, one]), "an asynchronous collective report waited for the commit"
    shutil.rmtree(zero_dir), shutil.rmtree(one_dir)  # the users' directories may go at once
    [entry] = ranks.history.entries
    assert entry["epoch"] == 0 and "checkpoint" not in entry and ranks.manager.entries == []
    ranks.gate.set()
    for session in ranks.sessions:
        session.finish_uploads()  # train_fn's end on each rank
    assert ranks.committed_files() == {"part-0.txt": "a", "part-1.txt": "b"}
    assert entry["checkpoint"] == "checkpoint_000000" and "committed_at" in entry
    # A rank without a checkpoint sends its share at once; the round commits rank 0's files alone.
    again, _ = rank_checkpoint(tmp_path, 0, "c")
    assert ranks.report_all({"epoch": 1}, [again, None])
    ranks.sessions[0].finish_uploads()
    assert ranks.committed_files() == {"part-0.txt": "c"}
    assert [e.get("checkpoint") for e in ranks.history.entries] == ["checkpoint_000000", "checkpoint_000001"]
    # Rank 0 without one: its metrics are the history at once, in order, named once rank 1's commits.
    ranks.gate.clear()
    late, _ = rank_checkpoint(tmp_path, 1, "d")
    assert ranks.report_all({"epoch": 2}, [None, late])
    assert [(e["epoch"], e.get("checkpoint")) for e in ranks.history.entries][-1] == (2, None)
    ranks.gate.set()
    ranks.sessions[1].finish_uploads()
    assert ranks.committed_files() == {"part-1.txt": "d"}
    assert [(e["epoch"], e.get("checkpoint")) for e in ranks.history.entries] == [
        (0, "checkpoint_000000"), (1, "checkpoint_000001"), (2, "checkpoint_000002")]


def test_a_synchronous_collective_report_still_returns_only_after_the_commit(tmp_path):
    ranks = Ranks(tmp_path)  # the run's upload is async; this report asks for SYNC (raytf.train.report's mode)
    (zero, _), (one, _) = rank_checkpoint(tmp_path, 0, "a"), rank_checkpoint(tmp_path, 1, "b")
    assert ranks.report_all({"epoch": 0}, [zero, one], upload=CheckpointUpload.SYNC)
    assert [e.name for e in ranks.manager.entries] == ["checkpoint_000000"]  # committed before report returned
    assert ranks.committed_files() == {"part-0.txt": "a", "part-1.txt": "b"}


@pytest.mark.parametrize("upload", [CheckpointUpload.ASYNC, CheckpointUpload.SYNC])
def test_report_callback_sets_aside_host_memory_for_the_first_asynchronous_checkpoints_copy(
        tmp_path, monkeypatch, upload):
    # After the first batch (the optimizer's variables exist), ReportCallback has host memory of
    # the state's sizes faulted in (state.prewarm), so that the epoch's checkpoint copies into it;
    # a synchronous run copies nothing in report, and sets nothing aside.
    import tensorflow as tf

    from raytf._internal.worker import session as worker_session
    from raytf.keras import _callback

    run = Run(tmp_path, upload=upload)
    monkeypatch.setattr(worker_session, "_session", run.session)
    asked = []

    def prewarm(trackables):
        asked.append((int(trackables["model"].optimizer.iterations.numpy()),
                      sum(_state._nbytes(v) for v in trackables["model"].variables)))
        warming = _state.prewarm(trackables)
        if warming is not None:
            warming.result()
        return warming

    monkeypatch.setattr(_callback, "prewarm", prewarm)
    keras = tf.keras
    model = keras.Sequential([keras.Input((4096,)), keras.layers.Dense(4096)])  # 64 MiB of kernel
    model.compile(optimizer=keras.optimizers.SGD(), loss="mse")
    model.fit(tf.ones([8, 4096]), tf.ones([8, 4096]), batch_size=4, epochs=1, verbose=0,
              callbacks=[raytf.keras.ReportCallback()])
    run.session.finish_uploads()
    assert len(run.manager.entries) == 1  # the epoch's checkpoint, committed
    if upload is CheckpointUpload.ASYNC:
        assert asked == [(1, 4096 * 4096 * 4 + 4096 * 4)]  # once, after the first step, the whole model
    else:
        assert asked == []

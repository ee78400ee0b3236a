"""File sources (raytf.data.tfrecord_files / parquet_files): counting, each epoch's layout, and a
worker's tf.data over real files resumed mid-epoch on a group of another size, with no Ray."""

from __future__ import annotations

import os
import struct

import numpy as np
import pytest

import raytf.data
from raytf._internal.data import position as P
from raytf._internal.data.files import FilePlan, FileSource, Layout, run_slice
from raytf._internal.data.formats import format_of, plan_files
from raytf._internal.data.formats.tfrecord import scan_tfrecord

pytestmark = pytest.mark.unit


def fake_plan(rows_per_chunk, shuffle_rows=10):
    rows = np.array(rows_per_chunk, dtype=np.int64)
    count = len(rows)
    return FilePlan(FileSource("tfrecord", ("x",), features={}, chunk_rows=int(rows.max()), shuffle_rows=shuffle_rows),
                    ("x",), np.zeros(count, np.int64), np.zeros(count, np.int64), rows, np.zeros(count, np.int64),
                    rows * 100)


def rows_read(layout, run):
    """The plan's rows (numbered by chunk, then record) that ``run``'s pieces yield, in order."""
    first = np.concatenate([[0], np.cumsum(layout.plan.chunk_rows)])
    out = []
    for piece in layout.pieces(run):
        concatenated = np.concatenate([np.arange(first[c], first[c + 1]) for c in piece.chunks])
        out.append(concatenated[piece.take])
    return np.concatenate(out) if out else np.zeros(0, np.int64)


@pytest.mark.parametrize("shuffle", [False, True])
def test_any_cut_of_an_epochs_positions_reads_every_row_once_in_the_layouts_order(shuffle):
    rng = np.random.default_rng(3)
    plan = fake_plan(rng.integers(1, 9, size=40))
    layout = Layout(plan, shuffle, seed=11, epoch=2)
    whole = rows_read(layout, ((0, plan.rows),))
    assert sorted(whole) == list(range(plan.rows))
    assert (whole == np.arange(plan.rows)).all() != shuffle
    for _ in range(20):  # the positions cut anyhow, as resumes of any size do: the same rows, in the same order
        cuts = np.unique(np.concatenate([[0, plan.rows], rng.integers(0, plan.rows, size=6)]))
        parts = [rows_read(layout, ((a, b),)) for a, b in zip(cuts[:-1], cuts[1:])]
        assert (np.concatenate(parts) == whole).all()
    assert not (rows_read(Layout(plan, shuffle, 11, 3), ((0, plan.rows),)) == whole).all() if shuffle else True


def test_a_shuffle_window_ends_at_its_rows_and_a_piece_reads_only_the_chunks_it_needs():
    plan = fake_plan([4] * 10, shuffle_rows=8)
    layout = Layout(plan, False, 0, 0)
    assert list(layout.window_chunks) == [0, 2, 4, 6, 8, 10]
    pieces = layout.pieces(((3, 5),))  # positions 3..4: the end of chunk 0, the start of chunk 1
    assert [list(p.chunks) for p in pieces] == [[0, 1]] and list(pieces[0].take) == [3, 4]
    assert [list(p.chunks) for p in layout.pieces(((9, 18),))] == [[2, 3], [4]]
    assert run_slice(((0, 5), (10, 20)), 3, 9) == ((3, 5), (10, 14))


def tfrecord_bytes(lengths):
    return b"".join(struct.pack("<Q", n) + b"\0" * 4 + b"r" * n + b"\0" * 4 for n in lengths)


def test_counting_a_tfrecord_file_keeps_each_chunks_byte_offset_and_names_a_truncated_file():
    data = tfrecord_bytes([5, 0, 300, 7, 9])
    read_at = lambda n, at: data[at:at + n]  # noqa: E731
    counts, offsets = scan_tfrecord(read_at, len(data), 2, "f")
    assert counts == [2, 2, 1] and offsets == [0, 21 + 16, 21 + 16 + 316 + 23]  # a record: 16 bytes and its data
    for cut in (len(data) - 3, len(data) - 20):
        with pytest.raises(raytf.DataError, match="f ends inside a record.*compressed"):
            scan_tfrecord(read_at, cut, 2, "f")


def test_file_sources_refuse_bad_arguments_by_name():
    with pytest.raises(raytf.ConfigError, match=r"tfrecord_files\(chunk_rows=...\) must be an int >= 1, got 0"):
        raytf.data.tfrecord_files("/x", {"a": _fixed()}, chunk_rows=0)
    with pytest.raises(raytf.ConfigError, match=r"parquet_files\(columns=...\) takes a list of column names"):
        raytf.data.parquet_files("/x", columns="a")
    with pytest.raises(raytf.ConfigError, match=r"tfrecord_files: '/nowhere/at/all' does not exist"):
        plan_files(raytf.data.tfrecord_files("/nowhere/at/all", {"a": _fixed()}))


def _fixed():
    import tensorflow as tf

    return tf.io.FixedLenFeature([], tf.int64)


ROWS = 1003


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """The same rows (``id``, and ``x``: the id in 3 floats) as 4 TFRecord files and as 3 Parquet
    files of several row groups."""
    import pyarrow as pa
    import pyarrow.parquet as pq
    import tensorflow as tf

    root = tmp_path_factory.mktemp("files")
    (root / "tfrecord").mkdir()
    (root / "parquet").mkdir()
    ids = np.arange(ROWS)
    for i, part in enumerate(np.array_split(ids, 4)):
        with tf.io.TFRecordWriter(str(root / "tfrecord" / f"part-{i}.tfrecord")) as writer:
            for v in part:
                writer.write(tf.train.Example(features=tf.train.Features(feature={
                    "id": tf.train.Feature(int64_list=tf.train.Int64List(value=[v])),
                    "x": tf.train.Feature(float_list=tf.train.FloatList(value=[v] * 3)),
                })).SerializeToString())
    (root / "tfrecord" / "_SUCCESS").write_text("")
    for i, part in enumerate(np.array_split(ids, 3)):
        x = pa.FixedSizeListArray.from_arrays(pa.array(np.repeat(part, 3).astype("float32")), 3)
        pq.write_table(pa.table({"id": part, "x": x}), str(root / "parquet" / f"part-{i}.parquet"), row_group_size=90)
    features = {"id": tf.io.FixedLenFeature([], tf.int64), "x": tf.io.FixedLenFeature([3], tf.float32)}
    return {"tfrecord": raytf.data.tfrecord_files(str(root / "tfrecord"), features, chunk_rows=50, shuffle_rows=200),
            "parquet": raytf.data.parquet_files(str(root / "parquet"))}


def pass_of(plan, start, rank, size, shuffle, batch=16):
    from raytf._internal.data import cursor as cursors, read_files
    from raytf._internal.data.request import ShardRequest

    cursor = cursors.FileCursor(plan, "train", plan.rows, start, 5, shuffle, rank, size, batch, False)
    dataset = read_files.file_dataset(plan, cursor, ShardRequest("train", batch, "x", "id", shuffle, None, False))
    batches = [(x.numpy(), y.numpy()) for x, y in dataset]
    return cursor, batches


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("kind", ["tfrecord", "parquet"])
def test_a_worker_reads_its_files_and_a_resume_on_another_group_size_reads_the_rest_once(sources, kind, shuffle):
    """3 ranks train 10 steps of an epoch; the position the checkpoint records is resumed by 2
    ranks: every row of the epoch is read once, in batches of 16 but the last, equal in number
    on every rank."""
    plan = plan_files(sources[kind])
    assert plan.rows == ROWS and len(plan.files) == (4 if kind == "tfrecord" else 3)
    fresh = P.Position.fresh(0, ROWS, 3)
    trained, cursor = [], None
    for rank in range(3):
        cursor, batches = pass_of(plan, fresh, rank, 3, shuffle)
        assert len(batches) == cursor.full_steps() == -(-(ROWS // 3) // 16)
        assert all((x[:, 0] == y).all() and x.shape == (len(y), 3) for x, y in batches)
        assert {len(y) for _, y in batches[:-1]} == {16}
        trained.append(np.concatenate([y for _, y in batches[:10]]))
    assert sorted(np.concatenate([np.concatenate([y for _, y in pass_of(plan, fresh, r, 3, shuffle)[1]])
                                  for r in range(3)])) == list(range(ROWS))
    record = cursor.record(cursor.position_after(0, 10))
    from raytf._internal.data import cursor as cursors

    start, _ = cursors.resume_point("train", record, ROWS, 0, 5, shuffle, 2)
    rest = [np.concatenate([y for _, y in pass_of(plan, start, r, 2, shuffle)[1]]) for r in range(2)]
    assert sorted(np.concatenate(trained + rest)) == list(range(ROWS))
    steps = {len(pass_of(plan, start, r, 2, shuffle)[1]) for r in range(2)}
    assert len(steps) == 1


def test_batches_a_custom_loop_takes_from_the_strategys_iterator_are_its_position(sources):
    """What a loop takes from a distributed iterator outside tf.function (next, a for loop,
    get_next_as_optional) is counted, over passes; what a tf.function takes is not; the
    checkpoint's record follows the count, not the report's epoch metric."""
    import tensorflow as tf

    from raytf._internal.data import cursor as cursors, read_files
    from raytf._internal.data.request import ShardRequest
    from raytf._internal.hooks import tensorflow as tf_hooks

    plan = plan_files(sources["tfrecord"])
    cursor = cursors.FileCursor(plan, "train", plan.rows, P.Position.fresh(0, ROWS, 3), 5, True, 1, 3, 16, False)
    dataset = read_files.file_dataset(plan, cursor, ShardRequest("train", 16, "x", "id", True, None, False))
    strategy = tf.distribute.MirroredStrategy(["/cpu:0"])
    distributed = tf_hooks.count_batches_taken(strategy.distribute_datasets_from_function(lambda _: dataset),
                                               cursor.took, cursor.iterated)
    steps = cursor.full_steps()
    validation = cursors.FileCursor(plan, "val", plan.rows, P.Position.fresh(0, ROWS, 3), 5, True, 1, 3, 16, False)
    assert cursors.last_iterated({"train": cursor, "val": validation}) is None
    iterator = iter(distributed)
    assert cursors.last_iterated({"train": cursor, "val": validation}) == "train"  # the loop's iterator
    validation.iterated()  # a fit loop's validation at the epoch's end (after its training iterator)
    assert cursors.last_iterated({"train": cursor, "val": validation}) == "val"
    cursor.iterated()
    assert cursors.last_iterated({"train": cursor, "val": validation}) == "train"  # the next epoch's training
    repeated = tf_hooks.count_batches_taken(
        strategy.distribute_datasets_from_function(lambda _: dataset.repeat()), cursor.took,
        lambda: cursor.iterated(by_pass=False))
    iter(repeated)  # the shard repeated, cut into epochs by steps_per_epoch: no exact resume by pass
    from raytf._internal.worker.strategy import _endless

    assert _endless(dataset.repeat()) and not _endless(dataset) and not _endless(dataset.take(3))
    assert cursors.last_iterated({"train": cursor, "val": validation}) is None
    next(iterator)
    assert iterator.get_next_as_optional().has_value()
    for i, _ in enumerate(iterator):
        if i == 2:
            break
    assert cursor.taken_position() == cursor.position_after(0, 5)
    tf.function(lambda it: next(it))(iterator)  # inside a function: not counted
    assert cursor.taken_position() == cursor.position_after(0, 5)
    for _ in iterator:
        pass
    assert cursor.taken_position() == cursor.position_after(0, steps - 1)  # the pass, less the one not counted
    next(iter(distributed))  # a loop that counts every batch it takes: passes follow each other
    assert cursor.taken_position() == P.Position.fresh(1, ROWS, 3)
    second = iter(distributed)
    next(second)
    position = cursor.taken_position()
    assert position == cursor.position_after(1, 1) and position.rows_left == ROWS - 3 * 16
    record = cursors.positions_at({"train": cursor}, 0, 1, 0, exact=set())
    assert record["train"]["remaining"] == [list(r) for r in position.remaining]
    plain = cursors.FileCursor(plan, "train", plan.rows, P.Position.fresh(0, ROWS, 3), 5, True, 1, 3, 16, False)
    assert plain.taken_position() is None  # nothing counted: the report's epoch and step decide
    assert cursors.positions_at({"train": plain}, 0, 1, 0, exact=set())["train"]["remaining"] == [[0, ROWS]]


@pytest.mark.parametrize("kind", ["tfrecord", "parquet"])
def test_a_file_rewritten_between_epochs_with_as_many_rows_is_named_not_read(sources, kind, tmp_path):
    """The plan counted names and rows; a file replaced by one of the same rows (other values)
    would train other rows silently. Each pass checks the files it reads against their size and
    modification time as counted, and names the one that changed."""
    import shutil

    given = sources[kind].paths[0]
    copy = tmp_path / kind
    shutil.copytree(given, copy)
    source = __import__("dataclasses").replace(sources[kind], paths=(str(copy),))
    plan = plan_files(source)
    fresh = P.Position.fresh(0, ROWS, 1)
    pass_of(plan, fresh, 0, 1, False)  # epoch 0 reads every file as counted
    victim = sorted(p for p in copy.iterdir() if not p.name.startswith("_"))[1]
    data = victim.read_bytes()
    victim.write_bytes(data[:-1] + bytes([data[-1] ^ 0]))  # as many rows, written again: a new mtime
    os.utime(victim, ns=(os.stat(victim).st_atime_ns, os.stat(victim).st_mtime_ns + 10**9))
    with pytest.raises(Exception, match=f"changed since the run counted them: {victim}"):
        pass_of(plan, fresh, 0, 1, False)


def test_a_corrupted_or_unparsable_record_is_named_by_file_and_index(sources, tmp_path):
    """TensorFlow's errors name neither the file nor the record; raytf finds them after a failed
    read, in the files the pass was reading (data/diagnose.py)."""
    import dataclasses
    import shutil

    import tensorflow as tf

    from raytf._internal.data import diagnose

    copy = tmp_path / "tfrecord"
    shutil.copytree(sources["tfrecord"].paths[0], copy)
    source = dataclasses.replace(sources["tfrecord"], paths=(str(copy),))
    plan = plan_files(source)
    victim = sorted(p for p in copy.iterdir() if not p.name.startswith("_"))[2]
    data = bytearray(victim.read_bytes())
    data[len(data) // 2] ^= 0xFF  # a flipped byte in a record's payload: its CRC fails
    victim.write_bytes(bytes(data))
    plan = dataclasses.replace(plan, file_stats=())  # read it as counted (the check of a pass is tested above)
    with pytest.raises(tf.errors.DataLossError) as raised:
        pass_of(plan, P.Position.fresh(0, ROWS, 1), 0, 1, False)
    cursor = type("Cursor", (), {"plan": plan, "files_read": list(range(len(plan.files)))})()
    where = diagnose.explain(raised.value, {"train": cursor})
    assert where.startswith(f"dataset 'train': {victim}, record ") and "corrupted record" in where, where

    wrong = tmp_path / "wrong.tfrecord"  # a record without the feature the spec requires
    with tf.io.TFRecordWriter(str(wrong)) as writer:
        for v in range(5):
            feature = {"id": tf.train.Feature(int64_list=tf.train.Int64List(value=[v]))}
            if v != 3:
                feature["x"] = tf.train.Feature(float_list=tf.train.FloatList(value=[v] * 3))
            writer.write(tf.train.Example(features=tf.train.Features(feature=feature)).SerializeToString())
    found = format_of(plan.source).bad_record(plan, str(wrong))
    assert found.startswith(f"{wrong}, record 3: ") and "x" in found, found


def test_a_tensorflow_without_offset_reads_warns_once_and_reads_the_same_rows(sources, monkeypatch, caplog):
    """The optional hook tensorflow.records_at gone: each chunk is read from its file's start and
    skipped to, the same batches as with it, and the run is told once what it goes without."""
    import logging

    from raytf._internal.hooks import _hook
    from raytf._internal.hooks import tensorflow as tf_hooks

    plan = plan_files(sources["tfrecord"])
    fresh = P.Position.fresh(0, ROWS, 2)
    with_offsets = pass_of(plan, fresh, 1, 2, True)[1]

    def gone():
        raise AttributeError("module 'gen_dataset_ops' has no attribute 'tf_record_dataset_v2'")

    monkeypatch.setattr(tf_hooks, "records_at_class", gone)
    monkeypatch.setattr(_hook, "_warned", set())
    with caplog.at_level(logging.WARNING):
        without = pass_of(plan, fresh, 1, 2, True)[1]
        pass_of(plan, fresh, 0, 2, True)
    assert [y.tolist() for _, y in without] == [y.tolist() for _, y in with_offsets]
    told = [r.getMessage() for r in caplog.records if "tensorflow.records_at" in r.getMessage()]
    assert len(told) == 1 and "read from its file's start" in told[0] and "goes on without it" in told[0], told

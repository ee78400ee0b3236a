"""A parameter-server worker's stream of batches starts where the steps that trained from it
stopped (data/ps_positions.py): the pipeline, built at any position, is the uninterrupted
stream from there on, every pass a permutation of the worker's piece. In-process TensorFlow,
no Ray, no cluster (the counting steps run in tests/integration/test_parameter_server.py)."""

import numpy as np
import pytest

from raytf._internal.data.request import ShardRequest

pytestmark = pytest.mark.unit

PIECES = {0: np.arange(0, 50), 1: np.arange(100, 140)}  # worker -> the ids of its piece (50 and 40 rows)


class Piece:
    """A worker's piece as Ray Data hands it to ShardFileWriter (blocks of numpy columns)."""

    def __init__(self, ids):
        self.ids = ids

    def iter_batches(self, **_):
        for part in np.array_split(self.ids, 3):
            yield {"id": part.astype("int64"), "x": part.astype("float32")[:, None] * np.ones((1, 2), "float32")}


class LocalPositions:
    """StreamPositions' reading side, on this process's CPU instead of a parameter server."""

    def __init__(self, starts):
        import tensorflow as tf

        self.committed = tf.Variable(starts, dtype=tf.int64)

    def start(self, worker):
        import tensorflow as tf

        return tf.gather(self.committed, tf.cast(worker, tf.int64))

    def values(self):
        return [int(v) for v in self.committed.numpy()]


@pytest.fixture(scope="module")
def manifests(tmp_path_factory):
    from raytf._internal.data.worker_files import ShardFileWriter

    root = tmp_path_factory.mktemp("pieces")
    return [ShardFileWriter(str(root / f"worker-{w}")).write({"train": Piece(ids)})["train"]
            for w, ids in PIECES.items()]


def stream(manifests, worker, start, batches, drop=False, first_epoch=0):
    import tensorflow as tf

    from raytf._internal.data.tfdata_ps import make_shard

    request = ShardRequest("train", 8, ["id"], "x", True, 3, drop)
    shard = make_shard(request, manifests, 3, first_epoch, LocalPositions([start, start]))
    dataset = shard.build(tf.constant(worker, tf.int64))
    return shard, [x["id"].numpy() for x, _ in dataset.take(batches)]


@pytest.mark.parametrize("drop", [False, True])
def test_a_stream_built_at_any_position_goes_on_as_the_uninterrupted_one(manifests, drop):
    for worker, ids in PIECES.items():
        shard, whole = stream(manifests, worker, 0, 40, drop)
        per_pass = shard.batches_per_pass()[worker]
        assert per_pass == (len(ids) // 8 if drop else -(-len(ids) // 8))
        for p in range(40 // per_pass):  # each pass: every row of the piece once (but the dropped remainder)
            rows = np.concatenate(whole[p * per_pass:(p + 1) * per_pass])
            assert len(set(rows)) == len(rows) == (per_pass * 8 if drop else len(ids)) and set(rows) <= set(ids)
        assert not np.array_equal(whole[0], whole[per_pass])  # passes are shuffled apart
        for start in (1, per_pass - 1, per_pass, per_pass + 3, 3 * per_pass + 2):
            _, resumed = stream(manifests, worker, start, 12, drop)
            assert all(np.array_equal(a, b) for a, b in zip(resumed, whole[start:start + 12], strict=True)), start


def test_a_checkpoints_record_is_used_only_for_the_same_pieces_and_batching(manifests):
    from raytf._internal.data.tfdata_ps import make_shard

    shard, _ = stream(manifests, 0, 0, 1)
    shard.positions.committed.assign([9, 4])
    record = shard.record()
    assert record == {"ps_positions": [9, 4], "rows": [50, 40], "batch_size": 8, "drop_remainder": False,
                      "shuffle": True}
    assert shard.initial_positions(record) == ([9, 4], None)
    fresh = make_shard(ShardRequest("train", 8, ["id"], "x", True, 3, False), manifests, 3, 2, LocalPositions([0, 0]))
    assert fresh.initial_positions(None) == ([2 * 7, 2 * 5], None)  # the start of pass 2 (first_epoch)
    other = make_shard(ShardRequest("train", 16, ["id"], "x", True, 3, False), manifests, 3, 2, LocalPositions([0, 0]))
    start, why = other.initial_positions(record)
    assert start == [2 * 4, 2 * 3] and "batch_size was 8, now 16" in why
    start, why = fresh.initial_positions(record | {"rows": [50, 41]})
    assert start == [14, 10] and "rows was [50, 41]" in why


def test_a_steps_updates_wait_for_all_of_their_inputs_and_none_for_what_an_update_made(monkeypatch):
    """The hold (``hold_until_arrived``): every update of a step waits, through one op, for the inputs
    of all of them (the late-computed one included); an input made from a variable the step already
    wrote is not waited for (it comes after that update: waiting would deadlock), but what it is made
    from on the worker is, and it is made beside the update it feeds (not on the worker, which a
    killed worker would leave the update and the step's commit waiting for); and the step runs to
    the same values as without the hold."""
    import tensorflow as tf

    from raytf._internal.data import ps_hold, ps_positions

    monkeypatch.setattr(ps_positions, "POSITIONS_DEVICE", "/device:CPU:0")  # this process, not a ps
    monkeypatch.setattr(ps_hold, "POSITIONS_DEVICE", "/device:CPU:0")
    early, late, after = (tf.Variable(0.0) for _ in range(3))
    seen = {}

    @tf.function
    def step(x):
        graph = tf.compat.v1.get_default_graph()
        first = len(graph.get_operations())
        early.assign_add(1.0)
        computed = tf.reduce_sum(tf.tanh(tf.matmul(x, x)))  # the "gradient" the worker sends late
        late.assign_add(computed)
        offset = tf.reduce_sum(x)  # on the worker, before any update
        after.assign_add(late.read_value() * 2.0 + offset)  # made from `late`'s new value
        made = graph.get_operations()[first:]
        updates = [op for op in made if ps_hold.writes(op)]
        ps_hold.hold_until_arrived(made, updates)
        seen["updates"] = [op.type for op in updates]
        seen["held"] = [any(c.name.startswith("raytf_all_arrived") for c in op.control_inputs) for op in updates]
        hold = next(c for c in updates[0].control_inputs if c.name.startswith("raytf_all_arrived"))
        seen["waits_for"] = {t.op.name for c in hold.control_inputs for t in c.inputs}
        seen["computed"], seen["read"] = computed.op.name, updates[2].inputs[1].op.name
        seen["offset"] = offset.op.name
        seen["moved"] = [op.colocation_groups() for op in made if op.type in ("Mul", "AddV2")]
        seen["update"] = updates[2].colocation_groups()
        return after.read_value()

    x = tf.eye(3) * 0.5
    step.get_concrete_function(x)  # traced: the graph is checked before it runs (a wrong hold deadlocks)
    assert seen["updates"] == ["AssignAddVariableOp"] * 3 and all(seen["held"])
    assert seen["computed"] in seen["waits_for"]  # the late input holds every update
    assert seen["read"] not in seen["waits_for"]  # made after `late`'s update: not waited for
    assert seen["offset"] in seen["waits_for"]  # what the late-made input takes from the worker is
    assert seen["moved"] == [seen["update"]] * 2  # `* 2.0 + offset`: made where `after` is updated
    result = float(step(x))
    expected_late = float(tf.reduce_sum(tf.tanh(x @ x)))
    assert float(early.numpy()) == 1.0 and abs(float(late.numpy()) - expected_late) < 1e-6
    assert abs(result - (2 * expected_late + 1.5)) < 1e-5


class Counts:
    """StreamPositions' counting side, on this process."""

    def __init__(self):
        import tensorflow as tf

        self.taken = tf.Variable(0, dtype=tf.int64)

    def count(self, worker, taken=1):
        import tensorflow as tf

        return self.taken.assign_add(tf.cast(taken, tf.int64))


@pytest.mark.parametrize("takes, warned", [("one", False), ("two", True), ("loop", True)])
def test_a_step_that_takes_several_batches_is_named_once(monkeypatch, caplog, takes, warned):
    """raytf commits a step's batches when the step's updates are made: a step taking several (or
    taking them in a loop of its own) would train its finished ones again after a lost worker, and
    is named in a warning."""
    import tensorflow as tf

    from raytf._internal.data import ps_hold, ps_positions

    monkeypatch.setattr(ps_positions, "POSITIONS_DEVICE", "/device:CPU:0")
    monkeypatch.setattr(ps_hold, "POSITIONS_DEVICE", "/device:CPU:0")
    monkeypatch.setattr(ps_positions, "_warned", set())
    counts = Counts()
    batches = iter(tf.data.Dataset.range(10))

    @tf.function
    def step():
        iterator = ps_positions.CountingIterator(batches, counts, tf.constant(0, tf.int64))

        def body():
            if takes == "loop":
                total = tf.constant(0, tf.int64)
                for _ in tf.range(3):
                    total += next(iterator)
                return total
            return next(iterator) + (next(iterator) if takes == "two" else 0)

        return ps_positions._held(body, [], tf.constant(0, tf.int64), [iterator], f"step_{takes}")

    with caplog.at_level("WARNING", logger="raytf._internal.data.ps_positions"):
        step()
    assert any(f"step_{takes}" in r.getMessage() and "several batches" in r.getMessage()
               for r in caplog.records) is warned


@pytest.mark.parametrize("work, moved", [("ema", True), ("forward", False)])
def test_work_after_an_update_runs_beside_the_update_it_feeds_unless_it_is_a_models(monkeypatch, caplog, work, moved):
    """An EMA made from a weight the step just updated runs where its update runs (the parameter
    server: a killed worker cannot leave it half done); a forward pass after an update stays on the
    worker's device, and the step is named in a warning (its batch is trained again if the worker is
    lost meanwhile)."""
    import tensorflow as tf

    from raytf._internal.data import ps_hold, ps_positions

    monkeypatch.setattr(ps_positions, "POSITIONS_DEVICE", "/device:CPU:0")
    monkeypatch.setattr(ps_hold, "POSITIONS_DEVICE", "/device:CPU:0")
    monkeypatch.setattr(ps_positions, "_warned", set())
    counts, weight, tracked = Counts(), tf.Variable(tf.eye(4)), tf.Variable(tf.zeros([4, 4]))
    batches = iter(tf.data.Dataset.range(10))
    seen = {}

    @tf.function
    def step():
        iterator = ps_positions.CountingIterator(batches, counts, tf.constant(0, tf.int64))

        def body():
            x = tf.cast(next(iterator) + 1, tf.float32) * tf.ones([4, 4])
            with tf.device("/device:CPU:0"):  # the strategy's scope for a worker's ops: a device, no task
                weight.assign_sub(0.1 * x)
                new = weight.read_value()
                made = new @ x if work == "forward" else 0.9 * tracked.read_value() + 0.1 * new
                tracked.assign(made)
            seen["op"] = made.op
            return made

        result = ps_positions._held(body, [], tf.constant(0, tf.int64), [iterator], f"step_{work}")
        seen["update"] = next(op for op in tf.compat.v1.get_default_graph().get_operations()
                              if op.type == "AssignVariableOp")
        return result

    with caplog.at_level("WARNING", logger="raytf._internal.data.ps_positions"):
        step()
    on_update = seen["op"].colocation_groups() == seen["update"].colocation_groups()
    assert on_update is moved and (seen["op"].device == "") is moved
    assert any(f"step_{work}" in r.getMessage() and "computes on the worker" in r.getMessage()
               for r in caplog.records) is not moved
    # Moved work is never silent: the warning names each op moved, and how to keep it on the worker.
    told = [r.getMessage() for r in caplog.records if "beside the update it feeds" in r.getMessage()]
    assert bool(told) is moved
    assert not moved or (seen["op"].name in told[0] and "hold_updates=False" in told[0] and f"step_{work}" in told[0])
    assert float(tracked.numpy()[0, 0]) != 0.0  # the step ran, held and moved alike


def test_with_the_hold_turned_off_nothing_waits_or_moves_and_the_commit_still_follows_every_update(monkeypatch,
                                                                                                   caplog):
    """ParameterServerTrainer(hold_updates=False): TensorFlow's own order (no hold op, the EMA left
    where the step put it, nothing warned of moving), and the batch still committed only once every
    update of the step is made."""
    import tensorflow as tf

    from raytf._internal.data import ps_hold, ps_positions

    monkeypatch.setattr(ps_positions, "POSITIONS_DEVICE", "/device:CPU:0")
    monkeypatch.setattr(ps_hold, "POSITIONS_DEVICE", "/device:CPU:0")
    monkeypatch.setattr(ps_positions, "_warned", set())
    monkeypatch.setattr(ps_positions, "hold_updates", False)
    positions = ps_positions.StreamPositions("train", 1)
    weight, tracked = tf.Variable(tf.eye(2)), tf.Variable(tf.zeros([2, 2]))
    batches = iter(tf.data.Dataset.range(10))
    seen = {}

    @tf.function
    def step():
        iterator = ps_positions.CountingIterator(batches, positions, tf.constant(0, tf.int64))

        def body():
            x = tf.cast(next(iterator) + 1, tf.float32) * tf.ones([2, 2])
            with tf.device("/device:CPU:0"):
                weight.assign_sub(0.1 * x)
                made = 0.9 * tracked.read_value() + 0.1 * weight.read_value()
                tracked.assign(made)
            seen["op"] = made.op
            return made

        result = ps_positions._held(body, [positions], tf.constant(0, tf.int64), [iterator], "step_unheld")
        ops = tf.compat.v1.get_default_graph().get_operations()
        seen["holds"] = [op.name for op in ops if op.name.startswith("raytf_all_arrived")]
        seen["updates"] = [op for op in ops if op.type in ("AssignVariableOp", "AssignSubVariableOp")]
        updates = {op.name for op in seen["updates"]}
        seen["commit_waits"] = any(updates <= {c.name for c in op.control_inputs} for op in ops)
        return result

    with caplog.at_level("WARNING", logger="raytf._internal.data.ps_positions"):
        step()
    assert seen["holds"] == [] and seen["op"].device.endswith("CPU:0")  # nothing held, nothing moved
    assert len(seen["updates"]) == 2 and seen["commit_waits"]  # the commit is ordered after both updates
    assert not [r for r in caplog.records if "beside the update it feeds" in r.getMessage()]
    assert positions.values() == [1]  # the batch committed once the step's updates were made

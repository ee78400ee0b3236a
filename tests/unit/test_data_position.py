"""Data positions (raytf/_internal/data/position.py): an epoch interrupted and resumed by groups
of any size trains every row exactly once."""

import numpy as np
import pytest

from raytf._internal.data import position as P

pytestmark = pytest.mark.unit


def _train(start, rows, world, batch, drop, done, shuffle=True, seed=7):
    """The rows each rank trains in ``done`` steps from ``start`` (all of the pass if None)."""
    passes = [P.plan_pass(start, rows, shuffle, seed, r, world, batch, drop) for r in range(world)]
    counts = {p.steps for p in passes}
    assert len(counts) == 1, f"ranks would take different numbers of steps: {counts}"
    steps = counts.pop() if done is None else done
    used = []
    for p in passes:
        for i in range(steps):
            batch_rows = p.rows[p.bounds[i]:p.bounds[i + 1]]
            assert len(batch_rows) <= batch + (0 if drop else 1)
            used.extend(batch_rows.tolist())
    return used, steps


@pytest.mark.parametrize("rows,batch", [(1000, 16), (997, 10), (64, 8), (7, 4), (5, 1)])
@pytest.mark.parametrize("shuffle", [False, True])
def test_an_epoch_interrupted_by_resizes_trains_every_row_once(rows, batch, shuffle):
    rng = np.random.default_rng(rows * batch)
    for trial in range(20):
        position = P.Position.fresh(3, rows, 2)
        seen = []
        while position.epoch == 3:
            world = int(rng.integers(1, 6))
            _, whole = _train(position, rows, world, batch, False, None, shuffle, 11)
            # Train part of the rest with this group (a kill, a preemption, a resize), or all of it.
            done = int(rng.integers(0, whole + 1)) if trial % 3 else whole
            used, _ = _train(position, rows, world, batch, False, done, shuffle, 11)
            seen.extend(used)
            after = P.advance(position, rows, world, batch, False, done)
            assert after.rows_left == (rows if after.epoch == 4 else position.rows_left - len(used))
            position, last = after, world
        assert sorted(seen) == list(range(rows))
        assert position == P.Position.fresh(4, rows, last)  # the next epoch is cut for the last group


def test_drop_remainder_trains_full_batches_and_drops_fewer_than_one_global_batch():
    used, steps = _train(P.Position.fresh(0, 103, 3), 103, 3, 8, True, None)
    assert steps == 4 and len(used) == 96 and len(set(used)) == 96
    assert P.advance(P.Position.fresh(0, 103, 3), 103, 3, 8, True, steps) == P.Position.fresh(1, 103, 3)


def test_a_seeded_epoch_order_is_the_same_in_every_attempt_and_differs_by_epoch():
    a = P.order(100, True, P.dataset_seed(5, "train"), 2, 1)
    assert np.array_equal(a, P.order(100, True, P.dataset_seed(5, "train"), 2, 1))
    assert not np.array_equal(a, P.order(100, True, P.dataset_seed(5, "train"), 3, 1))
    assert not np.array_equal(a, P.order(100, True, P.dataset_seed(5, "eval"), 2, 1))
    assert np.array_equal(P.order(5, False, 0, 9, 2), np.arange(5))


def test_a_group_that_keeps_its_size_trains_the_same_rows_on_each_rank_every_epoch_in_a_new_order():
    passes = {e: [P.plan_pass(P.Position.fresh(e, 101, 3), 101, True, 9, r, 3, 8, False) for r in range(3)]
              for e in (0, 1)}
    for rank, (start, end) in enumerate([(0, 34), (34, 68), (68, 101)]):
        first, second = passes[0][rank], passes[1][rank]
        assert first.local == second.local == (start, end)
        assert sorted(first.rows) == sorted(second.rows) == list(range(start, end))
        assert list(first.rows) != list(second.rows)
    # The rest of an interrupted epoch is not one rank's run: no local run to hold.
    rest = P.advance(P.Position.fresh(0, 101, 3), 101, 3, 8, False, 2)
    assert P.plan_pass(rest, 101, True, 9, 0, 2, 8, False).local is None


def test_fewer_rows_left_than_ranks_gives_some_ranks_an_empty_last_batch():
    start = P.Position(0, ((10, 12),), 4)
    passes = [P.plan_pass(start, 12, False, 0, r, 4, 8, False) for r in range(4)]
    assert [p.steps for p in passes] == [1, 1, 1, 1]
    assert [len(p.rows) for p in passes] == [1, 1, 0, 0]


def test_positions_round_trip_and_refuse_what_does_not_fit():
    position = P.Position(2, ((0, 5), (9, 20)), 3)
    assert P.Position.from_json(position.to_json(), 20) == position
    with pytest.raises(ValueError, match="does not fit"):
        P.Position.from_json(position.to_json(), 15)
    with pytest.raises(ValueError, match="not a data position"):
        P.Position.from_json({"remaining": [], "epoch": 1}, 15)


def test_a_report_records_the_rest_of_the_epoch_only_for_the_data_the_loop_resumes_exactly():
    from raytf._internal.data.cursor import Cursor, completed_epoch, positions_at

    def cursor(name):
        return Cursor(name, 100, P.Position.fresh(0, 100, 2), 3, True, 0, 2, 10, False)

    cursors = {"train": cursor("train"), "val": cursor("val")}
    # A preemption in epoch 1 after 2 steps (ReportCallback reports the last epoch completed, 0).
    mid = positions_at(cursors, 0, 1, 2, exact={"train"})
    assert P.Position.from_json(mid["train"], 100) == P.Position(1, ((20, 50), (70, 100)), 2)
    assert P.Position.from_json(mid["val"], 100) == P.Position.fresh(1, 100, 2)  # validation starts its pass over
    assert mid["train"]["seed"] == 3 and mid["train"]["shuffle"] is True and mid["train"]["rows"] == 100
    # Another loop resumes from the epoch's start; an epoch's end records the next epoch whole.
    assert P.Position.from_json(positions_at(cursors, 0, 1, 2, exact=())["train"], 100) == P.Position.fresh(1, 100, 2)
    assert P.Position.from_json(positions_at(cursors, 1, 1, 5, exact={"train"})["train"], 100) == P.Position.fresh(2, 100, 2)
    assert positions_at({}, 1, 1, 5, exact=()) is None
    # A preemption at epoch 1's last step (5 of 5): its checkpoint completed epoch 1, whatever the report's
    # epoch said (a resume at 0 + 1 ran epoch 1 again with epoch 2's rows: every row of it twice, seen once).
    last = positions_at(cursors, 0, 1, 5, exact={"train"})
    assert P.Position.from_json(last["train"], 100) == P.Position.fresh(2, 100, 2)
    assert completed_epoch(0, last) == {"epoch": 1}
    assert completed_epoch(0, mid) == {} and completed_epoch(1, positions_at(cursors, 1, 1, 5, exact={"train"})) == {}
    assert completed_epoch(None, last) == {} and completed_epoch(0, None) == {}

"""The elastic policy and what a round of polls amounts to: pure, no Ray."""

import queue
import threading
import types

import pytest

from raytf._internal.driver.failure import root_cause
from raytf._internal.driver.scaling import ElasticPolicy
from raytf._internal.driver.watch import GroupWatch
from raytf._internal.protocol import Activity, CoordinatorHeld, Phase, Progress, Report, WorkerStatus
from raytf.errors import FailureKind, WorkerFailure


PLACEMENT, RESIZE = "ScalingConfig.placement_timeout_s", "ScalingConfig.resize_timeout_s"
BETWEEN = "DefaultScalingPolicy.shrink_try_s"


def test_a_fixed_group_asks_for_its_size_for_the_placement_timeout():
    assert ElasticPolicy(3, 3, 120.0, 60.0).tries() == [(3, 120.0, PLACEMENT)]
    assert ElasticPolicy(3, 3, None, 60.0).tries() == [(3, None, PLACEMENT)]
    assert ElasticPolicy(3, 3, 9.0, 0.0, config="ParameterServerScaling").tries() == [
        (3, 9.0, "ParameterServerScaling.placement_timeout_s")]


def test_an_elastic_group_waits_for_max_then_tries_each_smaller_size_down_to_min():
    """Each wait names the setting that set it: the messages said placement_timeout_s of every one."""
    from raytf import DefaultScalingPolicy

    policy = ElasticPolicy(2, 5, 120.0, 60.0, policy=DefaultScalingPolicy(shrink_try_s=5.0))
    tries = policy.tries()
    assert tries == [(5, 60.0, RESIZE), (4, 5.0, BETWEEN), (3, 5.0, BETWEEN), (2, 120.0, PLACEMENT)]
    assert ElasticPolicy(2, 3, None, 10.0).tries() == [(3, 10.0, RESIZE), (2, None, PLACEMENT)]
    assert ElasticPolicy(2, 4, 120.0, 60.0, policy=DefaultScalingPolicy(shrink_try_s=1.5)).tries()[1] == (3, 1.5, BETWEEN)
    assert policy.shrunk(5, tries[0]) is None
    assert policy.shrunk(3, tries[0]) == "5 workers could not be placed within 60 s (ScalingConfig.resize_timeout_s); training with 3"


def test_what_a_scaling_policy_returns_is_checked():
    """A policy's tries and holds are checked, each error naming its method (the guide's policy
    runs in test_policies.py)."""
    from raytf import ConfigError, PlacementTry, ScalingPolicy
    from raytf._internal.driver.growth import growth_hold_s

    class Wrong(ScalingPolicy):
        def __init__(self, tries, hold=0.0):
            self.tries, self.hold = tries, hold

        def placement_tries(self, scaling):
            return self.tries

        def growth_hold_s(self, grown_at, now):
            return self.hold

    for tries, says in (([], "returned no size"), ([PlacementTry(5, 1.0)], "from ScalingConfig.num_workers' min to its max"),
                        ([PlacementTry(3, 0.0)], "seconds > 0, or None"), ([7], "each try is a raytf.PlacementTry")):
        with pytest.raises(ConfigError, match=says):
            ElasticPolicy(2, 4, 120.0, 60.0, policy=Wrong(tries)).tries()
    with pytest.raises(ConfigError, match=r"Wrong.growth_hold_s returned -1"):
        growth_hold_s(Wrong([], hold=-1), [], 0.0)
    with pytest.raises(ConfigError, match="ScalingConfig.policy must be a raytf.ScalingPolicy"):
        __import__("raytf").ScalingConfig(policy="elastic")


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def watch(clock, workers=2, **kw):
    kw = {"start_timeout_s": 100.0, "worker_timeout_s": 30.0, "hang_timeout_s": 300.0, **kw}
    return GroupWatch({r: f"10.0.0.{r}" for r in range(workers)}, clock=clock, **kw)


def status(rank, phase, **kw):
    return WorkerStatus(rank=rank, phase=phase, **kw)


def test_the_start_barrier_is_ready_once_every_worker_is_past_starting_and_only_once():
    clock = Clock()
    w = watch(clock)
    w.heard(0, status(0, Phase.READY))
    assert not w.round(None).ready  # rank 1 not heard yet
    w.heard(1, status(1, Phase.STARTING))
    assert not w.round(None).ready
    w.heard(1, status(1, Phase.READY))
    assert w.round(None).ready
    w.released = True
    assert not w.round(None).ready


def test_reports_come_in_time_order_and_rank_zeros_progress_is_kept():
    clock = Clock()
    w = watch(clock)
    late = Report(rank=0, seq=1, metrics={}, time=5.0)
    early = Report(rank=1, seq=0, metrics={}, time=1.0)
    w.heard(0, status(0, Phase.TRAINING, reports=(late,), progress=Progress(epoch=2)))
    w.heard(1, status(1, Phase.TRAINING, reports=(early,), progress=Progress(epoch=9)))
    round_ = w.round(None)
    assert round_.reports == (early, late) and round_.progress == Progress(epoch=2)
    assert w.round(None).reports == ()  # each report once


def test_finished_stopped_lost_and_not_joined():
    clock = Clock()
    w = watch(clock)
    w.heard(0, status(0, Phase.FINISHED))
    w.heard(1, status(1, Phase.PREEMPTED))
    assert w.round(None).stopped and not w.round(None).finished
    w.died(1, "RayActorError", "the actor died")
    [lost] = w.round(None).failures
    assert (lost.rank, lost.kind, lost.node_ip) == (1, FailureKind.DIED, "10.0.0.1")
    clock.now = 31.0
    w.silent(0, since=0.0)
    assert w.round(None).failures[0].kind == FailureKind.UNRESPONSIVE
    # The silent rank is kept past the round (the group ends its process at shutdown), the dead one
    # is not silent, and a replacement clears it.
    assert w.silent_ranks == {0}
    w.replaced(0, "10.0.0.2")
    assert w.silent_ranks == set()
    # Two members silent in one round: the root cause is the one that went silent first, whatever
    # the order the relay lists them in (rank 0 first, here the later one).
    both = watch(clock)
    both.heard(0, status(0, Phase.TRAINING))
    both.heard(1, status(1, Phase.TRAINING))
    clock.now = 60.0
    both.silent(0, since=25.0)
    both.silent(1, since=20.0)
    failures = both.round(None).failures
    assert {f.rank for f in failures} == {0, 1} and root_cause(failures).rank == 1
    assert min(failures, key=lambda f: f.rank).time - root_cause(failures).time == pytest.approx(5.0, abs=0.5)
    clock.now = 31.0
    late = watch(clock)  # started at 31
    late.heard(0, status(0, Phase.READY))
    clock.now = 132.0
    [behind] = late.round(None).failures  # rank 1 never answered: further behind than rank 0
    assert (behind.rank, behind.kind) == (1, FailureKind.NOT_STARTED) and "its actor was not started" in behind.message


def test_a_rank_silent_while_it_joins_is_judged_by_the_start_timeout_and_one_silent_once_joined_by_the_worker_timeout():
    """Importing TensorFlow holds a starting worker's interpreter in native code for seconds on a
    busy node: its silence then is no loss (a peer's death in that while is the cause, not it)
    until start_timeout_s, which names it not started, and silent; its process is ended like an
    unresponsive one's. Once it joined, worker_timeout_s decides."""
    clock = Clock()
    w = watch(clock)  # start_timeout_s=100, worker_timeout_s=30
    w.heard(0, status(0, Phase.STARTING))
    w.heard(1, status(1, Phase.STARTING))
    clock.now = 40.0
    w.silent(0, since=2.0)  # 38 s silent while importing
    w.died(1, "RayActorError", "the actor died")
    [died] = w.round(None).failures
    assert (died.rank, died.kind) == (1, FailureKind.DIED) and w.phases[0] == Phase.STARTING
    clock.now = 90.0
    w.silent(0, since=2.0)
    assert w.round(None).failures == ()
    clock.now = 101.0
    w.silent(0, since=2.0)
    [late] = w.round(None).failures
    assert (late.rank, late.kind) == (0, FailureKind.NOT_STARTED)
    assert late.message.endswith("still starting (loading train_fn and its modules, importing TensorFlow), "
                                 "and had not answered the driver for 99 s")
    assert w.silent_ranks == {0}
    # Silent for a while, then heard again: nothing is held against it.
    again = watch(clock)  # started at 101
    again.heard(0, status(0, Phase.CONNECTING))
    again.heard(1, status(1, Phase.CONNECTING))
    clock.now = 140.0
    again.silent(1, since=101.0)
    again.heard(1, status(1, Phase.TRAINING))
    again.heard(0, status(0, Phase.TRAINING))
    assert again.round(None).failures == () and again.silent_ranks == set()
    # Joined: 30 s of silence is a loss, dated when it began.
    clock.now = 175.0
    again.silent(1, since=141.0)
    [lost] = again.round(None).failures
    assert (lost.rank, lost.kind) == (1, FailureKind.UNRESPONSIVE) and again.silent_ranks == {1}


def test_a_collective_error_points_at_the_rank_that_stopped_taking_part():
    clock = Clock()
    w = watch(clock)
    w.heard(1, status(1, Phase.FINISHED, activity=Activity("finished", 9.0)))
    timed_out = WorkerFailure(rank=0, kind="collective", error_type="DeadlineExceededError", message="",
                              traceback="", time=1.0)
    w.heard(0, status(0, Phase.FAILED, failure=timed_out))
    kinds = [(f.rank, f.kind) for f in w.round(None).failures]
    assert kinds == [(0, FailureKind.COLLECTIVE), (1, FailureKind.RETURNED_EARLY)]


def test_a_parameter_server_coordinator_held_past_the_timeout_is_stalled_and_a_hold_that_ends_is_not():
    clock = Clock()
    w = watch(clock, workers=1, hang_timeout_s=None, coordinator_timeout_s=60.0)
    w.heard(0, status(0, Phase.TRAINING, coordinator_held=CoordinatorHeld(10.0, "reconnecting to the cluster")))
    clock.now = 40.0  # 10 s when heard, 40 s later: 50 s held
    assert w.round(None).failures == ()
    w.heard(0, status(0, Phase.TRAINING))  # no longer held: the count starts again at the next one
    clock.now = 200.0
    assert w.round(None).failures == ()
    w.heard(0, status(0, Phase.TRAINING, coordinator_held=CoordinatorHeld(1.0, "holding 3 scheduled function(s)")))
    clock.now = 258.5
    assert w.round(None).failures == ()
    clock.now = 261.0  # heard at 200 with 1 s, not heard since (a chief that answers no more is worker_timeout_s's)
    [stalled] = w.round(None).failures
    assert (stalled.rank, stalled.kind, stalled.node_ip) == (0, FailureKind.STALLED, "10.0.0.0")
    assert "has been holding 3 scheduled function(s) for 62 s (FailureConfig.hang_timeout_s=60)" in stalled.message
    w.replaced(0, "10.0.0.2")  # a new actor for the rank: nothing carried over
    assert w.round(None).failures == ()
    # Without a coordinator timeout (a mirrored group, or hang_timeout_s=None) nothing is ever found.
    off = watch(clock, workers=1, coordinator_timeout_s=None)
    off.heard(0, status(0, Phase.TRAINING, coordinator_held=CoordinatorHeld(10_000.0, "reconnecting")))
    assert off.round(None).failures == ()


class _Handler:
    def __init__(self):
        self._should_preemption_thread_run = True
        self._cluster_due_for_update_or_finish = threading.Event()


class _ClosureQueue:
    """TensorFlow's _CoordinatedClosureQueue as far as raytf reads it."""

    def __init__(self):
        self.inflight_closure_count = 0
        self._queue = queue.Queue()

    def mark_finished(self):
        self.inflight_closure_count -= 1

    def mark_failed(self, error):
        self.inflight_closure_count -= 1


def test_a_chief_reports_its_coordinator_held_while_it_reconnects_or_while_scheduled_functions_end_none():
    from raytf._internal.hooks import tensorflow as tf_hooks
    from raytf._internal.worker.ps_payloads import ChiefPayload

    handler, closures = _Handler(), _ClosureQueue()
    coordinator = types.SimpleNamespace(_cluster=types.SimpleNamespace(failure_handler=handler, closure_queue=closures))
    chief = ChiefPayload()
    clock = Clock()
    chief._clock = lambda: clock.now
    tf_hooks.count_closures_ended(coordinator, chief._closure_ended)
    chief._coordinator = coordinator
    reconnecting = "reconnecting to the cluster after a step failed on a lost task"
    assert chief.coordinator_held() is None  # nothing scheduled
    closures.inflight_closure_count = 3
    clock.now = 600.0
    assert chief.coordinator_held() is None  # none has ended yet: the first step may still compile
    closures.mark_finished()
    assert chief.coordinator_held() is None  # one just ended
    clock.now = 630.0
    assert chief.coordinator_held() == CoordinatorHeld(30.0, "holding 2 scheduled function(s) of which none has ended")
    closures.mark_finished()  # one ends: the coordinator moves, and the count starts again
    clock.now = 631.0
    assert chief.coordinator_held() is None
    clock.now = 640.0
    assert chief.coordinator_held().seconds == 9.0
    closures.mark_failed(RuntimeError("lost"))
    closures._queue.put("put back")  # TensorFlow's failure handling puts the step back and reconnects
    handler._cluster_due_for_update_or_finish.set()
    clock.now = 641.0
    assert chief.coordinator_held() == CoordinatorHeld(0.0, reconnecting)
    clock.now = 700.0  # held both ways as long: the reconnect is named
    assert chief.coordinator_held() == CoordinatorHeld(59.0, reconnecting)
    closures._queue.get()
    closures.inflight_closure_count = 0
    clock.now = 730.0
    assert chief.coordinator_held() == CoordinatorHeld(89.0, reconnecting)  # nothing pending, still reconnecting
    handler._cluster_due_for_update_or_finish.clear()
    assert chief.coordinator_held() is None
    handler._should_preemption_thread_run = False  # a stopped handler (a ps lost) reconnects nothing
    handler._cluster_due_for_update_or_finish.set()
    assert chief.coordinator_held() is None


def test_the_start_up_breakdown_times_each_phase_from_the_slowest_worker():
    clock = Clock()
    w = watch(clock)
    began, placed, actors_up = 0.0, 0.5, 2.0
    clock.now = 2.0
    w.heard(0, status(0, Phase.READY))
    w.heard(1, status(1, Phase.STARTING))
    clock.now = 5.0
    w.round(None)
    assert w.startup(began, placed, actors_up) == {"placement": 0.5, "actors": 1.5, "total": 2.0}
    w.heard(1, status(1, Phase.READY))  # the slower worker sets when the group has loaded
    clock.now = 6.0
    w.round(None)
    w.heard(0, status(0, Phase.TRAINING))
    w.heard(1, status(1, Phase.TRAINING))
    clock.now = 7.5
    w.round(None)
    w.heard(0, status(0, Phase.TRAINING, progress=Progress(epoch=0, step=1)))
    clock.now = 8.0
    w.round(None)
    assert w.startup(began, placed, actors_up) == {
        "placement": 0.5, "actors": 1.5, "loading": 4.0, "connect": 1.5, "first_step": 0.5, "total": 8.0,
    }


def test_the_wait_for_room_names_the_setting_that_set_it(monkeypatch):
    """placement.place says how long it has waited of which setting (before, every wait read
    "ScalingConfig.placement_timeout_s", an elastic group's resize_timeout_s among them)."""
    from raytf._internal.driver import placement

    class NeverFits:
        def wait(self, timeout_seconds):
            return False

    removed = []
    monkeypatch.setattr(placement, "placement_group", lambda bundles, strategy: NeverFits())
    monkeypatch.setattr(placement, "remove_placement_group", removed.append)
    monkeypatch.setattr(placement.cluster, "launching", lambda: {})
    said = []
    assert placement.place([{"CPU": 1.0}] * 3, "PACK", 2.0, said.append, RESIZE) is None
    assert said == ["waiting for room for 3 x {'CPU': 1.0} (1 s of ScalingConfig.resize_timeout_s=2)"]
    assert len(removed) == 1  # the group that never fitted is given back


def test_a_node_that_comes_and_goes_makes_each_growth_wait_longer():
    """DefaultScalingPolicy.growth_hold_s: none with no growth in the last ten minutes; 30 s after
    a recent one, doubled for each further recent growth, at most ten minutes."""
    from raytf import DefaultScalingPolicy

    flap_hold_s = DefaultScalingPolicy().growth_hold_s

    assert flap_hold_s([], 1000.0) == 0.0
    assert flap_hold_s([100.0], 1000.0) == 0.0  # 900 s ago: not a flap
    assert flap_hold_s([990.0], 1000.0) == 30.0
    assert flap_hold_s([900.0, 950.0, 990.0], 1000.0) == 120.0
    assert flap_hold_s([float(t) for t in range(900, 1000, 5)], 1000.0) == 600.0


def test_an_elastic_group_grows_no_sooner_than_its_scaling_policy_allows():
    """GrowBack asks the policy before each look for room: a policy that holds growth an hour after
    the run began training holds it (said once), without looking for room (no placement group)."""
    from types import SimpleNamespace

    from raytf import ScalingPolicy
    from raytf._internal.driver.growth import GrowBack

    class Hourly(ScalingPolicy):
        def placement_tries(self, scaling):
            raise AssertionError("not asked here")

        def growth_hold_s(self, grown_at, now):
            return 3600.0

    said = []
    group = SimpleNamespace(
        elastic=SimpleNamespace(max_workers=4, min_workers=2), num_workers=2, preempt_reason=None,
        watch=SimpleNamespace(trained_since=lambda: 0.0), notify=said.append,
    )  # no roles: looking for room (a placement group for the missing workers) would fail here
    growth = GrowBack(Hourly(), check_s=1.0)
    for now in (100.0, 200.0, 3000.0):
        growth.on_answers(group, now)
    assert said == ["elastic group: growing waits until 3600 s after training began below its maximum "
                    "(Hourly.growth_hold_s)"]
    assert growth._probe is None  # no placement group made for the missing workers

"""The controller and failure policy against a fake worker group: no Ray, milliseconds."""

import dataclasses

import pytest

from raytf import FailureConfig, PlacementTimeoutError, TrainingFailedError, WorkerFailure
from raytf._internal.driver.controller import Controller, Errored, Finished, Restarting, Running, Scheduling
from raytf._internal.driver.failure import FailureBook, root_cause
from raytf._internal.protocol import GroupStatus, Report, UploadedCheckpoint
from raytf.errors import FailureKind


def failure(rank=1, kind="died", time=1.0, message="killed"):
    return WorkerFailure(rank=rank, kind=kind, error_type="X", message=message, traceback="tb", time=time)


class FakeGroup:
    """Plays a script: per attempt, a list of GroupStatus answers to successive polls."""

    def __init__(self, script, start_error=None):
        self.script = script
        self.start_error = start_error
        self.started, self.shutdowns, self.attempt = [], 0, None
        self.restarting = []  # each shutdown's: whether another attempt followed
        self.live = False
        self.acks = []

    def start(self, attempt, resume):
        if self.start_error:
            raise self.start_error
        self.started.append(attempt)
        self.attempt, self.polls, self.live = attempt, 0, True

    def poll(self):
        answers = self.script[self.attempt]
        answer = answers[min(self.polls, len(answers) - 1)]
        self.polls += 1
        return answer

    def shutdown(self, restarting=True):
        self.shutdowns += 1
        self.restarting.append(restarting)
        self.live = False

    def acknowledge(self, rank, seq, error):
        self.acks.append((rank, seq, error))

    def close(self):
        self.shutdown()

    def halt(self, uploading=False):
        """The chief stops taking reports and answers whether an upload of its is in flight: so the
        relay's last status says (``uploading``), or its own fresher answer (``chief_uploading``).
        Only then is the rest of the group killed (``killed_at``)."""
        self.halted_at = self.polls
        uploading = uploading or getattr(self, "chief_uploading", False)
        if uploading:
            self.killed_at = self.polls
        return uploading

    def can_replace(self, failure):
        return False

    def replace(self, failure):
        raise AssertionError("this group replaces nothing in place")

    def connect(self):
        self.connected = True


def report(seq, attempt=0, rank=0):
    return Report(rank=rank, seq=seq, metrics={"step": seq}, time=float(seq), attempt=attempt)


class Clock:
    """Time that moves only when the controller sleeps."""

    def __init__(self):
        self.now = 0.0

    def sleep(self, seconds):
        self.now += seconds

    def __call__(self):
        return self.now


def run(group, config=FailureConfig(), on_report=None, grace=0.0):
    seen = []
    clock = Clock()
    controller = Controller(
        group, FailureBook(config), on_report or seen.append, poll_interval_s=0.5,
        failure_grace_s=grace, sleep=clock.sleep, clock=clock,
    )
    return controller, seen


def test_success_passes_reports_through_and_shuts_down():
    group = FakeGroup({0: [GroupStatus(reports=(report(0),)), GroupStatus(reports=(report(1),), finished=True)]})
    controller, seen = run(group)
    assert isinstance(controller.run(), Finished)
    assert [r.seq for r in seen] == [0, 1]
    assert not group.live and group.started == [0]


def test_an_exception_caused_by_a_peer_death_seen_a_poll_later_is_retried():
    collective = failure(rank=0, kind="exception", time=1.0, message="UnavailableError: peer gone")
    death = failure(rank=1, kind="died", time=1.5)
    group = FakeGroup({0: [GroupStatus(failures=(collective,)), GroupStatus(failures=(death,))],
                       1: [GroupStatus(finished=True)]})
    controller, _ = run(group, FailureConfig(max_failures=1), grace=3.0)
    assert controller.run() == Finished(attempt=1)
    assert controller._policy.failures == [death]


def test_an_exception_with_no_lost_peer_is_raised_after_the_grace_period():
    boom = failure(rank=1, kind="exception", message="boom")
    group = FakeGroup({0: [GroupStatus(failures=(boom,)), GroupStatus()]})
    controller, _ = run(group, FailureConfig(max_failures=3), grace=3.0)
    with pytest.raises(TrainingFailedError, match="boom"):
        controller.run()
    assert group.polls >= 6  # it kept watching for about 3 s of (fake) time first


def test_states_move_one_step_at_a_time():
    group = FakeGroup({0: [GroupStatus(failures=(failure(),))], 1: [GroupStatus(finished=True)]})
    controller, _ = run(group, FailureConfig(max_failures=1))
    steps = [controller.step() for _ in range(5)]
    assert [type(new).__name__ for _, new in steps] == ["Running", "Restarting", "Scheduling", "Running", "Finished"]
    assert steps[1][1] == Restarting(attempt=0, failure=failure())
    assert steps[2][1] == Scheduling(attempt=1)


def test_exception_in_train_fn_is_raised_not_retried():
    boom = failure(rank=1, kind="exception", message="boom")
    group = FakeGroup({0: [GroupStatus(failures=(boom,))]})
    controller, _ = run(group, FailureConfig(max_failures=3))
    with pytest.raises(TrainingFailedError) as info:
        controller.run()
    assert info.value.rank == 1 and "boom" in str(info.value) and "tb" in str(info.value)
    assert group.started == [0] and not group.live
    # The attempt's shutdown knew no attempt follows (Survivors then keeps no process for one).
    assert group.restarting[0] is False


def test_exception_is_retried_when_the_user_asks():
    boom = failure(kind="exception")
    group = FakeGroup({0: [GroupStatus(failures=(boom,))], 1: [GroupStatus(finished=True)]})
    controller, _ = run(group, FailureConfig(max_failures=1, retry_on_exception=True))
    assert controller.run() == Finished(attempt=1)


def test_n_failures_with_max_failures_n_succeed():
    script = {a: [GroupStatus(failures=(failure(rank=a % 2),))] for a in range(3)}
    script[3] = [GroupStatus(finished=True)]
    group = FakeGroup(script)
    controller, _ = run(group, FailureConfig(max_failures=3))
    assert controller.run() == Finished(attempt=3)
    assert group.started == [0, 1, 2, 3]
    assert group.restarting[:3] == [True, True, True]  # each failed attempt's shutdown: a restart follows


def test_n_plus_one_failures_raise_listing_every_attempt():
    script = {a: [GroupStatus(failures=(failure(rank=a % 2, message=f"lost {a}"),))] for a in range(3)}
    group = FakeGroup(script)
    controller, _ = run(group, FailureConfig(max_failures=2))
    with pytest.raises(TrainingFailedError) as info:
        controller.run()
    assert [f.message for f in info.value.attempts] == ["lost 0", "lost 1", "lost 2"]
    text = str(info.value)
    assert "attempt 0: rank 0" in text and "attempt 2: rank 0" in text and "attempt 1: rank 1" in text
    assert group.started == [0, 1, 2] and not group.live
    assert group.restarting[:3] == [True, True, False]  # max_failures=2 spent at the third loss


def test_unlimited_retries():
    script = {a: [GroupStatus(failures=(failure(),))] for a in range(10)}
    script[10] = [GroupStatus(finished=True)]
    controller, _ = run(FakeGroup(script), FailureConfig(max_failures=-1))
    assert controller.run() == Finished(attempt=10)


def test_start_error_is_raised_and_group_cleaned_up():
    group = FakeGroup({}, start_error=PlacementTimeoutError("no room"))
    controller, _ = run(group)
    with pytest.raises(PlacementTimeoutError, match="no room"):
        controller.run()
    assert isinstance(controller.state, Errored) and group.shutdowns >= 1


@pytest.mark.parametrize("error", [KeyboardInterrupt, RuntimeError])
def test_driver_side_error_shuts_the_group_down(error):
    def on_report(_):
        raise error("driver went away")

    group = FakeGroup({0: [GroupStatus(reports=(report(0),))]})
    controller, _ = run(group, on_report=on_report)
    with pytest.raises(error):
        controller.run()
    assert isinstance(controller.state, Running) and not group.live


def test_root_cause_prefers_a_lost_worker_then_the_earliest_exception():
    late_death = failure(rank=1, kind="died", time=5.0)
    early_collective = failure(rank=0, kind="exception", time=1.0)
    assert root_cause([early_collective, late_death]) is late_death
    first = failure(rank=1, kind="exception", time=1.0)
    second = failure(rank=0, kind="exception", time=2.0)
    assert root_cause([second, first]) is first


def test_policy_counts():
    policy = FailureBook(FailureConfig(max_failures=1))
    assert policy.decide(failure()).retry
    assert policy.decide(failure()).retry is False
    assert len(policy.failures) == 2


def test_a_reported_checkpoint_is_acknowledged_with_the_commit_outcome():
    ok = Report(rank=0, seq=0, metrics={}, time=0.0, checkpoint=UploadedCheckpoint("checkpoint_000000", 0))
    bad = Report(rank=0, seq=1, metrics={}, time=1.0, checkpoint=UploadedCheckpoint("checkpoint_000001", 1))
    plain = Report(rank=0, seq=2, metrics={}, time=2.0)
    group = FakeGroup({0: [GroupStatus(reports=(ok, bad, plain), finished=True)]})
    controller, _ = run(group, on_report=lambda r: "disk full" if r.seq == 1 else None)
    controller.run()
    assert group.acks == [(0, 0, None), (0, 1, "disk full")]


def test_collective_errors_alone_are_a_lost_peer_retried_without_retry_on_exception():
    timeout = failure(rank=0, kind="collective", message="DeadlineExceededError: collective timed out")
    group = FakeGroup({0: [GroupStatus(failures=(timeout,)), GroupStatus()], 1: [GroupStatus(finished=True)]})
    controller, _ = run(group, FailureConfig(max_failures=1), grace=1.0)
    assert controller.run() == Finished(attempt=1)
    assert [f.kind for f in controller._policy.failures] == ["collective"]


def test_root_cause_ranks_losses_then_exceptions_then_collective_errors():
    bug = failure(rank=1, kind="exception", time=3.0, message="bug")
    echo = failure(rank=0, kind="collective", time=1.0)
    never = failure(rank=1, kind="not_started", time=9.0)
    assert root_cause([echo, bug]) is bug  # the peer's collective error is the bug's echo
    assert root_cause([echo, bug, never]) is never


def test_a_worker_that_never_started_is_retried_like_a_loss():
    from raytf import WorkerStartError

    class StartsLate(FakeGroup):
        def start(self, attempt, resume):
            if attempt == 0:
                raise WorkerStartError("worker actors did not start within 5 s")
            super().start(attempt, resume)

    group = StartsLate({1: [GroupStatus(finished=True)]})
    controller, _ = run(group, FailureConfig(max_failures=1))
    assert controller.run() == Finished(attempt=1)
    assert controller._policy.failures[0].kind == "not_started"
    assert "did not start" in controller._policy.failures[0].describe()


def test_a_preemption_restarts_without_counting_a_failure():
    # Attempt 0: preemption requested, then every worker stops after its checkpoint.
    # Attempt 1: preempted again, and the node goes before the workers stop.
    # Attempt 2: finishes. max_failures=0 all along.
    asked = GroupStatus(preempting=True, preempt_reason="node 10.0.0.2 is draining")
    script = {
        0: [GroupStatus(), asked, GroupStatus(preempting=True, stopped=True)],
        1: [asked, GroupStatus(preempting=True, failures=(failure(rank=1, kind="died"),))],
        2: [GroupStatus(finished=True)],
    }
    controller, _ = run(FakeGroup(script), FailureConfig(max_failures=0))
    assert controller.run() == Finished(attempt=2)
    kinds = [(f.kind, f.message) for f in controller._policy.failures]
    assert kinds[0] == ("preempted", "node 10.0.0.2 is draining")
    assert kinds[1][0] == "preempted" and "then rank 1" in kinds[1][1] and "died" in kinds[1][1]
    assert controller._policy.counted == 0


def test_a_group_that_stops_to_grow_is_resized_and_spends_no_budget():
    """Growth (driver/growth.py) asks the group to stop as a preemption does, with kind RESIZED:
    before, it was "preempted" and spent max_preemptions, so a node that came and went often
    enough ended the run."""
    grow = GroupStatus(preempting=True, preempt_reason="growing from 2 to 3 workers",
                       preempt_kind=FailureKind.RESIZED)
    script = {0: [GroupStatus(), grow, dataclasses.replace(grow, stopped=True)],
              1: [grow, dataclasses.replace(grow, stopped=True)],
              2: [GroupStatus(finished=True)]}
    controller, _ = run(FakeGroup(script), FailureConfig(max_failures=0, max_preemptions=0))
    assert controller.run() == Finished(attempt=2)
    assert [(f.kind, f.error_type, f.message) for f in controller._policy.failures] == [
        ("resized", "Resized", "growing from 2 to 3 workers")] * 2
    assert controller._policy.counted == 0


def test_a_real_failure_after_preemptions_still_counts():
    script = {
        0: [GroupStatus(preempting=True, preempt_reason="SIGTERM", stopped=True)],
        1: [GroupStatus(failures=(failure(),))],
    }
    controller, _ = run(FakeGroup(script), FailureConfig(max_failures=0))
    with pytest.raises(TrainingFailedError) as info:
        controller.run()
    assert [f.kind for f in info.value.attempts] == ["preempted", "died"]


def test_a_rank_that_stopped_taking_part_outranks_the_collective_error_it_caused():
    timeout = failure(rank=0, kind="collective", time=1.0)
    idle = failure(rank=1, kind="stalled", time=2.0)
    bug = failure(rank=0, kind="exception", time=3.0)
    assert root_cause([timeout, idle]) is idle
    assert root_cause([timeout, idle, bug]) is bug


def test_a_stalled_rank_is_retried_and_an_early_return_is_raised():
    policy = FailureBook(FailureConfig(max_failures=2))
    assert policy.decide(failure(kind="stalled")).retry
    assert policy.decide(failure(kind="returned_early")).retry is False
    assert FailureBook(FailureConfig(max_failures=2, retry_on_exception=True)).decide(
        failure(kind="returned_early")).retry


def test_a_hang_ends_the_attempt_without_waiting_out_the_grace_period():
    hung = failure(rank=1, kind="stalled")
    group = FakeGroup({0: [GroupStatus(failures=(hung,))], 1: [GroupStatus(finished=True)]})
    controller, _ = run(group, FailureConfig(max_failures=1), grace=100.0)
    controller.step(), controller.step()
    assert isinstance(controller.state, Restarting)  # at once, not after 100 s


def test_the_guard_stops_the_run_and_the_group_is_shut_down():
    from raytf import RunInUseError

    def lost():
        raise RunInUseError("another driver took the run")

    group = FakeGroup({0: [GroupStatus()]})
    clock = Clock()
    controller = Controller(group, FailureBook(FailureConfig()), lambda r: None, sleep=clock.sleep,
                            clock=clock, guard=lost)
    with pytest.raises(RunInUseError):
        controller.run()
    assert group.started == [0] and not group.live


class ReplacingGroup(FakeGroup):
    """A parameter-server group: rank 1's losses are replaced in place."""

    def __init__(self, script):
        super().__init__(script)
        self.replaced = []

    def can_replace(self, f):
        return f.rank == 1

    def replace(self, f):
        self.replaced.append(f)


def test_a_replaceable_loss_is_replaced_in_place_without_ending_the_attempt():
    group = ReplacingGroup({0: [GroupStatus(failures=(failure(rank=1),)), GroupStatus(finished=True)]})
    controller, _ = run(group, FailureConfig(max_failures=1))
    assert isinstance(controller.run(), Finished)
    assert group.started == [0] and [f.rank for f in group.replaced] == [1]
    assert controller._policy.counted == 1  # it still counts against max_failures


def test_replacements_stop_when_max_failures_is_spent_and_other_losses_restart():
    group = ReplacingGroup({0: [GroupStatus(failures=(failure(rank=1),))]})
    controller, _ = run(group, FailureConfig(max_failures=0))
    with pytest.raises(TrainingFailedError):
        controller.run()
    assert group.replaced == [] and not group.live
    group = ReplacingGroup({0: [GroupStatus(failures=(failure(rank=2),))], 1: [GroupStatus(finished=True)]})
    controller, _ = run(group, FailureConfig(max_failures=1))
    assert isinstance(controller.run(), Finished)
    assert group.started == [0, 1] and group.replaced == []  # rank 2 (a ps) restarts the group


class UnreplaceableGroup(ReplacingGroup):
    """A parameter-server group whose replacement for rank 1 never comes up."""

    def replace(self, f):
        from raytf import WorkerStartError

        self.replaced.append(f)
        raise WorkerStartError("the replacement could not come back at its address")


def test_a_replacement_that_does_not_come_up_restarts_the_group_and_counts_as_one_failure():
    group = UnreplaceableGroup({0: [GroupStatus(failures=(failure(rank=1),))], 1: [GroupStatus(finished=True)]})
    controller, _ = run(group, FailureConfig(max_failures=1))
    assert isinstance(controller.run(), Finished)  # one loss, within max_failures=1
    assert group.started == [0, 1] and len(group.replaced) == 1
    assert [f.kind for f in controller._policy.failures] == ["died", "not_started"]
    assert "its replacement: the replacement could not come back" in controller._policy.failures[1].message
    assert controller._policy.counted == 1
    # A second, separate loss is counted: max_failures=1 then ends the run.
    group = UnreplaceableGroup({0: [GroupStatus(failures=(failure(rank=1),))],
                                1: [GroupStatus(failures=(failure(rank=0),))]})
    controller, _ = run(group, FailureConfig(max_failures=1))
    with pytest.raises(TrainingFailedError):
        controller.run()
    assert group.started == [0, 1] and controller._policy.counted == 2


def test_a_preempted_worker_is_replaced_without_counting():
    group = ReplacingGroup({0: [GroupStatus(failures=(failure(rank=1, kind="preempted"),)),
                                GroupStatus(finished=True)]})
    controller, _ = run(group, FailureConfig(max_failures=0))
    assert isinstance(controller.run(), Finished)
    assert len(group.replaced) == 1 and controller._policy.counted == 0


def test_port_races_are_free_a_few_times_then_count_against_max_failures():
    from raytf._internal.driver.failure import FREE_PORT_RACES

    policy = FailureBook(FailureConfig(max_failures=0))
    races = [policy.decide(failure(kind="port_taken")).retry for _ in range(FREE_PORT_RACES)]
    assert races == [True] * FREE_PORT_RACES and policy.counted == 0
    assert policy.decide(failure(kind="port_taken")).retry is False  # with max_failures=0: the next one ends it
    retrying = FailureBook(FailureConfig(max_failures=2))
    decisions = [retrying.decide(failure(kind="port_taken")).retry for _ in range(FREE_PORT_RACES + 3)]
    assert decisions == [True] * (FREE_PORT_RACES + 2) + [False]


def test_preemptions_have_a_bounded_budget_of_their_own():
    policy = FailureBook(FailureConfig(max_failures=0, max_preemptions=2))
    decisions = [policy.decide(failure(kind="preempted")) for _ in range(3)]
    assert [d.retry for d in decisions] == [True, True, False]
    assert decisions[-1].reason == "FailureConfig.max_preemptions=2 used up"
    assert policy.counted == 0  # never counted against max_failures
    unlimited = FailureBook(FailureConfig(max_preemptions=-1))
    assert all(unlimited.decide(failure(kind="preempted")).retry for _ in range(500))
    assert FailureConfig().max_preemptions == 100


class InterruptedGroup(FakeGroup):
    """Ctrl-C lands in the poll ``at``; the polls after it play on (the driver waiting for an upload)."""

    def __init__(self, script, at):
        super().__init__(script)
        self.at = at

    def poll(self):
        if self.polls == self.at:
            self.polls += 1
            raise KeyboardInterrupt
        return super().poll()


def test_ctrl_c_waits_for_the_asynchronous_checkpoint_in_flight_then_stops():
    from raytf._internal.protocol import Progress, ReportStage

    uploading, idle = Progress(uploading=True), Progress()
    pending = Report(rank=0, seq=3, metrics={"step": 3}, time=3.0, stage=ReportStage.PENDING)
    uploaded = Report(rank=0, seq=3, metrics={"step": 3}, time=3.0, stage=ReportStage.UPLOADED,
                      checkpoint=UploadedCheckpoint("checkpoint_000000", 0))
    lost = failure(rank=1, kind="died", message="halted")  # the halt ended the other ranks: no reason to stop waiting
    group = InterruptedGroup({0: [GroupStatus(reports=(pending,), progress=uploading), None,
                                  GroupStatus(progress=uploading), GroupStatus(progress=uploading, failures=(lost,)),
                                  GroupStatus(reports=(uploaded,), progress=uploading),
                                  GroupStatus(progress=idle), GroupStatus(finished=True)]}, at=1)
    controller, seen = run(group)
    with pytest.raises(KeyboardInterrupt):
        controller.run()
    assert group.halted_at == 3  # training stopped at the first poll after the stop, before any wait
    assert seen == [pending, uploaded]  # the upload's report was handled (committed) before the group went
    assert group.acks == [(0, 3, None)] and group.polls == 6 and not group.live


def test_a_failed_attempt_whose_chief_lives_commits_its_checkpoint_in_flight_before_the_restart():
    """Rank 1 died while the chief uploaded a checkpoint: the group halts and the upload's commit
    lands before the shutdown (the chief then keeps the copy its restart reads from memory). A
    chief that died itself is not waited for: its progress is the last it sent."""
    from raytf._internal.protocol import Progress, ReportStage

    uploading, idle = Progress(uploading=True), Progress()
    uploaded = Report(rank=0, seq=3, metrics={"step": 3}, time=3.0, stage=ReportStage.UPLOADED,
                      checkpoint=UploadedCheckpoint("checkpoint_000000", 0))
    group = FakeGroup({0: [GroupStatus(progress=uploading, failures=(failure(rank=1),)),
                           GroupStatus(progress=uploading), GroupStatus(reports=(uploaded,), progress=uploading),
                           GroupStatus(progress=idle)],
                       1: [GroupStatus(finished=True)]})
    controller, seen = run(group, FailureConfig(max_failures=2))
    assert isinstance(controller.run(), Finished)
    assert group.halted_at == 2 and seen == [uploaded] and group.acks == [(0, 3, None)]
    assert group.started == [0, 1] and group.shutdowns == 2  # the restart, then the close

    # The chief lost while the driver waited: the wait ends there, not at its 60 s.
    lost_meanwhile = FakeGroup({0: [GroupStatus(progress=uploading, failures=(failure(rank=1),)),
                                    GroupStatus(progress=uploading),
                                    GroupStatus(progress=uploading, failures=(failure(rank=0),)),
                                    GroupStatus(progress=uploading)],
                                1: [GroupStatus(finished=True)]})
    controller, _ = run(lost_meanwhile, FailureConfig(max_failures=2))
    assert isinstance(controller.run(), Finished)
    assert lost_meanwhile.halted_at == 2 and controller._clock() < 5.0

    chief_lost = FakeGroup({0: [GroupStatus(progress=uploading, failures=(failure(rank=0),))],
                            1: [GroupStatus(finished=True)]})
    controller, _ = run(chief_lost, FailureConfig(max_failures=2))
    assert isinstance(controller.run(), Finished)
    assert not hasattr(chief_lost, "halted_at") and chief_lost.polls == 1


def test_a_stop_with_no_upload_in_flight_kills_nothing_and_waits_for_nothing():
    """The chief is asked (it takes no report from then on), says no upload is in flight, and the
    group goes at once."""
    from raytf._internal.protocol import Progress

    group = InterruptedGroup({0: [GroupStatus(progress=Progress()), None, GroupStatus(progress=Progress())]}, at=1)
    controller, _ = run(group)
    with pytest.raises(KeyboardInterrupt):
        controller.run()
    assert group.halted_at == 3 and not hasattr(group, "killed_at") and group.polls == 3 and not group.live
    assert controller._clock() == 0.5  # the poll interval before the stop, and no wait after it


def test_a_stop_waits_for_an_upload_the_relays_last_answer_is_too_old_to_show():
    """SIGTERM lands just after the chief's asynchronous checkpoint set out, and the relay's last
    answer from it is older: the chief's own answer to the halt says an upload is in flight, so
    the rest of the group is killed and the upload's report is committed before the group goes
    (on a loaded machine the stale answer once let the group go with the upload uncommitted)."""
    from raytf._internal.protocol import Progress, ReportStage

    uploaded = Report(rank=0, seq=3, metrics={"step": 3}, time=3.0, stage=ReportStage.UPLOADED,
                      checkpoint=UploadedCheckpoint("checkpoint_000000", 0))
    group = InterruptedGroup({0: [GroupStatus(progress=Progress()), None, GroupStatus(progress=Progress()),
                                  GroupStatus(reports=(uploaded,), progress=Progress(uploading=True)),
                                  GroupStatus(progress=Progress())]}, at=1)
    group.chief_uploading = True
    controller, seen = run(group)
    with pytest.raises(KeyboardInterrupt):
        controller.run()
    assert group.halted_at == group.killed_at == 3
    assert seen == [uploaded] and group.acks == [(0, 3, None)] and group.polls == 5 and not group.live


def test_a_stopped_run_waits_for_an_upload_no_longer_than_its_bound():
    from raytf._internal.protocol import Progress

    group = InterruptedGroup({0: [GroupStatus(progress=Progress(uploading=True)), None,
                                  GroupStatus(progress=Progress(uploading=True))]}, at=1)
    controller, _ = run(group)
    with pytest.raises(KeyboardInterrupt):
        controller.run()
    assert controller._clock() > 60.0 and not group.live  # UPLOAD_WAIT_S, then the group went


def test_a_failure_policy_of_the_users_backs_off_between_restarts_then_raises_with_its_reason():
    """A custom FailurePolicy: lost workers are retried after 30 s, then 60 s, and the third loss
    ends the run with the policy's reason; the controller waits on its (fake) clock, between
    polls of its guard, and the history it passes grows with each failure."""
    from raytf import FailureDecision, FailurePolicy

    seen = []

    class BackOff(FailurePolicy):
        def decide(self, failure, history):
            seen.append((failure.rank, len(history.failures), history.counted))
            if history.counted >= 3:
                return FailureDecision(retry=False, reason="three lost workers: the cluster is unwell")
            return FailureDecision(retry=True, delay_s=30.0 * history.counted)

    lost = GroupStatus(failures=(failure(rank=1),))
    group = FakeGroup({0: [lost], 1: [lost], 2: [lost]})
    clock, guarded = Clock(), []
    controller = Controller(group, FailureBook(FailureConfig(policy=BackOff())), lambda r: None, poll_interval_s=0.5,
                            failure_grace_s=0.0, sleep=clock.sleep, clock=clock,
                            guard=lambda: guarded.append(clock.now))
    starts = []
    start = group.start
    group.start = lambda attempt, resume: (starts.append(clock.now), start(attempt, resume))
    with pytest.raises(TrainingFailedError, match="Not retried: three lost workers: the cluster is unwell") as raised:
        controller.run()
    assert seen == [(1, 1, 1), (1, 2, 2), (1, 3, 3)]
    assert group.started == [0, 1, 2] and len(raised.value.attempts) == 3
    assert starts[1] - starts[0] >= 30.0 and starts[2] - starts[1] >= 60.0  # each restart after its back-off
    waiting = [t for t in guarded if starts[0] < t < starts[1]]
    assert max(b - a for a, b in zip(waiting, waiting[1:])) <= 0.5  # the guard ran all through the wait


def test_a_failure_policy_that_returns_no_decision_is_a_clear_error():
    from raytf import ConfigError, FailurePolicy

    class Forgetful(FailurePolicy):
        def decide(self, failure, history):
            return "retry"

    with pytest.raises(ConfigError, match="Forgetful.decide returned 'retry': a FailurePolicy returns a raytf.FailureDecision"):
        FailureBook(FailureConfig(policy=Forgetful())).decide(failure())
    with pytest.raises(ConfigError, match="FailureConfig.policy must be a raytf.FailurePolicy"):
        FailureConfig(policy=lambda failure, history: None)
    with pytest.raises(ConfigError, match="delay_s must be a number of seconds >= 0"):
        __import__("raytf").FailureDecision(retry=True, delay_s=-1)

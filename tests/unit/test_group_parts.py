"""The worker group's pure parts: the two cluster shapes (shapes.py) and the callbacks
(callbacks.py), run against a plain stand-in for the group (members.py's GroupView), no Ray."""

import json
import types

import pytest

from raytf._internal.driver import callbacks as group_callbacks
from raytf._internal.driver.callbacks import DrainWatch, FinishEvaluator, StartupTiming
from raytf._internal.driver.members import Member
from raytf._internal.driver.shapes import MirroredShape, ParameterServerShape, addresses_by_role
from raytf._internal.driver.topology import build_tf_config
from raytf._internal.driver.watch import GroupWatch
from raytf._internal.protocol import GroupStatus, PayloadKind, Phase, Progress, RoleSpec, WorkerAddress, WorkerStatus


def _members(roles_and_nodes):
    """Members in bundle order: (role, node) each, with an address on that node."""
    members, tasks = [], {}
    for bundle, (role, node) in enumerate(roles_and_nodes):
        task = tasks.get(role.name, 0)
        tasks[role.name] = task + 1
        members.append(Member(role, task, bundle, actor=_Actor(),
                              address=WorkerAddress(node, f"10.0.0.{node[-1]}", 5000 + bundle)))
    return members


class _Method:
    def __init__(self, calls, name):
        self._calls, self._name = calls, name

    def remote(self, *args):
        self._calls.append((self._name, args))


class _Actor:
    def __init__(self):
        self.calls = []

    def __getattr__(self, name):
        return _Method(self.calls, name)


def _group(shape, members, **more):
    fields = dict(shape=shape, members=members, preempt_reason=None, watch=None, times={}, trainer_index=0)
    return types.SimpleNamespace(**{**fields, **more})


WORKER = RoleSpec("worker", 1, 4, {"CPU": 1})


def test_mirrored_workers_take_world_ranks_by_node_and_tf_config_lists_them_in_rank_order():
    # Bundles landed on nodes a, b, a, b: node a's workers take ranks 0 and 1.
    members = MirroredShape().order(_members([(WORKER, "node-a"), (WORKER, "node-b"), (WORKER, "node-a"),
                                              (WORKER, "node-b")]))
    assert [m.bundle for m in members] == [0, 2, 1, 3]
    assert [(m.task, m.rank.local_rank, m.rank.node_rank) for m in members] == [(0, 0, 0), (1, 1, 0), (2, 0, 1),
                                                                                 (3, 1, 1)]
    cluster = addresses_by_role(members)
    assert cluster["worker"] == [m.address.host_port for m in members]
    assert json.loads(build_tf_config(cluster, members[2].task, "worker"))["task"] == {"type": "worker", "index": 2}
    assert MirroredShape().count(WORKER, 3) == 3  # the elastic size


def test_a_value_always_set_before_it_is_read_is_read_through_an_accessor_that_names_what_is_missing():
    """The members' and the specs' Optional fields that the group fills in before anything reads
    them (mypy checks that every read narrows them): a read too early is named, not an
    AttributeError on None further on."""
    from raytf._internal.driver.members import watch_of
    from raytf._internal.protocol import CheckpointPart, Report, RunSpec, TaskId, TensorflowSettings, WorkerSpec

    [member] = _members([(WORKER, "node-a")])
    assert member.reserved is member.address
    with pytest.raises(RuntimeError, match="worker 0 has no rank yet"):
        _ = member.given_rank
    [ranked] = MirroredShape().order([member])
    assert ranked.given_rank.world_rank == 0
    with pytest.raises(RuntimeError, match="worker 0 has no address yet"):
        _ = Member(WORKER, 0, 0).reserved
    with pytest.raises(RuntimeError, match="watch was read outside an attempt"):
        watch_of(_group(MirroredShape(), [member]))
    watch = GroupWatch({0: "10.0.0.1"}, start_timeout_s=10, worker_timeout_s=5, hang_timeout_s=None)
    assert watch_of(_group(MirroredShape(), [member], watch=watch)) is watch
    report = Report(rank=1, seq=3, metrics={}, time=0.0)
    with pytest.raises(ValueError, match="rank 1's report 3 is not part of a collective report"):
        _ = report.share
    part = CheckpointPart(round=0, parties=2)
    assert Report(rank=1, seq=3, metrics={}, time=0.0, part=part).share is part
    spec = WorkerSpec(role="worker", rank=ranked.given_rank, tf_config="{}", attempt=0)
    with pytest.raises(ValueError, match="has no parameter-server task"):
        _ = spec.ps_task
    ps = WorkerSpec(role="ps", rank=ranked.given_rank, tf_config="{}", attempt=0, task=TaskId("ps", 1))
    assert ps.ps_task.index == 1
    settings = TensorflowSettings("ring", None, intra_op_threads=1, inter_op_threads=1, use_gpu=False)
    run = RunSpec(run_name="r", run_path="/r", payload=b"", tensorflow=settings)
    with pytest.raises(ValueError, match="run r has no storage"):
        _ = run.store


def test_parameter_server_tasks_keep_role_order_and_only_the_chief_is_a_group_of_one():
    chief, ps = RoleSpec("chief", 1, 1, {"CPU": 1}), RoleSpec("ps", 2, 2, {"CPU": 1})
    shape = ParameterServerShape()
    members = shape.order(_members([(chief, "node-a"), (WORKER, "node-a"), (WORKER, "node-b"), (ps, "node-b"),
                                    (ps, "node-a")]))
    assert [m.label for m in members] == ["chief 0", "worker 0", "worker 1", "ps 0", "ps 1"]
    assert (members[0].rank.world_rank, members[0].rank.world_size) == (0, 1)
    assert [m.rank.world_rank for m in members[1:]] == [1, 2, 3, 4]
    assert shape.count(WORKER, 1) == WORKER.max_count  # not elastic
    assert shape.describe(members[3], 3) == "ps 0" and MirroredShape().describe(members[3], 3) == "rank 3"


def test_startup_timing_reports_the_phases_once_the_attempt_trains():
    watch = GroupWatch({0: "10.0.0.1"}, start_timeout_s=60, worker_timeout_s=30, hang_timeout_s=None,
                       clock=lambda: 10.0)
    group = _group(MirroredShape(), [], times={"began": 1.0, "placed": 2.0, "actors_up": 4.0})
    group.watch = watch
    timing = StartupTiming()
    timing.before_start(group, 0)
    watch.heard(0, WorkerStatus(rank=0, phase=Phase.TRAINING))
    status = timing.after_poll(group, watch.round(None))
    assert status.startup is None  # connected, but no step yet
    watch.heard(0, WorkerStatus(rank=0, phase=Phase.TRAINING, progress=Progress(epoch=0, step=1, global_step=1)))
    status = timing.after_poll(group, watch.round(None))
    assert status.startup == {"placement": 1.0, "actors": 2.0, "loading": 6.0, "connect": 0.0, "first_step": 0.0,
                              "total": 9.0}
    assert timing.after_poll(group, watch.round(None)).startup is None  # once per attempt


def test_a_draining_node_preempts_the_members_on_it(monkeypatch):
    chief = RoleSpec("chief", 1, 1, {"CPU": 1})
    members = _members([(chief, "node-1"), (WORKER, "node-2")])
    preempted = []
    group = _group(ParameterServerShape(), members, preempt=lambda index, why: preempted.append((index, why)))
    monkeypatch.setattr(group_callbacks.cluster, "draining_nodes", lambda: {"node-2": 0})
    drains = DrainWatch(interval_s=1.0)
    drains.on_answers(group, now=5.0)
    assert preempted == [(1, "node 10.0.0.2 of worker 0 is draining")]
    drains.on_answers(group, now=5.5)  # asks Ray once a second, not every poll
    assert len(preempted) == 1


def test_the_evaluator_is_told_to_finish_once_the_chief_returned_and_so_is_its_replacement():
    chief = RoleSpec("chief", 1, 1, {"CPU": 1}, PayloadKind.CHIEF)
    evaluator = RoleSpec("evaluator", 1, 1, {"CPU": 1}, PayloadKind.EVALUATOR)
    members = _members([(chief, "node-1"), (evaluator, "node-1")])
    group = _group(ParameterServerShape(), members)
    group.watch = types.SimpleNamespace(phases={0: Phase.TRAINING})
    finish = FinishEvaluator()
    finish.before_start(group, 0)
    finish.on_answers(group, 1.0)
    assert members[1].actor.calls == []
    group.watch.phases[0] = Phase.FINISHED
    finish.on_answers(group, 2.0)
    finish.on_answers(group, 3.0)
    assert members[1].actor.calls == [("finish", ())]
    replacement = Member(evaluator, 0, 1, actor=_Actor())
    finish.after_replace(group, replacement)
    assert replacement.actor.calls == [("finish", ())]


def test_an_unchanged_status_passes_through_callbacks_that_have_nothing_to_add():
    status = GroupStatus(finished=True)
    assert group_callbacks.GroupCallback().after_poll(_group(MirroredShape(), []), status) is status


def test_warm_standbys_start_at_the_first_step_or_report_or_a_while_after_a_silent_loop_connected():
    from raytf._internal.driver import warm

    now = [100.0]

    def connected_watch():
        watch = GroupWatch({0: "10.0.0.1"}, start_timeout_s=60, worker_timeout_s=30, hang_timeout_s=None,
                           clock=lambda: now[0])
        watch.heard(0, WorkerStatus(rank=0, phase=Phase.TRAINING))
        watch.round(None)
        return watch

    silent = connected_watch()  # a loop that tells raytf of no step and makes no report
    assert not warm._trains(silent)
    now[0] += warm._WARM_AFTER_S - 0.5
    assert not warm._trains(silent)
    now[0] += 1.0
    assert warm._trains(silent)
    stepping = connected_watch()
    stepping.heard(0, WorkerStatus(rank=0, phase=Phase.TRAINING, progress=Progress(epoch=0, step=1, global_step=1)))
    stepping.round(None)
    assert warm._trains(stepping)  # at its first step, not later


def test_cpu_workers_standbys_are_made_once_every_rank_answered_for_its_shards_however_long_it_takes(
        monkeypatch):
    """A rank lost once its standby is up is one whose shards are kept: the standbys wait for the
    ranks' answers (a slow answer otherwise lost the rank's shards: a new split at the restart, the
    warm-standby test's failure in CI on the oldest versions, where a wait of 10 s ran out first)."""
    from raytf._internal.driver import warm

    made = []
    monkeypatch.setattr(warm, "new_worker", lambda run_name, name, **options: made.append(name) or _Actor())

    class Keeper:
        def __init__(self):
            self.asked, self.answers = [], False

        def ask(self, actors, nodes):
            self.asked.append(tuple(nodes))

        def answered(self):
            return self.answers

    now = [100.0]
    watch = types.SimpleNamespace(now=lambda: now[0], trained_since=lambda: 99.0, reached={})
    node_a, node_b = "a" * 56, "b" * 56  # Ray's node ids: 28 bytes in hex
    group = _group(MirroredShape(), _members([(WORKER, node_a), (WORKER, node_b)]), watch=watch,
                   run=types.SimpleNamespace(run_name="run"), run_ref="run-ref")
    standbys, made[:] = warm.WarmStandbys(["train"], ["train"]), []
    standbys._keeper = keeper = Keeper()
    standbys.before_start(group, attempt=0)
    standbys.after_poll(group, GroupStatus())
    assert keeper.asked == [(node_a, node_b)] and made == []  # asked; no standby before the answers
    for _ in range(3):  # the answers are slow: minutes go by, and still no standby
        now[0] += 60.0
        standbys.after_poll(group, GroupStatus())
    assert made == []
    keeper.answers = True
    standbys.after_poll(group, GroupStatus())
    standbys.after_poll(group, GroupStatus())
    assert made == ["raytf:run:standby:1", "raytf:run:standby:2"]  # one per rank, once
    assert keeper.asked == [(node_a, node_b)]


def test_a_rank_still_reading_when_first_asked_is_asked_again_at_the_first_report_before_the_standbys_come(
        monkeypatch):
    """Asked a while after the connect, with no step or report yet, a rank may be still reading its
    shard (a slow read: Ray Data's tasks waiting for the CPUs the workers hold). Its "not whole" is
    no final answer: the standbys wait for the first report, the ranks that had not read whole are
    asked again then, and the standbys come once they answer (the warm-standby test's failure on the
    oldest versions: standbys up before the report, rank 1 killed at once, its shard split anew)."""
    from raytf._internal.driver import warm
    from raytf._internal.driver.watch import Milestone

    made = []
    monkeypatch.setattr(warm, "new_worker", lambda run_name, name, **options: made.append(name) or _Actor())

    class Keeper:
        def __init__(self):
            self.asked = self.asked_again = 0
            self.answers, self.whole = True, False

        def ask(self, actors, nodes):
            self.asked += 1

        def ask_again(self, actors):
            self.asked_again += 1
            self.answers = False  # out again

        def answered(self):
            return self.answers

        def all_whole(self):
            return self.whole

    now, reported = [100.0], [None]
    watch = types.SimpleNamespace(now=lambda: now[0], trained_since=lambda: reported[0],
                                  reached={Milestone.CONNECTED: 100.0})
    group = _group(MirroredShape(), _members([(WORKER, "a" * 56), (WORKER, "b" * 56)]), watch=watch,
                   run=types.SimpleNamespace(run_name="run"), run_ref="run-ref")
    standbys = warm.WarmStandbys(["train"], ["train"])
    standbys._keeper = keeper = Keeper()
    standbys.before_start(group, attempt=0)
    now[0] += warm._WARM_AFTER_S + 1  # connected, silent: asked, and "not read whole" comes back
    standbys.after_poll(group, GroupStatus())
    assert keeper.asked == 1 and made == []
    now[0] += 20.0  # still no report: still no standby
    standbys.after_poll(group, GroupStatus())
    assert made == []
    reported[0] = now[0]  # the first report: the ranks are asked again, and the standbys wait for that
    standbys.after_poll(group, GroupStatus())
    assert keeper.asked_again == 1 and made == []
    keeper.answers, keeper.whole = True, True
    standbys.after_poll(group, GroupStatus())
    assert made == ["raytf:run:standby:1", "raytf:run:standby:2"] and keeper.asked_again == 1

    # A loop that never tells raytf of a step or report gets its standbys _UNTOLD_WAIT_S after the ask.
    reported[0], made[:] = None, []
    standbys = warm.WarmStandbys(["train"], ["train"])
    standbys._keeper = keeper = Keeper()
    standbys.before_start(group, attempt=0)
    asked_at = now[0]
    standbys.after_poll(group, GroupStatus())
    now[0] = asked_at + warm._UNTOLD_WAIT_S - 1
    standbys.after_poll(group, GroupStatus())
    assert made == []
    now[0] = asked_at + warm._UNTOLD_WAIT_S + 1
    standbys.after_poll(group, GroupStatus())
    assert len(made) == 2 and keeper.asked_again == 0


def test_a_silent_workers_process_is_ended_by_its_pid_and_no_other_process_is():
    """group.shutdown's last resort for an actor that answers nothing (actors.end_process): a
    stopped process titled as a worker actor is killed; a process of another title is left."""
    import signal
    import subprocess
    import sys
    import time

    from raytf._internal.driver.actors import end_process

    sleeper = [sys.executable, "-c", "import time; time.sleep(120)"]
    worker = subprocess.Popen([*sleeper, "ray::TrainWorker"])  # its title, as Ray's setproctitle leaves it
    other = subprocess.Popen([*sleeper, "ray::IDLE"])
    try:
        for process, title in ((worker, b"ray::TrainWorker"), (other, b"ray::IDLE")):
            # Until the child has exec'd, /proc shows the forked pytest's command line: wait for its own.
            deadline = time.monotonic() + 60
            while title not in open(f"/proc/{process.pid}/cmdline", "rb").read():
                assert time.monotonic() < deadline, f"{title!r} never showed in /proc/{process.pid}/cmdline"
                time.sleep(0.01)
        worker.send_signal(signal.SIGSTOP)  # alive, and answering nothing
        assert end_process(worker.pid)
        assert worker.wait(timeout=30) == -signal.SIGKILL
        assert not end_process(other.pid) and other.poll() is None
        assert not end_process(worker.pid)  # gone: nothing to end
    finally:
        for process in (worker, other):
            process.kill()
            process.wait()


def test_a_call_each_that_runs_out_of_time_names_the_setting_that_set_it(monkeypatch):
    """A replaced parameter-server task's retarget waits FailureConfig.worker_timeout_s for the chief
    (a silent chief is lost), not start_timeout_s: the error says which one ran out."""
    import pytest
    from ray.exceptions import GetTimeoutError

    from raytf._internal.driver import actors
    from raytf.errors import WorkerStartError

    class _Answering:
        def __getattr__(self, name):
            return types.SimpleNamespace(remote=lambda *args: (name, args))

    def never_in_time(ref, timeout):
        raise GetTimeoutError(f"{ref} not ready in {timeout} s")

    monkeypatch.setattr(actors.ray, "get", never_in_time)
    with pytest.raises(WorkerStartError, match=r"did not retarget the chief within 30 s \(FailureConfig.worker_timeout_s\)"):
        actors.call_each([_Answering()], "retarget", lambda i: ("worker", 1, "10.0.0.2:5001"), "retarget the chief",
                         30.0, "FailureConfig.worker_timeout_s")
    with pytest.raises(WorkerStartError, match=r"within 120 s \(FailureConfig.start_timeout_s\)"):
        actors.call_each([_Answering()], "start", lambda i: (), "start a replacement", 120.0)


def test_a_member_replaced_in_place_after_going_silent_has_its_process_ended_and_a_dead_one_not(monkeypatch):
    """group.replace (a parameter-server worker replaced while the chief trains) ends a silent
    member's process once Ray was told to kill it, as group.shutdown does: Ray 2.50's kill can leave a
    stopped process holding its bundle, and the replacement would never start in it."""
    from raytf._internal.driver import group as group_module
    from raytf._internal.driver.group import WorkerGroup
    from raytf.errors import FailureKind, WorkerFailure

    killed = []
    monkeypatch.setattr(group_module, "kill_and_wait", lambda actors, what, silent=(): killed.append(list(silent)))
    monkeypatch.setattr(group_module, "call_each", lambda *args, **kwargs: [True])

    def replace(silent_ranks):
        members = _members([(WORKER, "node-a"), (WORKER, "node-b")])
        watch = types.SimpleNamespace(silent_ranks=set(silent_ranks), replaced=lambda index, ip: None)
        fake = _group(ParameterServerShape(), members, watch=watch, _preempted={}, _cluster={"worker": {}},
                      _new_actor=lambda member: _Actor(), _reserve=lambda ms: None, _spec=lambda member: None,
                      run_ref=None, _relay=types.SimpleNamespace(replace=lambda index, actor: None), _callbacks=[],
                      notify=lambda message: None, _worker_timeout_s=30.0, _start_timeout_s=120.0)
        old = members[1].address
        WorkerGroup.replace(fake, WorkerFailure(rank=1, kind=FailureKind.UNRESPONSIVE, error_type="", message="",
                                                traceback="", time=0.0))
        return old

    old = replace(silent_ranks={1})
    assert killed.pop() == [old]
    replace(silent_ranks=set())  # it died: nothing left to end
    assert killed.pop() == []


def test_a_stop_tells_a_silent_chief_to_halt_and_takes_the_relays_answer_without_waiting_for_its_own(monkeypatch):
    """group.halt asks the chief whether a checkpoint of its is on its way, waiting up to
    HALT_ANSWER_S for the answer, and kills the others where one is. A chief the watch found silent
    (a stopped or stuck process, the failure that ends the attempt) is told all the same but not
    waited for: the attempt's end does not wait those seconds for an answer that will not come, and
    the relay's last answer decides."""
    from raytf._internal.driver import group as group_module
    from raytf._internal.driver.group import WorkerGroup

    class Chief(_Actor):
        def __getattr__(self, name):  # its calls' answers: the chief says an upload is on its way
            return types.SimpleNamespace(remote=lambda *args: _Method(self.calls, name).remote(*args) or "on its way")

    waited, killed = [], []
    monkeypatch.setattr(group_module.ray, "get", lambda ref, timeout: waited.append(timeout) or ref == "on its way")
    monkeypatch.setattr(group_module.ray, "kill", lambda actor, no_restart: killed.append(actor))

    def halt(silent_ranks, relay_says):
        waited.clear(), killed.clear()
        members = _members([(WORKER, "node-a"), (WORKER, "node-b")])
        members[0].actor = Chief()
        fake = _group(MirroredShape(), members, watch=types.SimpleNamespace(silent_ranks=set(silent_ranks)))
        uploading = WorkerGroup.halt(fake, relay_says)
        assert ("halt", ()) in members[0].actor.calls and not members[1].actor.calls  # the chief is told, always
        return uploading, members

    uploading, members = halt(silent_ranks=set(), relay_says=False)  # its own answer: an upload is on its way
    assert uploading and waited == [group_module.HALT_ANSWER_S] and killed == [members[1].actor]
    uploading, members = halt(silent_ranks={0}, relay_says=False)
    assert not uploading and waited == [] and killed == []
    uploading, members = halt(silent_ranks={0}, relay_says=True)
    assert uploading and waited == [] and killed == [members[1].actor]
    uploading, members = halt(silent_ranks={1}, relay_says=False)  # another member's silence: the chief answers
    assert uploading and waited == [group_module.HALT_ANSWER_S]


def test_survivors_are_kept_for_the_next_attempt_on_bundles_of_their_nodes_and_the_lost_start_anew(monkeypatch):
    """As an attempt ends, every member still there is asked to recycle; those that did are taken
    from the group (its shutdown kills only the members it holds) and handed their own bundles at
    the next start, or a bundle on their node where the group was placed anew. A lost or silent
    member is not asked, one that cannot recycle is left to the kill, and the run's end kills
    every kept process."""
    from raytf._internal.driver import survivors

    answers, killed = {}, []

    class Ref:
        def __init__(self, actor, timeout_s):
            self.actor, self.timeout_s = actor, timeout_s

    class Recycling(_Actor):
        def __getattr__(self, name):
            if name == "recycle":
                return types.SimpleNamespace(remote=lambda timeout_s: Ref(self, timeout_s))
            return super().__getattr__(name)

    def get(ref, timeout=None):
        answer = answers[ref.actor]
        if isinstance(answer, Exception):
            raise answer
        return answer

    fake_ray = types.SimpleNamespace(
        wait=lambda refs, num_returns, timeout: ([r for r in refs if answers[r.actor] != "silent"], []),
        get=get, kill=lambda actor, no_restart: killed.append(actor))
    monkeypatch.setattr(survivors, "ray", fake_ray)

    def group_of(n, phases=None, silent=()):
        members = _members([(WORKER, "node-a")] * n)
        for m in members:
            m.actor = Recycling()
        watch = types.SimpleNamespace(phases=phases or dict.fromkeys(range(n), Phase.TRAINING),
                                      silent_ranks=set(silent))
        return _group(MirroredShape(), members, watch=watch, restarting=True)

    keep = survivors.Survivors(stop_timeout_s=3.0)
    group = group_of(6, phases={0: Phase.TRAINING, 1: Phase.LOST, 2: Phase.FAILED, 3: Phase.TRAINING,
                                4: Phase.TRAINING}, silent={4})
    actors = [m.actor for m in group.members]
    answers.update({actors[0]: None, actors[2]: None, actors[3]: "its train_fn did not end within 3 s"})
    keep.before_shutdown(group)
    # Asked: every member but the lost one (1), the silent one (4) and one never heard from (5).
    assert [m.actor is None for m in group.members] == [True, False, True, False, False, False]
    assert killed == []  # the group's shutdown kills members 1, 3, 4 and 5

    # The next attempt on the same placement group: bundles 0 and 2 get their processes back.
    new = _members([(WORKER, "node-a")] * 6)
    handed = [keep.actor_for(group, m) for m in new]
    assert handed == [(actors[0], {}), None, (actors[2], {}), None, None, None]
    # The attempt's start-up timing says so, once StartupTiming has it.
    assert keep.after_poll(group, GroupStatus()) == GroupStatus()
    assert keep.after_poll(group, GroupStatus(startup={"total": 9.0})).startup == {"total": 9.0, "kept_processes": 2}
    keep.after_start(group)
    assert killed == []  # nothing left over

    # Kept again, then the group is placed anew (a node was lost, the group shrank): a CPU worker,
    # outside the placement group, takes a new bundle on its own node (whatever its index), a GPU
    # worker died with the old group's bundle and is killed, and a CPU worker whose node has no
    # bundle of the new group is killed once the attempt started.
    gpu_worker = RoleSpec("worker", 1, 4, {"CPU": 1, "GPU": 1})
    members = _members([(WORKER, "node-a"), (WORKER, "node-b"), (gpu_worker, "node-a"), (WORKER, "node-c")])
    for m in members:
        m.actor = Recycling()
    group = _group(MirroredShape(), members, restarting=True, watch=types.SimpleNamespace(
        phases=dict.fromkeys(range(4), Phase.TRAINING), silent_ranks=set()))
    on_a, on_b, gpu, on_c = [m.actor for m in members]
    answers.update({on_a: None, on_b: None, gpu: None, on_c: RuntimeError("actor died")})
    keep.before_start(group, attempt=2)
    keep.before_shutdown(group)
    assert [m.actor is None for m in group.members] == [True, True, True, False]
    keep.before_start(group, attempt=3)
    keep.after_placement(group)
    assert killed == [gpu]
    group.bundle_nodes = lambda: {0: "node-b", 1: "node-d", 2: "node-a"}
    new = _members([(WORKER, "node-b"), (WORKER, "node-d"), (WORKER, "node-a")])
    assert [keep.actor_for(group, m) for m in new] == [(on_b, {}), None, (on_a, {})]
    keep.after_start(group)
    assert killed == [gpu]  # both CPU workers were handed a bundle

    # An attempt whose start failed (no watch yet) keeps every process that answers; the run's end
    # (its last shutdown) keeps none, and kills what is still kept and waits for it to be gone.
    group = group_of(3)
    group.watch = None
    answers.update({group.members[0].actor: None, group.members[1].actor: "silent", group.members[2].actor: None})
    group.members[2].address = None  # its actor never reserved its port (the start timed out): not asked
    keep.before_shutdown(group)
    assert [m.actor is None for m in group.members] == [True, False, False]
    group = group_of(2)
    answers.update({m.actor: None for m in group.members})
    keep.before_shutdown(group)
    waited = []
    monkeypatch.setattr(survivors, "kill_and_wait", lambda actors, what: waited.extend(actors))
    keep.on_close(group)
    assert len(waited) == 3 and all(m.actor is None for m in group.members)
    group = group_of(2)
    keep.before_shutdown(group)
    assert all(m.actor is not None for m in group.members)
    # Nor does an attempt's shutdown when no attempt follows it (the policy said no retry).
    keep = survivors.Survivors(stop_timeout_s=3.0)
    group = group_of(2)
    group.restarting = False
    answers.update({m.actor: None for m in group.members})
    keep.before_shutdown(group)
    assert all(m.actor is not None for m in group.members)


def test_a_parameter_server_restart_keeps_its_workers_each_as_its_own_task_on_a_bundle_of_its_node(monkeypatch):
    """A parameter-server group's restart keeps the workers that still serve (not the chief or the
    parameter servers, which start anew); each kept server serves as the task it was, so a group
    placed anew gives each kept task a bundle on its process's node, swapping the workers'
    bundles, and a kept worker whose node has none left removes its shard files and is killed."""
    from raytf._internal.driver import survivors

    killed, closed = [], []

    class Serving(_Actor):
        def __getattr__(self, name):
            if name == "recycle":
                return types.SimpleNamespace(remote=lambda timeout_s: ("kept", self))
            if name == "close":
                return types.SimpleNamespace(remote=lambda: closed.append(self) or ("closed", self))
            return super().__getattr__(name)

    monkeypatch.setattr(survivors, "ray", types.SimpleNamespace(
        wait=lambda refs, num_returns, timeout: (list(refs), []), get=lambda ref, timeout=None: None,
        kill=lambda actor, no_restart: killed.append(actor)))
    monkeypatch.setattr(survivors, "ask_each", lambda actors, method, timeout_s: [getattr(a, method).remote() for a in actors])
    chief, ps = RoleSpec("chief", 1, 1, {"CPU": 1}), RoleSpec("ps", 1, 1, {"CPU": 1})
    shape = ParameterServerShape()
    members = _members([(chief, "node-c"), (WORKER, "node-a"), (WORKER, "node-b"), (WORKER, "node-b"), (ps, "node-p")])
    for m in members:
        m.actor = Serving()
    w0, w1, w2 = (m.actor for m in members[1:4])
    members[3].generation = 1  # worker 2 replaced a lost one during the attempt, in the placement group
    group = _group(shape, members, restarting=True, watch=types.SimpleNamespace(
        phases={0: Phase.TRAINING, 1: Phase.TRAINING, 2: Phase.TRAINING, 3: Phase.TRAINING, 4: Phase.LOST},
        silent_ranks=set()))
    keep = survivors.Survivors(stop_timeout_s=3.0)
    keep.before_shutdown(group)  # the ps was lost: the group restarts
    assert [m.actor is None for m in members] == [False, True, True, True, False]  # the workers kept

    # Placed anew: the workers' bundles 1, 2, 3 landed on nodes b, a, d (node b has one bundle now).
    keep.before_start(group, attempt=1)
    keep.after_placement(group)
    assert closed == [w2] and killed == [w2]  # the replacement ended with the old placement group
    group.bundle_nodes = lambda: {0: "node-c", 1: "node-b", 2: "node-a", 3: "node-d", 4: "node-p"}
    new = [types.SimpleNamespace(role=role, task=task, bundle=bundle) for bundle, (role, task) in
           enumerate([(chief, 0), (WORKER, 0), (WORKER, 1), (WORKER, 2), (ps, 0)])]
    keep.arrange(group, new)
    # Worker 0 (node a) takes bundle 2, worker 1 (node b) bundle 1, worker 2 the bundle left.
    assert [m.bundle for m in new] == [0, 2, 1, 3, 4]
    handed = [keep.actor_for(group, m) for m in new]
    assert handed == [None, (w0, {}), (w1, {}), None, None]
    keep.after_start(group)
    assert closed == [w2] and killed == [w2]  # nothing else was left over
    # The same placement group again: each kept worker its own bundle, as its own task only.
    group.members = [Member(role, task, bundle, actor=Serving(), address=WorkerAddress(node, "10.0.0.1", 5000 + bundle))
                     for bundle, (role, task, node) in enumerate([(chief, 0, "node-c"), (WORKER, 0, "node-a"),
                                                                 (WORKER, 1, "node-b"), (ps, 0, "node-p")])]
    group.watch = types.SimpleNamespace(phases=dict.fromkeys(range(4), Phase.TRAINING), silent_ranks=set())
    kept_0 = group.members[1].actor
    keep.before_start(group, attempt=2)
    keep.before_shutdown(group)
    keep.before_start(group, attempt=3)
    swapped = [types.SimpleNamespace(role=WORKER, task=1, bundle=1), types.SimpleNamespace(role=WORKER, task=0, bundle=2)]
    keep.arrange(group, swapped)  # not placed anew: nothing moves
    assert [keep.actor_for(group, m) for m in swapped] == [None, None]  # a task's bundle, but another task's process
    assert keep.actor_for(group, types.SimpleNamespace(role=WORKER, task=0, bundle=1)) == (kept_0, {})


def test_a_floating_groups_cpu_workers_run_outside_the_placement_group_on_their_bundles_nodes(monkeypatch):
    """With Survivors (floats_workers), a CPU-only training worker holds no resources of its own and
    is pinned to its bundle's node, so that it can outlive the placement group; a GPU worker, a
    parameter-server group's tasks, and any worker of a group without such a callback hold their
    bundles."""
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy, PlacementGroupSchedulingStrategy

    from raytf._internal.driver import group as group_module
    from raytf._internal.driver.group import WorkerGroup
    from raytf._internal.driver.survivors import Survivors

    made = {}
    monkeypatch.setattr(group_module, "new_worker", lambda run_name, name, **options: made.setdefault(name, options))
    gpu_worker, ps = RoleSpec("worker", 1, 4, {"CPU": 1, "GPU": 1}), RoleSpec("ps", 1, 1, {"CPU": 1})

    def new_actors(shape, roles, callbacks):
        made.clear()
        members = _members([(role, "node-x") for role in roles])
        fake = _group(shape, members, _callbacks=callbacks, _pg=object(), _attempt=0,
                      run=types.SimpleNamespace(run_name="r"), bundle_nodes=lambda: {0: "a" * 56, 1: "b" * 56})
        fake._floats = lambda member: WorkerGroup._floats(fake, member)
        for m in members:
            WorkerGroup._new_actor(fake, m)
        return list(made.values())

    cpu, gpu = new_actors(MirroredShape(), [WORKER, gpu_worker], [Survivors()])
    assert cpu["num_cpus"] == 0 and "num_gpus" not in cpu and "resources" not in cpu
    assert isinstance(cpu["scheduling_strategy"], NodeAffinitySchedulingStrategy)
    assert cpu["scheduling_strategy"].node_id == "a" * 56 and cpu["scheduling_strategy"].soft is False
    assert gpu["num_gpus"] == 1 and isinstance(gpu["scheduling_strategy"], PlacementGroupSchedulingStrategy)
    assert gpu["scheduling_strategy"].placement_group_bundle_index == 1
    # A user's own resource (a node label) the bundle reserves; a device Ray assigns by id the actor holds.
    labelled = RoleSpec("worker", 1, 4, {"CPU": 1, "scale": 1})
    [floating] = new_actors(MirroredShape(), [labelled], [Survivors()])
    assert floating["num_cpus"] == 0 and isinstance(floating["scheduling_strategy"], NodeAffinitySchedulingStrategy)
    from raytf._internal.driver.actors import floats

    assert not floats({"CPU": 1, "TPU": 4}) and not floats({"CPU": 1, "neuron_cores": 2})
    [held] = new_actors(MirroredShape(), [WORKER], [])
    assert held["num_cpus"] == 1 and isinstance(held["scheduling_strategy"], PlacementGroupSchedulingStrategy)
    # A parameter-server group's workers (the role its restarts keep) float too; its chief and
    # parameter servers, which every restart starts anew, keep their bundles.
    chief = RoleSpec("chief", 1, 1, {"CPU": 1})
    kept, *anew = new_actors(ParameterServerShape(), [WORKER, chief, ps], [Survivors()])
    assert kept["num_cpus"] == 0 and isinstance(kept["scheduling_strategy"], NodeAffinitySchedulingStrategy)
    assert all(isinstance(o["scheduling_strategy"], PlacementGroupSchedulingStrategy) for o in anew)
    # A worker's replacement made while the attempt trains takes its bundle, wherever Ray places it
    # anew (its node may be the one just lost).
    made.clear()
    fake = _group(ParameterServerShape(), [], _callbacks=[Survivors()], _pg=object(), _attempt=0,
                  run=types.SimpleNamespace(run_name="r"), bundle_nodes=lambda: {0: "a" * 56})
    fake._floats = lambda member: WorkerGroup._floats(fake, member)
    WorkerGroup._new_actor(fake, Member(WORKER, 0, 0, generation=1))
    [replacement] = made.values()
    assert isinstance(replacement["scheduling_strategy"], PlacementGroupSchedulingStrategy)

"""The rule that keeps the suite's time, kept by the suite itself: each integration file starts at
most the TrainWorker processes its budget below allows (standbys included), or the run fails.

What the suite's minutes are made of is those processes: each one's start (the process, Ray's
worker, TensorFlow's import) is several CPU-seconds on a 2-core machine, whatever the test then
does (docs/contributing.md, the suite's time). A file's budget does not depend on the machine's
speed: it is what its runs are, groups and restarts, every restart counted cold (every kept record
until restarts kept their survivors had that count, file by file, at every hour of the machine).
A restart that keeps the ranks that outlived its attempt (FailureConfig.keep_survivors) starts
fewer, so a file's count is now at most its budget: below it where its restarts kept their
survivors, which a loaded machine may give up (a train_fn that did not end in time); a run that can
restart once more on a loaded machine (its docstring says when) has that restart in its budget. So a change that starts more is a
change of the tests, seen at once, on any machine, in any run of the file: the assertions it adds
belong in a shared run that already trains what they need. Where no shared run can show it, raise
the file's budget here in the same commit, and say why in the test's docstring.

tests/conftest.py counts each file's starts from the session cluster's actor table, before its
first test and after its last; a file with a test rerun after a crash (``--reruns``) is not
checked, its count holding the crashed attempt's processes too.
"""

from __future__ import annotations

WORKER_STARTS = {  # file, under tests/ -> the TrainWorker processes its tests may start
    "integration/test_checkpoints.py": 5,  # a kill during a save and a driver's resume: 3; a kill after an S3 commit: 2
    "integration/test_communication.py": 8,  # four runs of two workers, one per all-reduce option
    "integration/test_data.py": 2,  # one run of two workers over every dataset, part by part
    "integration/test_docs_examples.py": 5,  # two Ray Tune trials; three recipes of one worker
    "integration/test_exactly_once.py": 13,  # the files run through a drain, a shrink and a SIGTERM: 7; tf-keras fit: 6
    # three GPU workers and their standbys, a cold worker for the standby that cannot take its GPUs,
    # and the retry's own three standbys (a GPU group's standbys start with each attempt)
    "integration/test_gpu_nodes.py": 10,
    "integration/test_hostile.py": 4,  # two workers, restarted once (max_failures=1): any rank's checkpoint kept
    "integration/test_keras.py": 13,  # both Keras paths, killed and resumed: 8; float16: 4; bfloat16: 1
    "integration/test_launch.py": 12,  # the two tutorials: 4 each; TF_CONFIG per rank: 2; a stopped launch: 2
    # moved worker 9, or 12 where its group restarts once more (its docstring), lost and preempted 8,
    # each point of a step 8, fit 5
    "integration/test_parameter_server.py": 33,
    "integration/test_ray_train_compat.py": 7,  # three examples of two workers, one of one
    "integration/test_recovery.py": 6,  # a run with one kill and one with none, two workers each
    "integration/test_reliability.py": 10,  # an idle rank retried: 4; fit's shard, a collective timeout, a second driver: 2 each
    "integration/test_scale.py": 38,  # 8 + 6 + 8 ranks of the MWMS run, 7 + 2 + 7 tasks of the PS run
    "integration/test_trainer.py": 27,  # warm standbys 12, a worker lost each way 8, three runs of two, Ctrl-C 1
}


def over_budget(starts: dict[str, int], budget: dict[str, int] = WORKER_STARTS) -> list[str]:
    """For each file of ``starts`` (its path under tests/ -> the TrainWorker processes its tests
    started) that started more than ``budget`` allows, or started any without a budget, what it
    started and what to do; [] where every file kept to its budget."""
    said = []
    for path, count in sorted(starts.items()):
        allowed = budget.get(path)
        if allowed is None and count:
            said.append(f"tests/{path} started {count} TrainWorker process{'es' if count != 1 else ''} and has "
                        f"no budget in tests/budget.py")
        elif allowed is not None and count > allowed:
            said.append(f"tests/{path} started {count} TrainWorker processes, {count - allowed} more than its "
                        f"budget of {allowed} (tests/budget.py)")
    if said:
        said.append("Each worker process is seconds of the suite's CPU (docs/contributing.md, the suite's time): "
                    "add the new assertions to a shared run that already trains what they need; where no shared "
                    "run can show it, raise the file's budget in tests/budget.py in the same commit and say why "
                    "in the test's docstring.")
    return said

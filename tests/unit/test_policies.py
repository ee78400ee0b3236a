"""The policies the docs show (docs/examples/policies.py), run through raytf's controller and
placement tries: no Ray, the controller's fake clock."""

import importlib.util
import math
import pathlib

import pytest

from raytf import FailureConfig, TrainingFailedError
from raytf._internal.driver.controller import Controller, Finished
from raytf._internal.driver.failure import FailureBook
from raytf._internal.driver.scaling import ElasticPolicy
from raytf._internal.protocol import GroupStatus
from tests.unit.test_controller import Clock, FakeGroup, failure

EXAMPLES = pathlib.Path(__file__).resolve().parents[2] / "docs" / "examples"


def example(name):
    """docs/examples/<name>.py as a module."""
    spec = importlib.util.spec_from_file_location(f"raytf_docs_{name}", EXAMPLES / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_guides_back_off_policy_waits_longer_before_each_restart_and_keeps_the_defaults_otherwise():
    policies = example("policies")
    lost = GroupStatus(failures=(failure(rank=1, kind="died"),))
    group = FakeGroup({0: [lost], 1: [lost], 2: [lost], 3: [GroupStatus(finished=True)]})
    clock, starts = Clock(), []
    start = group.start
    group.start = lambda attempt, resume: (starts.append(clock.now), start(attempt, resume))
    controller = Controller(group, FailureBook(policies.failure_config), lambda r: None, poll_interval_s=0.5,
                            failure_grace_s=0.0, sleep=clock.sleep, clock=clock)
    assert isinstance(controller.run(), Finished)
    gaps = [b - a for a, b in zip(starts, starts[1:])]
    # 10 * 2 ** counted seconds after the 1st, 2nd and 3rd loss (each attempt's one poll adds 0.5 s at most).
    assert [round(g) for g in gaps] == [20, 40, 80], gaps
    # What the defaults decide stays theirs: train_fn's exception is raised, naming the setting.
    book = FailureBook(policies.failure_config)
    with pytest.raises(TrainingFailedError, match="Not retried: FailureConfig.retry_on_exception=False"):
        group = FakeGroup({0: [GroupStatus(failures=(failure(rank=0, kind="exception"),))]})
        Controller(group, book, lambda r: None, failure_grace_s=0.0, sleep=lambda s: None).run()
    assert FailureBook(FailureConfig(max_failures=5)).decide(failure(kind="died")).delay_s == 0.0  # the default: none


def test_the_guides_scaling_policy_takes_what_fits_at_once_and_never_grows():
    from raytf._internal.driver.growth import growth_hold_s

    policies = example("policies")
    policy = policies.scaling.policy
    named = "TakeWhatFits.placement_tries"
    tries = ElasticPolicy(2, 8, 120.0, 60.0, policy=policy).tries()
    assert tries == [(8, 1.0, named), (7, 1.0, named), (6, 1.0, named), (5, 1.0, named), (4, 1.0, named),
                     (3, 1.0, named), (2, None, named)]
    assert ElasticPolicy.shrunk(6, tries[0]) == "8 workers could not be placed within 1 s " \
                                                "(TakeWhatFits.placement_tries); training with 6"
    assert growth_hold_s(policy, [], 5.0) == math.inf

"""Survivors: the ranks that outlived an attempt train the next one in their own processes
(``FailureConfig.keep_survivors``).

A restart used to end every worker and start the group anew, so a restart after one rank's loss
cost as many TensorFlow imports as the group has workers, on nodes that had them loaded. Now, as
an attempt of a MultiWorkerMirroredStrategy group ends, every member that still answers is asked to
``recycle`` (worker/recycle.py: its ``train_fn`` stopped, its collectives aborted, TensorFlow's
eager context new) instead of being killed. The placement group is kept across attempts while its
nodes stay, so when the next attempt reuses it, each kept process is handed its own bundle back,
as a warm standby would be, and only the lost ranks start cold: a restart's imports no longer grow
with the group. A process that cannot be recycled (its ``train_fn`` does not end once its
collectives fail, an asynchronous checkpoint still uploading) is killed as before; a new
placement group (the group shrank or grew, a node went away) kills the kept ones, since a process
cannot move to another group's bundle. On by default for CPU workers; for GPU workers where asked.
"""

from __future__ import annotations

import dataclasses
import logging
from typing import Any, Optional

import ray

from raytf._internal.driver.actors import kill_and_wait
from raytf._internal.driver.callbacks import GroupCallback
from raytf._internal.driver.members import GroupView, Member
from raytf._internal.driver.relay import first_line
from raytf._internal.protocol import GroupStatus, Phase

logger = logging.getLogger(__name__)

STOP_TIMEOUT_S = 3.0  # how long a survivor's train_fn gets to end once its collectives are aborted
_ANSWER_MARGIN_S = 5.0  # on top of it, for the recycle call's answer


class Survivors(GroupCallback):
    """Keeps the members that outlive an attempt for the next one, on their own bundles."""

    keeps_placement = True

    def __init__(self, stop_timeout_s: float = STOP_TIMEOUT_S):
        self._stop_timeout_s = stop_timeout_s
        self._kept: dict[int, Any] = {}  # bundle index -> a recycled actor waiting for it
        self._closing = False
        self.handed = 0  # members this attempt started on a kept process

    def before_start(self, group: GroupView, attempt: int) -> None:
        self.handed = 0

    def after_poll(self, group: GroupView, status: GroupStatus) -> GroupStatus:
        if status.startup is None or self.handed == 0:  # StartupTiming's, once per attempt
            return status
        return dataclasses.replace(status, startup={**status.startup, "kept_processes": self.handed})

    def before_shutdown(self, group: GroupView) -> None:
        watch = group.watch
        if self._closing or watch is None:  # the run's end, or an attempt that never started
            return
        # Asked: the training members that answered this attempt's polls and are neither lost nor silent.
        asked = [
            (member, member.actor.recycle.remote(self._stop_timeout_s))
            for index, member in enumerate(group.members)
            if member.actor is not None
            and member.role.name == group.shape.train_role
            and watch.phases.get(index, Phase.LOST) != Phase.LOST
            and index not in watch.silent_ranks
        ]
        if not asked:
            return
        refs = [ref for _, ref in asked]
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=self._stop_timeout_s + _ANSWER_MARGIN_S)
        for member, ref in asked:
            why = "no answer" if ref not in ready else _answer(ref)
            if why is None:
                self._kept[member.bundle] = member.actor
                member.actor = None  # spared: the group's shutdown kills only the members it still holds
            else:
                logger.info("%s is not kept for the next attempt: %s", member.label, why)

    def after_placement(self, group: GroupView) -> None:
        self._drop()  # a new placement group: the kept processes' bundles are gone with the old one

    def actor_for(self, group: GroupView, member: Member) -> Optional[tuple[Any, dict]]:
        actor = self._kept.pop(member.bundle, None) if member.role.name == group.shape.train_role else None
        if actor is None:
            return None
        self.handed += 1
        return actor, {}

    def after_start(self, group: GroupView) -> None:
        self._drop()  # any not handed a bundle

    def on_close(self, group: GroupView) -> None:
        self._closing = True  # the run's end: its last shutdown kills every member
        kept, self._kept = list(self._kept.values()), {}
        if kept:  # gone, as every member is, when fit() returns
            kill_and_wait(kept, "kept worker")

    def _drop(self) -> None:
        kept, self._kept = list(self._kept.values()), {}
        for actor in kept:
            ray.kill(actor, no_restart=True)


def _answer(ref: Any) -> Optional[str]:
    """A recycle call's answer: None (kept) or why not; a call that failed is its error."""
    try:
        return ray.get(ref, timeout=0)
    except Exception as error:  # noqa: BLE001 - a dead actor, or one whose recycle raised: not kept
        return f"{type(error).__name__}: {first_line(error)}"

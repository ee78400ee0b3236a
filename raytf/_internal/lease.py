"""One driver at a time per run: a lease in ``<storage>/<name>/lease/``.

Two drivers running one run would both write its checkpoints and index and
leave weights from one under the other's names, checksums and all. Ray's
actor names cannot stop that (each ``ray.init()`` namespace has its own), and
two clusters may share one bucket, so the run's storage holds the lease.

The protocol needs neither rename nor conditional writes, so it is the same
on a local disk, NFS and an object store (S3, GCS):

1. A driver writes its own *claim*, ``lease/<token>.json``: a name no one else
   writes, so no write ever overwrites another driver's.
2. It lists ``lease/``. If any other claim is live, it deletes its own and
   refuses, naming the holder (host, pid, start time). Claims that expired
   (not renewed for ``ttl_s``) or whose driver is known dead (same machine,
   process gone) are deleted and ignored.
3. If its own claim is the only live one, it holds the lease, and renews the
   claim every ``ttl_s / 4`` while it runs; it deletes it when it ends.

Two drivers starting at once cannot both hold it: each writes before it
lists, so the one that lists second sees the other's claim (storage with
read-after-write and list-after-write consistency, as local disks, S3 and
GCS give). Both may refuse; neither proceeds wrongly. A driver that dies
without cleaning up holds the run until its claim expires, or not at all when
the next driver runs on the same machine and sees the process is gone.

Fencing: a holder that was frozen past ``ttl_s`` (a suspended VM) may have
lost the lease to another driver. It checks before every commit
(:meth:`RunLease.check`), and a worker checks its driver's claim before it
uploads a checkpoint (:func:`holds`), so at most an upload already in flight
when the freeze ended can land, and never over a committed checkpoint.
"""

from __future__ import annotations

import datetime
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import asdict, dataclass
from typing import Callable, Optional

import pyarrow.fs as pafs

from raytf._internal import storage as _storage
from raytf.errors import RunInUseError

logger = logging.getLogger(__name__)

LEASE_DIR = "lease"
DEFAULT_TTL_S = 60.0


def _machine_id() -> str:
    """This kernel's boot and pid namespace: equal ids mean pids can be checked from here."""
    try:
        with open("/proc/sys/kernel/random/boot_id") as f:
            boot = f.read().strip()
        return f"{boot}/{os.stat('/proc/self/ns/pid').st_ino}"
    except OSError:
        return ""  # not Linux: pids are never compared, claims just expire


def _process_start(pid: int) -> str:
    """The start time of a process in clock ticks since boot (Linux), so a reused pid is told apart."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[19]
    except (OSError, IndexError):
        return ""


@dataclass(frozen=True)
class Claim:
    """One driver's claim on a run, as stored in ``lease/<token>.json``."""

    token: str
    host: str
    pid: int
    started: str  # ISO time the driver took the lease, for people
    renewed: float  # unix time of the last renewal (the holder's clock)
    ttl_s: float
    machine: str = ""
    process_start: str = ""

    def describe(self, now: float) -> str:
        age = max(0.0, now - self.renewed)
        return (
            f"host {self.host}, pid {self.pid}, started {self.started}; renewed {age:.0f} s ago, "
            f"expires in {max(0.0, self.ttl_s - age):.0f} s unless renewed"
        )


def _claim_of(raw: object) -> Optional[Claim]:
    try:
        return Claim(**raw)  # type: ignore[arg-type]
    except TypeError:
        return None


_released: set[str] = set()  # the tokens of the leases this process released


def _released_here(claim: Claim) -> bool:
    """A claim this very process wrote and released (its file outlived the release)."""
    return claim.token in _released and claim.pid == os.getpid() and claim.host == socket.gethostname()


def is_dead(claim: Claim, now: float) -> bool:
    """Expired (not renewed within its TTL), or its driver's process is gone from this machine."""
    if now - claim.renewed > claim.ttl_s:
        return True
    if claim.machine and claim.machine == _machine_id():
        start = _process_start(claim.pid)
        return not start or (bool(claim.process_start) and start != claim.process_start)
    return False


def _read_claims(fs: pafs.FileSystem, directory: str) -> dict[str, Optional[Claim]]:
    """Every claim file in ``directory`` (path -> claim, None when unreadable)."""
    claims: dict[str, Optional[Claim]] = {}
    for info in fs.get_file_info(pafs.FileSelector(directory, allow_not_found=True)):
        if info.type != pafs.FileType.File or not info.base_name.endswith(".json"):
            continue
        try:
            claims[info.path] = _claim_of(_storage.read_json(fs, info.path))
        except (OSError, ValueError):
            claims[info.path] = None  # vanished or half-written: judged by the next look
    return claims


def claim_path(fs: pafs.FileSystem, run_root: str, token: str) -> str:
    return _storage.join(fs, run_root, LEASE_DIR, f"{token}.json")


def holds(fs: pafs.FileSystem, run_root: str, token: str, now: Optional[float] = None) -> bool:
    """Whether the driver with ``token`` still holds the run's lease (its claim is there and live)."""
    path = claim_path(fs, run_root, token)
    try:
        claim = _claim_of(_storage.read_json(fs, path))
    except (OSError, ValueError):
        return False
    return claim is not None and not is_dead(claim, time.time() if now is None else now)


class RunLease:
    """This driver's lease on one run. ``acquire`` before anything is written; ``release`` at the end."""

    def __init__(
        self,
        fs: pafs.FileSystem,
        run_root: str,
        run_name: str,
        *,
        ttl_s: float = DEFAULT_TTL_S,
        clock: Callable[[], float] = time.time,
        monotonic: Callable[[], float] = time.monotonic,
    ):
        self._fs = fs
        self._dir = _storage.join(fs, run_root, LEASE_DIR)
        self._run_name = run_name
        self._clock = clock
        self._monotonic = monotonic
        self.ttl_s = ttl_s
        self.token = uuid.uuid4().hex
        self._path = claim_path(fs, run_root, self.token)
        self._started = datetime.datetime.now().astimezone().isoformat(timespec="seconds")
        self._renewed_at: Optional[float] = None  # monotonic time of the last good renewal
        self._lost: Optional[str] = None
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None

    def _write_claim(self) -> None:
        claim = Claim(
            token=self.token,
            host=socket.gethostname(),
            pid=os.getpid(),
            started=self._started,
            renewed=self._clock(),
            ttl_s=self.ttl_s,
            machine=_machine_id(),
            process_start=_process_start(os.getpid()),
        )
        before = self._monotonic()
        _storage.write_json(self._fs, self._path, asdict(claim))
        self._renewed_at = before

    def _live_others(self) -> list[Claim]:
        """Other drivers' live claims; dead ones are deleted on the way."""
        now = self._clock()
        live = []
        for path, claim in _read_claims(self._fs, self._dir).items():
            if path == self._path or (claim is not None and claim.token == self.token):
                continue
            if claim is None:
                continue  # unreadable now; a holder's next renewal rewrites it whole
            if is_dead(claim, now) or _released_here(claim):
                logger.info("removing the expired lease claim of %s", claim.describe(now))
                try:
                    self._fs.delete_file(path)
                except OSError:
                    pass  # another driver removed it first
                continue
            live.append(claim)
        return live

    def acquire(self) -> None:
        """Take the run, or raise RunInUseError naming the driver that holds it."""
        self._fs.create_dir(self._dir, recursive=True)
        self._write_claim()
        others = self._live_others()
        if others:
            self._delete_claim()
            now = self._clock()
            holders = "; ".join(c.describe(now) for c in sorted(others, key=lambda c: c.renewed))
            raise RunInUseError(
                f"run {self._run_name!r} is in use by another driver ({holders}). Two drivers on one "
                "run would overwrite each other's checkpoints. Wait for it to finish, stop it, or pick "
                "another RunConfig.name; a driver that died frees the run when its claim expires "
                f"({self.ttl_s:g} s after its last renewal, RAYTF_LEASE_TTL_S) or at once when the next "
                "driver runs on the same machine"
            )
        self._thread = threading.Thread(target=self._renew_loop, name="raytf-lease", daemon=True)
        self._thread.start()

    def _renew_loop(self) -> None:
        while not self._stop.wait(self.ttl_s / 4):
            try:
                self.renew()
            except RunInUseError as error:
                logger.error("%s", error)
                return
            except OSError as error:  # storage unreachable for a moment: try again next round
                logger.warning("could not renew the lease of run %r: %s", self._run_name, error)

    def renew(self) -> None:
        """Rewrite this driver's claim; raise RunInUseError if the lease was lost meanwhile."""
        if self._lost is None:
            overdue = self._renewed_at is None or self._monotonic() - self._renewed_at > self.ttl_s
            if overdue:
                self._lost = (
                    f"this driver did not renew its lease on run {self._run_name!r} for over "
                    f"{self.ttl_s:g} s (was it suspended?), so another driver may have taken the run over"
                )
            elif not _storage.exists(self._fs, self._path):
                self._lost = f"this driver's lease claim on run {self._run_name!r} was removed by another driver"
            else:
                self._write_claim()
        if self._lost is not None:
            raise RunInUseError(f"{self._lost}; stopping without writing anything more to the run")

    def ensure_held(self) -> None:
        """Raise RunInUseError once the renewing thread found the lease lost (no I/O)."""
        if self._lost is not None:
            raise RunInUseError(f"{self._lost}; stopping without writing anything more to the run")

    def check(self) -> None:
        """Before a commit: raise RunInUseError unless this driver surely still holds the run.

        Renews first when the last renewal is more than half a TTL old; a
        storage error then is tolerated while the claim is still within its TTL.
        """
        self.ensure_held()
        if self._renewed_at is not None and self._monotonic() - self._renewed_at < self.ttl_s / 2:
            return
        try:
            self.renew()
        except OSError:
            if self._renewed_at is None or self._monotonic() - self._renewed_at > self.ttl_s:
                raise

    def _delete_claim(self) -> None:
        try:
            self._fs.delete_file(self._path)
        except OSError:
            pass

    def release(self) -> None:
        """Stop renewing and delete the claim (when this driver still holds it). Storage that no
        longer takes a delete (read-only, full) may keep the claim file: this process knows it
        released it, so its own next driver is not refused by it (:func:`_released_here`)."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=10)
        _released.add(self.token)
        if self._lost is None:
            self._delete_claim()

"""The chief's asynchronous checkpoints on their way to storage (``CheckpointConfig(upload="async")``).

``raytf.report`` snapshots the checkpoint into host memory (checkpoint/snapshot.py), hands it to
:class:`Uploads` and returns; a background thread uploads it, sends the report again with the
uploaded checkpoint, and waits for the driver's commit. One checkpoint is in flight at a time
(:data:`MAX_IN_FLIGHT`): a report with a checkpoint made while the previous one is still on its way
waits for that one's commit first, so host memory holds one snapshot at a time and the index never
falls more than one checkpoint behind. A failure is never silent: an upload that fails is tried
again (``saver.UPLOAD_TRIES``, 3 tries in all, sync uploads too); what still fails, or a commit the driver refuses, is raised by
the next ``raytf.report`` and, at the latest, when ``train_fn`` returns, which fails the worker so
that the run restarts from the last committed checkpoint.
"""

from __future__ import annotations

import logging
import threading
from typing import Callable, Optional

from raytf._internal.checkpoint.saver import retried
from raytf.errors import CheckpointError

logger = logging.getLogger(__name__)

MAX_IN_FLIGHT = 1


class Uploads:
    """The asynchronous checkpoint in flight, and the first failure of one, to raise in the training thread."""

    def __init__(self) -> None:
        self._thread: Optional[threading.Thread] = None
        self._failure: Optional[str] = None

    def start(
        self, name: str, upload: Callable[[], None], commit: Callable[[], Optional[str]], cleanup: Callable[[], None]
    ) -> None:
        """In the background: ``upload()`` (tried again on ``OSError``), then ``commit()``, which
        returns why the driver refused the checkpoint, or None; ``cleanup()`` in every case."""
        self.wait()  # MAX_IN_FLIGHT: the previous checkpoint's commit first
        self.raise_failure()

        def run() -> None:
            try:
                retried(name, upload)
                refused = commit()
                if refused is not None:
                    self._fail(f"checkpoint {name} was not committed: {refused}")
            except Exception as error:  # noqa: BLE001 - raised in the training thread (raise_failure)
                self._fail(f"checkpoint {name} was not uploaded: {type(error).__name__}: {error}")
            finally:
                cleanup()

        self._thread = threading.Thread(target=run, name=f"raytf-upload-{name}", daemon=True)
        self._thread.start()

    def _fail(self, why: str) -> None:
        logger.error("raytf: %s", why)
        if self._failure is None:
            self._failure = why

    def in_flight(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def wait(self) -> None:
        """Wait for the checkpoint in flight to be committed (or to fail)."""
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def raise_failure(self) -> None:
        if self._failure is not None:
            raise CheckpointError(
                f"raytf.report: an asynchronous {self._failure}; the run's last committed "
                "checkpoint is intact, and a restart resumes from it"
            )

"""``Checkpoint.from_state`` written in the background: an asynchronous report's pause is a host
copy of the state, not its serialization.

``raytf.report`` (``CheckpointConfig(upload="async")``) asks every object the checkpoint saves for
a copy of its state in host memory, as TensorFlow's own asynchronous checkpoint does
(``tf.train.CheckpointOptions(experimental_enable_async_checkpoint=True)``), then returns; the
upload's background thread writes the ``tf.train.Checkpoint`` files from those copies while
training goes on (snapshot.ready), then uploads them. TensorFlow keeps such a copy consistent: a host variable's copy shares its buffer and the
next update of the variable writes into a fresh one (copy on write: that step pays one copy of
the variable's bytes), and a variable that sparse updates put in copy-on-read mode (an embedding
table) is copied when read (about 0.1 s per GiB here, inside ``report``). A GPU variable's copy
is a device-to-host transfer made before ``report`` returns.

TensorFlow's helper itself is not used: it keeps one host copy per variable for the life of the
process (the state's size, held for good) and traces its copy into a ``tf.function``, which
Keras 3's variables refuse on the second checkpoint (they create a variable in their copy). raytf
makes fresh copies per checkpoint, eagerly, and drops them once the files are written.

The files are written by this process (``CheckpointOptions(experimental_io_device=...)``, its
CPU), wherever the variables live: left to itself TensorFlow runs each save on the variables'
own task, so a parameter server on another node would write its part into a directory that only
exists on the chief's node, and the merge would miss it. A parameter server's part reaches the
chief over the cluster's gRPC, each server's at once.

Every rank makes the copy (reading a variable that synchronizes on read runs a collective under
MultiWorkerMirroredStrategy, which every rank must join); only the rank whose files are kept
writes them. The copies are plain host variables, so writing runs no collective.

A copy into host pages the process has never touched pays for faulting each one in: on the lent
H100 virtual machine 0.7-0.9 s per GiB of GPU state against 0.09 s into memory used before, here
0.73 s against 0.10-0.13 s per GiB for a table in copy-on-read mode (docs/benchmarks/
checkpoints.md). Where TensorFlow's host allocator keeps the memory it frees (seen on one 2-CPU
machine; on another of the same kind, every copy mapped its pages anew), every checkpoint after the
first reuses it, and :func:`prewarm` (opt-in: ``RAYTF_PREWARM_HOST_COPIES=1``) makes the first one
do so too, by having TensorFlow fill memory of the sizes the copies will take.
"""

from __future__ import annotations

import logging
import os
from typing import Any, Optional

from raytf._internal import env as _env
from raytf._internal import hooks as _hooks
from raytf._internal.background import Background
from raytf._internal.hooks import tensorflow as _tf_hooks

logger = logging.getLogger(__name__)

_checked = False
_warned: set[str] = set()
PREWARM_MIN_BYTES = 64 << 20  # below it the first copy's new pages cost milliseconds: nothing to warm
_prewarmed: set[tuple[int, ...]] = set()  # the sizes warmed in this process


class HostCopy:
    """The state of a ``Checkpoint.from_state`` at report time, in host memory."""

    def __init__(self, checkpoint: Any, copies: Any):
        self._checkpoint = checkpoint  # the tf.train.Checkpoint of the user's objects
        self._copies = copies
        self._device = this_cpu()  # a new thread has no default device: a ps chief's must be its own
        distinct = {id(copy): copy for copy in copies.values()}  # one copy may stand for two objects
        self.nbytes = sum(_nbytes(copy) for copy in distinct.values())

    def write(self, prefix: str) -> None:
        import tensorflow as tf

        with tf.device(self._device):
            _tf_hooks.write_copies(self._checkpoint, self._copies, prefix, save_options(self._device))

    def release(self) -> None:
        self._checkpoint = self._copies = None


def host_copy(trackables: dict[str, Any]) -> Optional[HostCopy]:
    """A host copy of ``trackables``' state, or None where one of them cannot copy itself (the
    checkpoint is then written before ``report`` returns, with a warning once)."""
    import tensorflow as tf

    global _checked
    if not _checked:  # a TensorFlow whose private names moved fails here, naming them
        _hooks.require("tensorflow.host_copies")
        _checked = True
    checkpoint = tf.train.Checkpoint(**trackables)
    try:
        copies = _tf_hooks.host_copies(checkpoint, this_cpu())
    except NotImplementedError as error:
        if str(error) not in _warned:
            _warned.add(str(error))
            logger.warning("raytf: %s; its checkpoints are written before raytf.report returns", error)
        return None
    return HostCopy(checkpoint, copies)


def prewarm(trackables: dict[str, Any]) -> Optional[Background]:
    """With ``RAYTF_PREWARM_HOST_COPIES=1``: have TensorFlow's host allocator hold memory already
    mapped for the host copy of ``trackables``' state (what ``Checkpoint.from_state(**trackables)``
    saves), so that the first asynchronous report's copy pauses training no longer than the later
    ones, where the allocator keeps what it frees (module docstring).

    For every variable a host tensor of its bytes is filled by TensorFlow's own ``Fill`` op on this
    process's CPU (from a thread of the lowest priority; the fill itself runs on TensorFlow's
    pool), and all of them are dropped together. Returns the background work, or None where there
    is nothing to do: the setting off, a state under ``PREWARM_MIN_BYTES``, or one of sizes warmed
    before in this process. A failure (no memory to spare, a state it cannot size) is logged, never
    raised: the first checkpoint then only pays for its pages."""
    import tensorflow as tf

    if os.environ.get(_env.PREWARM_HOST_COPIES, "") != "1":
        return None
    try:
        checkpoint = tf.train.Checkpoint(**trackables)
        sizes = tuple(sorted(n for n in map(_nbytes, _tf_hooks.saveables(checkpoint)) if n))
    except Exception as error:  # noqa: BLE001 - training goes on; only the first copy is slower
        logger.warning("raytf: could not size the state to set host memory aside for its first copy: %s", error)
        return None
    if sum(sizes) < PREWARM_MIN_BYTES or sizes in _prewarmed:
        return None
    _prewarmed.add(sizes)
    return Background(lambda: _fault_in(sizes, this_cpu()), "raytf-prewarm", low_priority=True)


def _fault_in(sizes: tuple[int, ...], device: str) -> None:
    import tensorflow as tf

    held = []
    try:
        with tf.device(device):
            for nbytes in sizes:
                held.append(tf.fill([nbytes], tf.constant(0, tf.uint8)))  # every page written by TensorFlow
    except Exception as error:  # noqa: BLE001 - a checkpoint that pays for its pages is still a checkpoint
        logger.warning(
            "raytf: could not set aside host memory for the first checkpoint's copy (%s); "
            "it will pause training while its pages are mapped",
            error,
        )
    del held  # together: an allocator that keeps freed memory keeps each block for a copy of its size


def _nbytes(variable: Any) -> int:
    """A variable's bytes: TensorFlow's (a TensorShape, a DType) or Keras 3's (a tuple, a name)."""
    import tensorflow as tf

    shape, dtype = getattr(variable, "shape", None), getattr(variable, "dtype", None)
    try:
        elements = tf.TensorShape(shape).num_elements()
        return int(elements) * tf.as_dtype(dtype).size if elements is not None else 0
    except (TypeError, ValueError):  # not a variable: not counted
        return 0


def this_cpu() -> str:
    """This process's CPU as TensorFlow names it here (``/job:chief/replica:0/task:0/device:CPU:0``
    on a parameter-server chief, ``/job:localhost/...`` alone)."""
    import tensorflow as tf

    device = tf.DeviceSpec.from_string(tf.constant(0).device)
    return device.replace(device_type="CPU", device_index=0).to_string()


def save_options(device: Optional[str] = None) -> Any:
    """Checkpoint options that write every file from this process (see the module docstring)."""
    import tensorflow as tf

    return tf.train.CheckpointOptions(experimental_io_device=device or this_cpu())

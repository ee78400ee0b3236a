"""TensorFlow's eager context, which raytf resets to keep a worker's process for the next attempt:
aborting the collectives a lost peer left waiting, and a new context for a new cluster.

An eager context joins one TensorFlow cluster for good (its server, its collective executor).
TensorFlow's own MultiWorkerMirroredStrategy tests take a process into a new cluster by aborting
its collectives (``Context.abort_collective_ops``: "you need to reset_context() to use collectives
again") and making a new context (``context._reset_context``); raytf does the same between
attempts, so a rank that outlived its peer's loss trains the next attempt in its own process
(driver/survivors.py). The old context's server is left running (TensorFlow cannot stop one), on
the port the last attempt used.

See the package docstring of ``raytf._internal.hooks``.
"""

from __future__ import annotations


from raytf._internal.hooks._hook import Hook, once_a_process, run_check_script


def abort_collectives(message: str) -> None:
    """Fail every collective of this process's eager context now, and every later one, with
    ``message`` (a ``train_fn`` waiting in an all-reduce for a lost peer raises at once)."""
    import tensorflow as tf
    from tensorflow.python.eager import context

    context.context().abort_collective_ops(tf.errors.UNAVAILABLE, message)


def reset_context() -> None:
    """A new eager context for this process, joined to no cluster: the next strategy built here
    connects to the cluster its TF_CONFIG names, as in a new process."""
    from tensorflow.python.eager import context

    context._reset_context()  # noqa: SLF001


def _probe() -> None:
    from tensorflow.python.eager import context

    assert callable(getattr(context, "_reset_context", None)), "context._reset_context"
    assert callable(getattr(context.Context, "abort_collective_ops", None)), "Context.abort_collective_ops"


# Two processes form a MultiWorkerMirroredStrategy cluster and all-reduce; the peer exits; the
# first aborts its collectives (one more all-reduce fails), resets its context, joins a new cluster
# with a new peer on new ports, and all-reduces and trains a mirrored variable there. Prints "ok".
# A peer says "ready" once TensorFlow is imported and then reads the cluster: the ports are chosen
# only then, milliseconds before the servers bind them, so that no other process on a busy machine
# (a Ray worker's outgoing connection) takes one in between and leaves a server waiting for ever.
_PEER_SCRIPT = """
import json, os, sys
import tensorflow as tf
print("ready", flush=True)
os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": json.loads(sys.stdin.readline())}, "task": {"type": "worker", "index": 1}})
strategy = tf.distribute.MultiWorkerMirroredStrategy()
print(float(strategy.reduce("SUM", strategy.run(lambda: tf.constant(2.0)), axis=None)), flush=True)
if sys.argv[1] == "live":
    with strategy.scope():
        v = tf.Variable(1.0)
    strategy.run(lambda: v.assign_add(1.0))
    print(float(strategy.reduce("SUM", strategy.run(lambda: tf.constant(2.0)), axis=None)), float(v.numpy()), flush=True)
os._exit(0)
"""

_REGROUP_SCRIPT = """
import json, os, socket, subprocess, sys
import tensorflow as tf
from raytf._internal.hooks.tensorflow.eager import abort_collectives, reset_context
peer_script = sys.argv[1]

def ports(n):
    held = [socket.socket() for _ in range(n)]
    for s in held:
        s.bind(("127.0.0.1", 0))
    found = [f"127.0.0.1:{s.getsockname()[1]}" for s in held]
    for s in held:
        s.close()
    return found

def join(mode):
    peer = subprocess.Popen([sys.executable, "-c", peer_script, mode], stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    assert peer.stdout.readline().strip() == "ready", "the peer did not start"
    cluster = ports(2)
    peer.stdin.write(json.dumps(cluster) + "\\n")
    peer.stdin.flush()
    os.environ["TF_CONFIG"] = json.dumps({"cluster": {"worker": cluster}, "task": {"type": "worker", "index": 0}})
    return peer, tf.distribute.MultiWorkerMirroredStrategy()

def all_reduce(strategy, value):
    return float(strategy.reduce("SUM", strategy.run(lambda: tf.constant(value)), axis=None))

peer, strategy = join("die")
assert all_reduce(strategy, 1.0) == 3.0, "the first cluster's all-reduce"
peer.wait()
abort_collectives("the peer is gone")
try:
    all_reduce(strategy, 1.0)
    raise AssertionError("a collective ran after abort_collectives")
except tf.errors.OpError:
    pass
del strategy
reset_context()
peer, strategy = join("live")
assert all_reduce(strategy, 1.0) == 3.0, "the new cluster's all-reduce"
with strategy.scope():
    v = tf.Variable(1.0)
strategy.run(lambda: v.assign_add(1.0))
assert all_reduce(strategy, 1.0) == 3.0 and float(v.numpy()) == 2.0, "the new cluster's variable"
out, _ = peer.communicate(timeout=120)
assert out.split()[-2:] == ["3.0", "2.0"], out
print("ok", flush=True)
os._exit(0)
"""


@once_a_process  # two hooks' checks
def _behaves() -> None:
    run_check_script(_REGROUP_SCRIPT, _PEER_SCRIPT)


HOOKS = [
    Hook(
        "tensorflow.abort_collectives",
        "tensorflow",
        "tensorflow.python.eager.context.Context.abort_collective_ops",
        "keeping a rank's process for the next attempt (a train_fn waiting on a lost peer ends at once)",
        "FailureConfig.keep_survivors",
        _probe,
        behaves=_behaves,
        in_processes=True,
        optional=True,
    ),
    Hook(
        "tensorflow.reset_context",
        "tensorflow",
        "tensorflow.python.eager.context._reset_context",
        "keeping a rank's process for the next attempt (its TensorFlow joins the new cluster)",
        "FailureConfig.keep_survivors",
        _probe,
        behaves=_behaves,
        in_processes=True,
        optional=True,
    ),
]

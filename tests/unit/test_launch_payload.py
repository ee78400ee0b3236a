"""What a launched script's end means to the driver: a real subprocess, no Ray."""

import json
import sys

import pytest
from ray import cloudpickle

from raytf._internal.protocol import Phase, RankInfo, RunSpec, WorkerSpec
from raytf._internal.worker.payloads import ScriptFailed, SubprocessPayload
from raytf.errors import FailureKind


class Host:
    node_ip = "127.0.0.1"

    def __init__(self):
        self.phases, self.released = [], False

    def set_phase(self, phase):
        self.phases.append(phase)

    def wait_for_go(self):
        pass

    def release_port(self):
        self.released = True

    def sink(self, report):
        pass

    def preempt_requested(self):
        return False


def run(code):
    spec = RunSpec(run_name="r", run_path="/tmp/r", payload=cloudpickle.dumps([sys.executable, "-c", code]),
                   communication="ring", collective_timeout_s=None, intra_op_threads=1, inter_op_threads=1,
                   use_gpu=False)
    worker = WorkerSpec(role="worker", rank=RankInfo(0, 2, 0, 2, 0, 1),
                        tf_config=json.dumps({"cluster": {"worker": ["a:1", "a:2"]}, "task": {"type": "worker", "index": 0}}),
                        attempt=0)
    host = Host()
    SubprocessPayload().run(spec, worker, host)
    return host


def test_a_script_that_succeeds_started_after_the_barrier_with_the_port_released():
    host = run("import os, json; assert json.loads(os.environ['TF_CONFIG'])['task']['index'] == 0")
    assert host.phases == [Phase.READY, Phase.CONNECTING, Phase.TRAINING] and host.released


@pytest.mark.parametrize("code, kind, exit_code", [
    ("import sys; sys.exit(3)", FailureKind.EXCEPTION, 3),
    ("import os, signal; os.kill(os.getpid(), signal.SIGKILL)", FailureKind.DIED, -9),
    ("import sys; sys.stderr.write('E0000 grpc_server.cc] bind: Address already in use\\n'); sys.exit(1)",
     FailureKind.PORT_TAKEN, 1),
])
def test_how_a_script_ended_says_how_the_driver_takes_it(code, kind, exit_code):
    with pytest.raises(ScriptFailed) as failed:
        run(code)
    assert (failed.value.kind, failed.value.exit_code) == (kind, exit_code)

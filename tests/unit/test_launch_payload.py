"""What a launched script's end means to the driver: a real subprocess, no Ray."""

import json
import sys

import pytest
from ray import cloudpickle

from raytf._internal.protocol import Phase, RankInfo, RunSpec, TensorflowSettings, UserCode, WorkerSpec
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

    def halted(self):
        return False


def run(code):
    spec = RunSpec(run_name="r", run_path="/tmp/r", payload=cloudpickle.dumps(UserCode(command=(sys.executable, "-c", code))),
                   tensorflow=TensorflowSettings(communication="ring", collective_timeout_s=None, intra_op_threads=1,
                                                 inter_op_threads=1, use_gpu=False))
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
    # raytf's handover lost: gRPC could not add the port raytf released (a:1, this task's entry).
    ("import sys; sys.stderr.write(\"E0000 add_port.cc:83] Failed to add port to server: No address added out of "
     "total 1 resolved for '0.0.0.0:1'\\nE0000 Could not start gRPC server\\n\"); sys.exit(1)",
     FailureKind.PORT_TAKEN, 1),
    # The script's own server on a port of its own: a bug, not a race; counted like any failure.
    ("import sys; sys.stderr.write(\"E0000 add_port.cc:83] Failed to add port to server: No address added out of "
     "total 1 resolved for '0.0.0.0:18080'\\nOSError: bind(): Address already in use\\n\"); sys.exit(1)",
     FailureKind.EXCEPTION, 1),
    ("import sys; sys.stderr.write('Address already in use\\n'); sys.exit(1)", FailureKind.EXCEPTION, 1),
])
def test_how_a_script_ended_says_how_the_driver_takes_it(code, kind, exit_code):
    with pytest.raises(ScriptFailed) as failed:
        run(code)
    assert (failed.value.kind, failed.value.exit_code) == (kind, exit_code)


def test_a_bind_error_naming_no_port_is_a_race_only_while_the_handed_port_is_taken():
    import socket

    from raytf._internal.worker.payloads import handed_port, lost_port_race

    with socket.socket() as taken:
        taken.bind(("0.0.0.0", 0))
        taken.listen()
        port = taken.getsockname()[1]
        assert lost_port_race("E0000 Could not start gRPC server", port)
    assert not lost_port_race("E0000 Could not start gRPC server", port)  # free again: not ours
    assert not lost_port_race("ValueError: bad", port)
    config = json.dumps({"cluster": {"chief": ["h:7"], "ps": ["h:8", "[::1]:9"]}, "task": {"type": "ps", "index": 1}})
    assert handed_port(config) == 9 and handed_port("{}") is None

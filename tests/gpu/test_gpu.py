"""raytf on real GPUs. Deselected by default (CI has no GPU); on a machine with NVIDIA GPUs and
TensorFlow's CUDA libraries (``pip install -e ".[gpu,test]"``):

    python -m pytest -m gpu tests/gpu

One GPU is enough: each worker gets a GPU of its own, so the runs use min(2, GPUs) workers.
"""

from __future__ import annotations

import json

import pytest

import raytf
from tests import workloads

pytestmark = pytest.mark.gpu


def _run(tmp_path, name: str, workers: int, **failure) -> raytf.Result:
    return raytf.Trainer(
        workloads.gpu_train, config={"out_dir": str(tmp_path), **failure.pop("config", {})},
        scaling=raytf.ScalingConfig(num_workers=workers, gpus_per_worker=1, cpus_per_worker=1),
        run=raytf.RunConfig(name=name, storage_path=str(tmp_path / "results"), verbose=0,
                            failure_config=raytf.FailureConfig(**failure)),
        tensorflow=raytf.TensorflowConfig(keras="tf_keras"),  # communication "auto": NCCL on GPUs
    ).fit()


def _seen(tmp_path, attempt: int, rank: int) -> dict:
    return json.loads((tmp_path / f"gpu_attempt{attempt}_rank{rank}.json").read_text())


def test_each_worker_trains_on_its_own_gpu_and_all_reduces_with_nccl(gpus, tmp_path):
    workers = min(2, gpus)
    result = _run(tmp_path, "gpu-nccl", workers)
    assert result.metrics["loss"] < result.history[0]["loss"]  # it learns
    seen = [_seen(tmp_path, 0, r) for r in range(workers)]
    for s in seen:
        assert s["implementation"] == "NCCL", s
        assert len(s["gpus"]) == 1 and len(s["logical_gpus"]) == 1, s  # its own GPU, and only it
        assert s["cuda_visible_devices"] == ",".join(s["ray_gpu_ids"]), s
        assert all("GPU:0" in d for d in s["worker_devices"]) and "GPU:0" in s["kernel_device"], s
        # The sum over ranks of (rank + 1) x ones(2^20), in every element.
        assert s["all_reduce"] == [workers * (workers + 1) / 2] * 2, s
    assert len({s["cuda_visible_devices"] for s in seen}) == workers  # no GPU shared


def test_a_warm_standby_takes_the_gpu_of_the_worker_it_replaces(gpus, tmp_path):
    """FailureConfig(warm_standby=True) on GPUs: the last rank kills its process in the first
    attempt; the retry runs in a standby that held no GPU until then, on that same GPU."""
    workers = min(2, gpus)
    result = _run(tmp_path, "gpu-warm", workers, max_failures=1, warm_standby=True,
                  config={"die_after_s": 15})
    assert result.attempts == 2
    for rank in range(workers):
        before, after = _seen(tmp_path, 0, rank), _seen(tmp_path, 1, rank)
        assert ":standby:" in after["actor"] and after["ray_gpu_ids"] == [], after
        assert len(after["logical_gpus"]) == 1 and "GPU:0" in after["kernel_device"], after
        assert after["all_reduce"] == before["all_reduce"], (before, after)
    assert sorted(_seen(tmp_path, 1, r)["cuda_visible_devices"] for r in range(workers)) == sorted(
        _seen(tmp_path, 0, r)["cuda_visible_devices"] for r in range(workers))

"""The second hostile round (issue 21), on the session's Ray cluster: what a hostile or unlucky user
does, and what raytf must then do instead of dropping data, training half of it, or hanging."""

from __future__ import annotations

import os

import pytest

import raytf
from tests import workloads

pytestmark = pytest.mark.integration


def test_a_second_run_of_one_name_in_one_driver_is_refused_by_name(cluster, tmp_path, no_leaks):
    import ray

    @ray.remote(num_cpus=0)
    class Holder:
        def ping(self) -> bool:
            return True

    # What a run of the same name training at the same time holds: its first worker's name.
    holder = Holder.options(name="raytf:clash:0:0").remote()
    ray.get(holder.ping.remote())
    try:
        trainer = raytf.Trainer(workloads.small_train, config={"out_dir": str(tmp_path)},
                                scaling=raytf.ScalingConfig(num_workers=2),
                                run=raytf.RunConfig(name="clash", storage_path=str(tmp_path / "other"), verbose=0))
        with pytest.raises(raytf.ConfigError) as info:
            trainer.fit()
        assert "another run named 'clash'" in str(info.value) and "RunConfig.name" in str(info.value)
    finally:
        ray.kill(holder)


@pytest.mark.parametrize("rows, fragment", [(0, "has 0 row(s), fewer than the 2 workers"), (1, "has 1 row(s)")])
def test_a_parameter_server_run_on_too_few_rows_says_so_before_anything_starts(cluster, tmp_path, rows, fragment):
    import re

    import ray

    data = ray.data.from_items([{"x": [0.0, 1.0], "y": 0}] * rows).materialize()
    trainer = raytf.ParameterServerTrainer(
        workloads.ps_custom_loop, config={"out_dir": str(tmp_path)}, datasets={"train": data},
        scaling=raytf.ParameterServerScaling(num_workers=2, num_ps=1),
        run=raytf.RunConfig(name=f"ps-rows-{rows}", storage_path=str(tmp_path / "runs"), verbose=0))
    with pytest.raises(raytf.ConfigError, match=re.escape(f"ParameterServerTrainer(datasets={{'train': ...}}) {fragment}")):
        trainer.fit()



def test_ray_train_reports_keep_a_checkpoint_any_rank_passes_with_every_ranks_files_merged(cluster, tmp_path, no_leaks):
    import json

    from raytf.train import FailureConfig, RunConfig, ScalingConfig, TensorflowTrainer

    result = TensorflowTrainer(
        workloads.per_rank_checkpoints, train_loop_config={"out_dir": str(tmp_path)},
        scaling_config=ScalingConfig(num_workers=2),
        run_config=RunConfig(name="per-rank", storage_path=str(tmp_path / "runs"),
                             failure_config=FailureConfig(max_failures=1)),
    ).fit()
    committed = [(h["epoch"], h.get("checkpoint")) for h in result.history if "rank" in h]
    # Epoch 0: rank 1 alone passed one, and it was committed; epoch 1: both ranks' files in one.
    assert [epoch for epoch, _ in committed] == [0, 1] and all(name for _, name in committed)
    assert result.attempts == 2 and result.checkpoint.epoch == 1
    first = tmp_path / "runs" / "per-rank" / "checkpoints" / committed[0][1]
    assert sorted(os.listdir(first)) == [".raytf_manifest.json", "rank1.txt"]
    for rank in range(2):
        restored = json.loads((tmp_path / f"restored{rank}.json").read_text())
        assert restored["epoch"] == 1
        assert restored["contents"] == {"rank0.txt": "rank 0 epoch 1", "rank1.txt": "rank 1 epoch 1"}
    local = result.checkpoint.to_directory()
    assert sorted(os.listdir(local)) == ["rank0.txt", "rank1.txt"]  # the user's files only


def test_ranks_files_merge_on_an_object_store_too(s3_filesystem, tmp_path):
    from raytf._internal.checkpoint.files import verify
    from tests.unit.test_checkpoint import _share, merged_parts

    manager, on_report, acks, _ = merged_parts(s3_filesystem, "raytf-test/merge", tmp_path)
    on_report(_share(s3_filesystem, manager, tmp_path, 0, {"rank0.txt": "zero"}))
    on_report(_share(s3_filesystem, manager, tmp_path, 1, {"rank1.txt": "one"}))
    assert sorted(acks) == [(0, 0, None), (1, 0, None)]
    [entry] = manager.entries
    checkpoint = manager.latest()[1]
    assert verify(s3_filesystem, manager.path_of(entry)) is None
    assert sorted(os.listdir(checkpoint.to_directory())) == ["rank0.txt", "rank1.txt"]

"""The second hostile round (issue 21), on the session's Ray cluster: what a hostile or unlucky user
does, and what raytf must then do instead of dropping data, training half of it, or hanging."""

from __future__ import annotations

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

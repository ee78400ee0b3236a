"""A failure policy and a scaling policy of a user's own (docs/guides/failures.md and
docs/guides/elastic.md include them). They run on the driver and import no Ray: the unit tests run
both through raytf's controller and placement tries (tests/unit/test_policies.py)."""

import raytf


# --8<-- [start:backoff]
class BackOff(raytf.DefaultFailurePolicy):
    """Retry lost workers as the defaults do, waiting longer after each."""

    def decide(self, failure, history):
        decision = super().decide(failure, history)
        if decision.retry and failure.kind in ("died", "unresponsive"):
            return raytf.FailureDecision(retry=True, delay_s=min(10 * 2**history.counted, 300))
        return decision


failure_config = raytf.FailureConfig(max_failures=5, policy=BackOff())
# --8<-- [end:backoff]


# --8<-- [start:take_what_fits]
class TakeWhatFits(raytf.ScalingPolicy):
    """Start with whatever fits at once, largest first, and never grow back."""

    def placement_tries(self, scaling):
        sizes = range(scaling.max_workers, scaling.min_workers, -1)
        return [raytf.PlacementTry(n, 1.0) for n in sizes] + [raytf.PlacementTry(scaling.min_workers, None)]

    def growth_hold_s(self, grown_at, now):
        return float("inf")


scaling = raytf.ScalingConfig(num_workers=(2, 8), policy=TakeWhatFits())
# --8<-- [end:take_what_fits]

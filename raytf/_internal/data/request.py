"""What one ``raytf.get_dataset_shard`` call asks for, and its checks: shared by the reader
(shard.py) and the pipelines that serve it (tfdata.py, tfdata_ps.py)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional, Sequence, Union

from raytf.errors import DatasetShardError

Features = Union[str, Sequence[str], None]


@dataclass(frozen=True)
class ShardRequest:
    name: str
    batch_size: int
    features: Features
    label: Optional[str]
    shuffle: bool
    seed: Optional[int]
    drop_remainder: bool

    def columns(self, available: Sequence[str]) -> tuple[list[str], Optional[str]]:
        """(feature columns, label column), checked against the dataset's columns."""
        if self.features is None:
            features = [c for c in available if c != self.label]
        elif isinstance(self.features, str):
            features = [self.features]
        else:
            features = list(self.features)
        wanted = features + ([self.label] if self.label is not None else [])
        for column in wanted:
            if column not in available:
                raise DatasetShardError(
                    f"raytf.get_dataset_shard({self.name!r}): column {column!r} is not in the "
                    f"dataset; its columns are {', '.join(available)}"
                )
        if not features:
            raise DatasetShardError(f"raytf.get_dataset_shard({self.name!r}): no feature columns left; pass features=")
        return features, self.label


def check_request(request: ShardRequest) -> None:
    b = request.batch_size
    if isinstance(b, bool) or not isinstance(b, int) or b < 1:
        raise DatasetShardError(f"raytf.get_dataset_shard({request.name!r}): batch_size must be an int >= 1, got {b!r}")
    if request.features is not None and not isinstance(request.features, str):
        if not request.features or not all(isinstance(c, str) for c in request.features):
            raise DatasetShardError(
                f"raytf.get_dataset_shard({request.name!r}): features must be a column name or a "
                f"non-empty list of them, got {request.features!r}"
            )


class KeptShardLost(Exception):
    """The object holding a kept shard, or a planned shard's block, is gone (its node went away):
    a loss, retried with a new split."""


def check_rows(dataset: str, rows: int, world_size: int) -> None:
    """An empty shard is an error that says why, not a missing-column error further on."""
    if rows > 0:
        return
    raise DatasetShardError(
        f"raytf.get_dataset_shard({dataset!r}): a worker's shard has no rows: the dataset is empty, "
        f"or has fewer rows than the {world_size} workers it is split across. Pass more data, fewer "
        "workers, or leave it out of DataConfig(datasets_to_split=...) so every worker gets all of it"
    )

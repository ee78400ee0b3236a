"""The ingest pieces that need no cluster: column checks, seeds, tf.data over arrays."""

import numpy as np
import pytest

from raytf import ConfigError, DataConfig, DatasetShardError
from raytf._internal.data.shard import ShardRequest, check_request, shuffle_seed
from raytf._internal.data.split import split_for_ranks
from raytf._internal.data.columns import stack_column
from raytf._internal.data.read_stream import dataset_from_arrays


def request(**kw):
    values = dict(name="train", batch_size=4, features=None, label="y", shuffle=False, seed=None, drop_remainder=False)
    values.update(kw)
    return ShardRequest(**values)


def test_feature_columns_default_to_all_but_the_label_and_are_checked():
    assert request().columns(["a", "b", "y"]) == (["a", "b"], "y")
    assert request(features="b").columns(["a", "b", "y"]) == (["b"], "y")
    assert request(features=["b", "a"], label=None).columns(["a", "b"]) == (["b", "a"], None)
    with pytest.raises(DatasetShardError, match="column 'z' is not in the dataset; its columns are a, y"):
        request(features=["a", "z"]).columns(["a", "y"])
    with pytest.raises(DatasetShardError, match="column 'label' is not in the dataset"):
        request(label="label").columns(["a"])


@pytest.mark.parametrize("bad", [0, -1, 2.0, True, "8"])
def test_batch_size_must_be_a_positive_int(bad):
    with pytest.raises(DatasetShardError, match=f"batch_size must be an int >= 1, got {bad!r}"):
        check_request(request(batch_size=bad))


def test_features_must_name_columns():
    with pytest.raises(DatasetShardError, match="features must be a column name or a non-empty list"):
        check_request(request(features=[]))


def test_columns_of_equal_length_lists_stack_and_ragged_ones_are_named():
    values = np.empty(2, dtype=object)
    values[:] = [np.array([1.0, 2.0]), np.array([3.0, 4.0])]
    assert stack_column("v", "train", values).shape == (2, 2)
    values[:] = [np.array([1.0]), np.array([3.0, 4.0])]
    with pytest.raises(DatasetShardError, match="column 'v' is ragged"):
        stack_column("v", "train", values)
    words = np.array(["a", "b"], dtype=object)
    assert stack_column("w", "train", words) is words


def test_shuffle_seeds_are_stable_and_differ_per_rank_and_call():
    assert shuffle_seed(None, "train", 0, 0) is None
    assert shuffle_seed(7, "train", 0, 0) == shuffle_seed(7, "train", 0, 0)
    assert len({shuffle_seed(7, "train", r, c) for r in range(3) for c in range(3)}) == 9


def epochs(dataset, n=2):
    return [[int(i) for batch in dataset for i in batch[0]["id"].numpy()] for _ in range(n)]


def test_every_row_once_per_epoch_reshuffled_each_epoch_and_reproducible():
    arrays = {"id": np.arange(23), "y": np.arange(23) % 2}
    shuffled = request(features=["id"], shuffle=True)
    run1 = epochs(dataset_from_arrays(arrays, shuffled, 23, seed=11), 3)
    run2 = epochs(dataset_from_arrays(arrays, shuffled, 23, seed=11), 3)
    assert run1 == run2  # same seed, same orders: a rerun sees the same data order
    assert all(sorted(e) == list(range(23)) for e in run1)
    assert run1[0] != run1[1] != run1[2]
    assert epochs(dataset_from_arrays(arrays, shuffled, 23, seed=12), 1)[0] != run1[0]
    plain = epochs(dataset_from_arrays(arrays, request(features=["id"]), 23, seed=None), 2)
    assert plain == [list(range(23))] * 2


def test_a_resumed_shard_shuffles_each_epoch_as_the_uninterrupted_run_did():
    arrays = {"id": np.arange(23), "y": np.arange(23) % 2}
    shuffled = request(features=["id"], shuffle=True)
    uninterrupted = epochs(dataset_from_arrays(arrays, shuffled, 23, seed=11), 4)
    # Resumed after the epoch-1 checkpoint: its first pass is epoch 2.
    resumed = epochs(dataset_from_arrays(arrays, shuffled, 23, seed=11, first_epoch=2), 2)
    assert resumed == uninterrupted[2:]


def test_rows_past_the_agreed_count_and_the_remainder():
    arrays = {"x": np.arange(10, dtype=np.float32), "y": np.arange(10)}
    kept = dataset_from_arrays(arrays, request(features="x"), 9, seed=None)
    assert [int(b[0].shape[0]) for b in kept] == [4, 4, 1]
    dropped = dataset_from_arrays(arrays, request(features="x", drop_remainder=True), 9, seed=None)
    assert [int(b[0].shape[0]) for b in dropped] == [4, 4]
    assert dropped.element_spec[0].shape.as_list() == [4]


def test_shards_are_split_with_each_ranks_node_as_locality_hint():
    class FakeDataset:
        def __init__(self):
            self.calls = []

        def streaming_split(self, n, *, equal, locality_hints):
            self.calls.append((n, equal, locality_hints))
            return [f"split{i}" for i in range(n)]

        def iterator(self):
            self.calls.append("iterator")
            return "whole"

    train, val = FakeDataset(), FakeDataset()
    assert split_for_ranks({"train": train, "val": val}, {"train"}, ["node-b", "node-a"]) == [
        {"train": "split0", "val": "whole"},
        {"train": "split1", "val": "whole"},
    ]
    assert train.calls == [(2, True, ["node-b", "node-a"])]

    # A warm restart: what the last attempt's ranks read, in place of a new split; rank r gets
    # rank r's piece of a split dataset, every rank the one copy of a whole one.
    assert val.calls == ["iterator", "iterator"]
    train.calls.clear(), val.calls.clear()
    kept = {"train": ["kept0", "kept1"], "val": ["kept-whole"]}
    assert split_for_ranks({"train": train, "val": val}, {"train"}, ["node-b", "node-a"], kept) == [
        {"train": "kept0", "val": "kept-whole"},
        {"train": "kept1", "val": "kept-whole"},
    ]
    assert train.calls == [] and val.calls == []


def test_data_config_names_must_be_passed_datasets():
    assert DataConfig()._split(["train", "val"]) == {"train", "val"}
    assert DataConfig(datasets_to_split=["train"])._split(["train", "val"]) == {"train"}
    with pytest.raises(ConfigError, match="names 'test', but Trainer\\(datasets=...\\) has only 'train'"):
        DataConfig(datasets_to_split=["test"])._split(["train"])
    with pytest.raises(ConfigError, match="must be 'all' or a list of dataset names"):
        DataConfig(datasets_to_split="some")


def test_trainer_rejects_datasets_that_are_not_ray_datasets():
    import raytf

    with pytest.raises(ConfigError, match=r"datasets=\{'train': ...\}\) must be a ray.data.Dataset or raytf.data.tfrecord_files / parquet_files, got ndarray"):
        raytf.Trainer(lambda: None, datasets={"train": np.zeros(3)})
    with pytest.raises(ConfigError, match="datasets_to_split names 'val'"):
        raytf.Trainer(lambda: None, datasets={}, data_config=DataConfig(datasets_to_split=["val"]))


@pytest.mark.parametrize("drop, batches", [(False, 3), (True, 2)])
def test_cached_shards_know_their_length(drop, batches):
    arrays = {"x": np.arange(10, dtype=np.float32), "y": np.arange(10)}
    for shuffle in (False, True):
        dataset = dataset_from_arrays(arrays, request(features="x", shuffle=shuffle, drop_remainder=drop), 10, seed=1)
        assert int(dataset.cardinality()) == batches
        assert len(list(dataset)) == batches


def test_a_parameter_server_shard_of_an_empty_lazy_dataset_names_the_cause():
    from raytf import DatasetShardError
    from raytf._internal.data.shard import ShardRequest
    from raytf._internal.data.tfdata_ps import make_shard
    from raytf._internal.data.worker_files import ColumnFiles

    request = ShardRequest("train", 4, "x", "y", False, None, False)
    with pytest.raises(DatasetShardError, match=r"the dataset is empty \(0 rows\)"):
        make_shard(request, [{}, {}], None, 0)
    one = {"x": ColumnFiles("float32", (2,), 1, ("f",)), "y": ColumnFiles("int64", (), 1, ("g",))}
    with pytest.raises(DatasetShardError, match="has 1 row.*fewer than the 2 workers.*ParameterServerScaling"):
        make_shard(request, [one, {}], None, 0)


@pytest.mark.parametrize("dtype, shape", [("float32", (1000, 7)), ("int64", (33,)), ("uint8", (5, 3, 2)),
                                          ("bool", (9,)), ("object", (4,))])
def test_a_cached_column_becomes_a_tensor_over_its_own_memory_where_tensorflow_can_take_it(dtype, shape):
    """Numeric columns gathered into 64-byte aligned arrays become tensors without a copy (a
    worker's cached share of a large dataset is then held once, not three times); the others are
    converted. Either way the tensor holds the values and gathers like any."""
    import numpy as np
    import tensorflow as tf

    from raytf._internal.data.columns import aligned_empty, host_tensor

    array = aligned_empty(shape, dtype)
    array[...] = np.arange(np.prod(shape)).reshape(shape).astype(dtype) if dtype != "object" else b"x"
    tensor = host_tensor(array)
    assert tensor.shape == shape and np.array_equal(tensor.numpy(), array)
    assert np.array_equal(tf.gather(tensor, [0, 2]).numpy(), array[[0, 2]])
    shared = dtype in ("float32", "int64", "uint8")
    assert array.ctypes.data % 64 == 0 or dtype == "object"
    before = tensor.numpy().copy()
    array.flat[0] = array.flat[1] if dtype != "object" else b"y"  # the array's memory is the tensor's, if taken
    assert np.array_equal(tensor.numpy(), array) == shared and (shared or np.array_equal(tensor.numpy(), before))
    unaligned = np.arange(100, dtype="float32")[1:]  # 4 bytes past an aligned start: converted, a copy
    assert np.array_equal(host_tensor(unaligned).numpy(), unaligned)

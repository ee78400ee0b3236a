"""raytf's reaches into TensorFlow's private code (see the package docstring of
``raytf._internal.hooks``), by what they serve: ``distribute.py``, ``eager.py``, ``data.py``,
``checkpoint.py``, ``graph.py``."""

from raytf._internal.hooks.tensorflow import checkpoint, data, distribute, eager, graph
from raytf._internal.hooks.tensorflow.checkpoint import host_copies, saveables, write_copies
from raytf._internal.hooks.tensorflow.data import dataset_functions, dataset_inputs, framework_types, records_at_class
from raytf._internal.hooks.tensorflow.distribute import (
    closures_pending,
    collective_strategy_class,
    coordinator_recovering,
    coordinator_server_def,
    count_batches_taken,
    count_closures_ended,
    devices_listed,
    distributed_original,
    parameter_server_strategy_class,
)
from raytf._internal.hooks.tensorflow.eager import abort_collectives, reset_context
from raytf._internal.hooks.tensorflow.graph import function_autograph, place_beside, resource_writes, run_after

HOOKS = [*distribute.HOOKS, *eager.HOOKS, *data.HOOKS, *checkpoint.HOOKS, *graph.HOOKS]

__all__ = [
    "HOOKS",
    "abort_collectives",
    "closures_pending",
    "collective_strategy_class",
    "coordinator_recovering",
    "coordinator_server_def",
    "count_batches_taken",
    "count_closures_ended",
    "dataset_functions",
    "dataset_inputs",
    "devices_listed",
    "distributed_original",
    "framework_types",
    "function_autograph",
    "host_copies",
    "parameter_server_strategy_class",
    "place_beside",
    "records_at_class",
    "reset_context",
    "resource_writes",
    "run_after",
    "saveables",
    "write_copies",
]

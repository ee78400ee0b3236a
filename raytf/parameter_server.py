"""Parameter-server training: ``tf.distribute.ParameterServerStrategy`` with every role a Ray actor.

A :class:`ParameterServerTrainer` places one chief, ``num_workers`` workers,
``num_ps`` parameter servers and optionally one evaluator, each a Ray actor with
its own resources and a TF_CONFIG that names every task. Workers and ps run
TensorFlow's server; the chief runs ``train_fn`` with the strategy and its
``ClusterCoordinator`` (``raytf.strategy()``, ``raytf.coordinator()``, or
TensorFlow's own constructors, which return the same objects); the evaluator
runs ``evaluate_fn`` on every checkpoint the chief commits.

A lost worker costs no restart: the coordinator reschedules its steps on the
other workers while raytf replaces it at the same task index. A lost chief or
ps restarts the group from the last committed checkpoint; the workers' processes
and their servers serve the next chief (``FailureConfig.keep_survivors``), and
only the chief, the parameter servers and the evaluator start anew.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping, Optional

from raytf._internal.driver import cluster
from raytf._internal.driver.preflight import file_sources, fits, too_few_rows
from raytf._internal.driver.progress import ProgressDisplay
from raytf._internal.protocol import PayloadKind, RoleSpec, RunSpec, UserCode
from raytf._internal.storage import RunStorage
from raytf._internal.validate import check_bool, check_choice, check_int, check_number, check_resources, check_timeout
from raytf.config import PLACEMENT_STRATEGIES, DataConfig, RunConfig, TensorflowConfig
from raytf.errors import ConfigError
from raytf.trainer import Trainer

__all__ = ["ParameterServerScaling", "ParameterServerTrainer"]

ROLES = ("chief", "worker", "ps", "evaluator")


@dataclass(frozen=True)
class ParameterServerScaling:
    """How many tasks of each role, and what each reserves.

    ``num_workers`` workers compute; ``num_ps`` parameter servers hold the
    variables (a large embedding table split across them with
    ``ParameterServerTrainer(variable_partitioner=...)``); one chief runs
    ``train_fn``; ``num_evaluators`` (0 or 1) evaluates committed checkpoints.
    Each role has its own CPUs and GPUs (``cpus_per_ps``, ``gpus_per_worker``,
    ...); ``resources_per_worker`` adds custom resources to the workers, which
    are the ones that usually need special nodes, and ``resources_per_ps`` to
    the parameter servers (nodes with the memory for a large table, say
    ``{"ps_node": 1}``). One placement group holds them all with ``placement``
    as its strategy.
    """

    num_workers: int = 2
    num_ps: int = 1
    num_evaluators: int = 0
    cpus_per_worker: float = 1
    gpus_per_worker: float = 0
    resources_per_worker: Mapping[str, float] = field(default_factory=dict)
    cpus_per_ps: float = 1
    gpus_per_ps: float = 0
    resources_per_ps: Mapping[str, float] = field(default_factory=dict)
    cpus_per_chief: float = 1
    gpus_per_chief: float = 0
    cpus_per_evaluator: float = 1
    gpus_per_evaluator: float = 0
    placement: str = "PACK"
    placement_timeout_s: Optional[float] = 120.0
    check_resources: bool = True

    def __post_init__(self) -> None:
        check_int("ParameterServerScaling.num_workers", self.num_workers, minimum=1, maximum=100_000)
        if isinstance(self.num_ps, int) and not isinstance(self.num_ps, bool) and self.num_ps < 1:
            raise ConfigError(
                f"ParameterServerScaling.num_ps must be at least 1, got {self.num_ps}: parameter-server "
                "training keeps its variables on parameter servers. To train without them, use "
                "raytf.Trainer (MultiWorkerMirroredStrategy)"
            )
        check_int("ParameterServerScaling.num_ps", self.num_ps, minimum=1, maximum=100_000)
        if (
            isinstance(self.num_evaluators, int)
            and not isinstance(self.num_evaluators, bool)
            and self.num_evaluators > 1
        ):
            raise ConfigError(
                f"ParameterServerScaling.num_evaluators must be 0 or 1, got {self.num_evaluators}: TensorFlow's "
                "sidecar evaluator is a single task that evaluates each checkpoint in turn"
            )
        check_int("ParameterServerScaling.num_evaluators", self.num_evaluators, minimum=0, maximum=1)
        for role in ("worker", "ps"):  # the roles with custom resources of their own
            setting = f"resources_per_{role}"
            checked = check_resources(
                f"ParameterServerScaling.{setting}",
                getattr(self, setting),
                cpus=f"cpus_per_{role}",
                gpus=f"gpus_per_{role}",
            )
            object.__setattr__(self, setting, checked)
        for role in ROLES:
            check_number(f"ParameterServerScaling.cpus_per_{role}", getattr(self, f"cpus_per_{role}"))
            gpus = check_number(f"ParameterServerScaling.gpus_per_{role}", getattr(self, f"gpus_per_{role}"))
            if gpus > 1 and gpus != int(gpus):
                raise ConfigError(
                    f"ParameterServerScaling.gpus_per_{role} above 1 must be a whole number, got {gpus!r}"
                )
            if not any(self._bundle(role).values()) and role != "worker":
                raise ConfigError(
                    f"ParameterServerScaling reserves nothing per {role} (cpus_per_{role}=0, "
                    f"gpus_per_{role}=0{', no resources_per_ps' if role == 'ps' else ''}): give it at least one CPU or GPU"
                )
        if not any(self._bundle("worker").values()):
            raise ConfigError(
                "ParameterServerScaling reserves nothing per worker (cpus_per_worker=0, "
                "gpus_per_worker=0, no resources_per_worker): give each at least one CPU or GPU"
            )
        object.__setattr__(
            self,
            "placement",
            check_choice("ParameterServerScaling.placement", self.placement, PLACEMENT_STRATEGIES, upper=True),
        )
        check_timeout("ParameterServerScaling.placement_timeout_s", self.placement_timeout_s)
        check_bool("ParameterServerScaling.check_resources", self.check_resources)

    def _count(self, role: str) -> int:
        return {"chief": 1, "worker": self.num_workers, "ps": self.num_ps, "evaluator": self.num_evaluators}[role]

    def _bundle(self, role: str = "worker") -> dict[str, float]:
        """The placement-group bundle of one task of ``role`` (zero amounts left out, as Ray wants)."""
        bundle = {"CPU": float(getattr(self, f"cpus_per_{role}")), "GPU": float(getattr(self, f"gpus_per_{role}"))}
        if role in ("worker", "ps"):
            bundle.update({k: float(v) for k, v in getattr(self, f"resources_per_{role}").items()})
        return {k: v for k, v in bundle.items() if v > 0}

    @property
    def use_gpu(self) -> bool:
        """Whether any role trains or serves on GPUs (TensorflowConfig checks its options against it)."""
        return any(getattr(self, f"gpus_per_{role}") > 0 for role in ROLES)


class ParameterServerTrainer(Trainer):
    """Runs ``train_fn(config)`` on a parameter-server chief, with workers, parameter servers and
    an optional evaluator as Ray actors (see the module docstring).

    ``variable_partitioner``: how variables are split across the parameter
    servers, a ``tf.distribute.experimental.partitioners`` object such as
    ``MinSizePartitioner(min_shard_bytes=256 << 10, max_shards=num_ps)``, for
    embedding tables larger than one server. ``evaluate_fn(checkpoint,
    config) -> dict``: run by the evaluator on each committed checkpoint
    (newest first when it falls behind); its metrics join ``result.history``
    with ``evaluated_checkpoint`` naming the checkpoint.

    ``hold_updates`` (default True): every update of a counted step waits, on the
    first parameter server, until all of the step's inputs from the worker have
    arrived, and small work a step does after one update to feed another (an EMA)
    runs beside that update, on its parameter server (named in a warning). A
    worker lost while it computes a step's gradients then leaves none of the
    step's updates made. ``False``: TensorFlow's own order (each update as soon as
    its gradient arrives, nothing moved). Either way the step's batch is
    committed only after all of its updates are made, so the bound is the same
    (docs/guides/parameter-servers.md): each lost worker may train at most one
    batch once more, that step's updates partly made; nothing is skipped.
    """

    _payload_kind = PayloadKind.CHIEF
    _scaling_type = ParameterServerScaling
    _warm_standby_works = False
    _role_payloads = {
        "chief": PayloadKind.CHIEF,
        "worker": PayloadKind.SERVER,
        "ps": PayloadKind.SERVER,
        "evaluator": PayloadKind.EVALUATOR,
    }
    _finishing_roles: tuple[str, ...] = ("chief", "evaluator")  # whose end ends the run

    def __init__(
        self,
        train_fn: Callable[..., Any],
        *,
        config: Optional[dict[str, Any]] = None,
        scaling: Optional[ParameterServerScaling] = None,
        run: Optional[RunConfig] = None,
        tensorflow: Optional[TensorflowConfig] = None,
        datasets: Optional[dict[str, Any]] = None,
        data_config: Optional[DataConfig] = None,
        variable_partitioner: Any = None,
        evaluate_fn: Optional[Callable[[Any, dict], dict]] = None,
        hold_updates: bool = True,
    ):
        super().__init__(
            train_fn,
            config=config,
            scaling=scaling,  # type: ignore[arg-type]  # ParameterServerScaling: its _scaling_type
            run=run,
            tensorflow=tensorflow,
            datasets=datasets,
            data_config=data_config,
        )
        if self.tensorflow.gradient_compression is not None:
            raise ConfigError(
                "TensorflowConfig.gradient_compression compresses MultiWorkerMirroredStrategy's all-reduce; "
                "parameter-server workers send their updates to the ps tasks instead: leave it unset here"
            )
        if variable_partitioner is not None and not callable(variable_partitioner):
            raise ConfigError(
                "ParameterServerTrainer(variable_partitioner=...) must be a tf.distribute.experimental.partitioners "
                f"object (or a callable of the same form), got {type(variable_partitioner).__name__}"
            )
        if evaluate_fn is not None and not callable(evaluate_fn):
            raise ConfigError(f"ParameterServerTrainer(evaluate_fn=...) must be callable, got {evaluate_fn!r}")
        if self.scaling.num_evaluators and evaluate_fn is None:
            raise ConfigError(
                "ParameterServerScaling(num_evaluators=1) needs ParameterServerTrainer(evaluate_fn=...), "
                "the function the evaluator runs on each checkpoint"
            )
        if evaluate_fn is not None and not self.scaling.num_evaluators:
            raise ConfigError(
                "ParameterServerTrainer(evaluate_fn=...) is run by the evaluator: set "
                "ParameterServerScaling(num_evaluators=1)"
            )
        if evaluate_fn is not None and self.run.checkpoint_config.num_to_keep == 0:
            raise ConfigError("the evaluator evaluates committed checkpoints; CheckpointConfig keeps none")
        if not isinstance(hold_updates, bool):
            raise ConfigError(f"ParameterServerTrainer(hold_updates=...) must be True or False, got {hold_updates!r}")
        self.variable_partitioner = variable_partitioner
        self.evaluate_fn = evaluate_fn
        self.hold_updates = hold_updates

    def _payload(self) -> bytes:
        from ray import cloudpickle

        try:
            return cloudpickle.dumps(
                UserCode(
                    train_fn=self.train_fn,
                    config=self.config,
                    evaluate_fn=self.evaluate_fn,
                    variable_partitioner=self.variable_partitioner,
                    hold_updates=self.hold_updates,
                )
            )
        except Exception as error:
            raise ConfigError(
                f"ParameterServerTrainer: train_fn, config, variable_partitioner and evaluate_fn must be picklable "
                f"to reach the actors: {error}"
            ) from error

    def _has_evaluator(self) -> bool:
        return bool(self.scaling.num_evaluators)

    def _roles(self) -> list[RoleSpec]:
        return [
            RoleSpec(
                role,
                self.scaling._count(role),
                self.scaling._count(role),
                self.scaling._bundle(role),
                self._role_payloads[role],
            )
            for role in ROLES
            if self.scaling._count(role)
        ]

    def _preflight(self, display: ProgressDisplay) -> None:
        from ray.data.dataset import MaterializedDataset

        for dataset_name in file_sources(self.datasets):
            raise ConfigError(
                f"ParameterServerTrainer(datasets={{{dataset_name!r}: ...}}): file sources are read by raytf.Trainer's "
                "workers; for parameter servers read the files through Ray Data (raytf.data.read_tfrecords, "
                "ray.data.read_parquet)"
            )
        split = self.data_config._split(list(self.datasets))
        for dataset_name, dataset in self.datasets.items():
            if isinstance(dataset, MaterializedDataset):  # its row count is known without running anything
                problem = too_few_rows(
                    dataset_name,
                    dataset.count(),
                    self.scaling.num_workers,
                    dataset_name in split,
                    trainer="ParameterServerTrainer",
                    scaling="ParameterServerScaling",
                )
                if problem:
                    raise ConfigError(problem)
        if not self.scaling.check_resources or cluster.node_types() is not None:
            return  # an autoscaler may add the nodes a role needs
        nodes = cluster.live_node_resources()
        for role in self._roles():
            if any(fits(role.bundle, node) for node in nodes):
                continue
            short = [
                r
                for r, amount in role.bundle.items()
                if max((node.get(r, 0.0) for node in nodes), default=0.0) < amount
            ]
            settings = ", ".join(
                f"ParameterServerScaling.{ {'CPU': 'cpus_per_', 'GPU': 'gpus_per_'}.get(r, 'resources_per_') }"
                f"{role.name}={role.bundle[r]:g} but the largest node has "
                f"{max((node.get(r, 0.0) for node in nodes), default=0.0):g} {r}"
                for r in short
            )
            raise ConfigError(
                f"no node in the cluster can hold a {role.name} task: {settings}. Lower the {role.name}'s ask "
                "(a parameter server rarely needs a GPU) or add a node that fits it; on an autoscaling cluster "
                "whose node types raytf cannot read, pass ParameterServerScaling(check_resources=False)"
            )
        roles = self._roles()
        wanted = {r: sum(role.bundle.get(r, 0.0) * role.max_count for role in roles) for r in ("CPU", "GPU")}
        for resource, amount in wanted.items():
            total = sum(node.get(resource, 0.0) for node in nodes)
            if amount > total:
                asks = ", ".join(
                    f"{role.max_count} {role.name} x {role.bundle.get(resource, 0.0):g}"
                    for role in roles
                    if role.bundle.get(resource)
                )
                raise ConfigError(
                    f"the parameter-server group needs {amount:g} {resource} in all ({asks}) and the cluster has "
                    f"{total:g}: lower ParameterServerScaling's {resource.lower()}s_per_* (the chief, ps and "
                    "evaluator mostly wait; a fraction of a CPU each is enough) or add nodes"
                )

    def _check_storage_is_shared(self, storage: RunStorage) -> None:
        import pyarrow.fs as pafs

        from raytf._internal.driver.preflight import unseen_storage

        if isinstance(storage.filesystem, pafs.LocalFileSystem):  # the chief writes, the evaluator reads
            for role in ("chief", "evaluator"):
                if self.scaling._count(role):
                    problem = unseen_storage(
                        storage.root, cluster.nodes_seeing(storage.root, self.scaling._bundle(role))
                    )
                    if problem:
                        raise ConfigError(problem)

    def _tensorflow_settings(self) -> Any:
        # A server runs the chief's functions and their input pipelines on its inter-op threads, and one
        # function waits on another's result: with a single inter-op thread (raytf's default for one CPU)
        # the first step deadlocks. TensorFlow's own default sizes the pool unless the user set it.
        return dataclasses.replace(
            super()._tensorflow_settings(), inter_op_threads=self.tensorflow.inter_op_threads or 0
        )

    def _make_group(self, run: RunSpec, display: ProgressDisplay) -> Any:
        from raytf._internal.driver.callbacks import DrainWatch, FinishEvaluator, MemoryCopies, StartupTiming
        from raytf._internal.driver.group import WorkerGroup
        from raytf._internal.driver.scaling import ElasticPolicy
        from raytf._internal.driver.shapes import ParameterServerShape
        from raytf._internal.driver.survivors import Survivors

        failures = self.run.failure_config
        workers = self.scaling._count("worker")
        return WorkerGroup(
            run,
            self._roles(),
            ParameterServerShape(finishers=tuple(self._finishing_roles), coordinator_timeout_s=failures.hang_timeout_s),
            placement_strategy=self.scaling.placement,
            elastic=ElasticPolicy(
                workers, workers, self.scaling.placement_timeout_s, 0.0, config="ParameterServerScaling"
            ),
            datasets=self.datasets,
            worker_timeout_s=failures.worker_timeout_s,
            start_timeout_s=failures.start_timeout_s,
            notify=display.message,
            callbacks=[
                StartupTiming(),
                DrainWatch(),
                FinishEvaluator(),
                *([MemoryCopies()] if run.restore_from_memory else []),
                # A restart (a lost chief or ps) keeps the workers' processes and their servers.
                *([Survivors()] if failures._keeps_survivors(gpu_workers=self.scaling.gpus_per_worker > 0) else []),
            ],
        )

    def _group_text(self) -> str:
        return ", ".join(f"{role.max_count} {role.name} x {role.bundle}" for role in self._roles()) + (
            f" ({self.scaling.placement})"
        )

"""The plan's configuration as frozen dataclasses, one per concern, checked where they are built.

``Config`` holds the sections: ``Devices`` (what to plan for), ``Solve`` (how to search),
``Cost`` (profiling), ``Training`` (the step, with ``mode="training"``) and ``Emit`` (the
partitioned model and its checks), with the mode, granularity, dtype, pins and checkpoint. A
value autoplace cannot use raises ``ConfigError`` naming its field (``solve.min_gain``); the
command line names the flag instead (``cli.flags``). Defaults and their reasons:
``docs/api.md``. Layout after torchtitan's job configuration.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from types import MappingProxyType
from typing import TYPE_CHECKING, Literal

from autoplace.config.choices import (
    DType,
    Fsdp,
    Granularity,
    Layers,
    Mode,
    Objective,
    PipelineSchedule,
    Recompute,
    choice,
)
from autoplace.config.defaults import (
    DEFAULT_MAX_NODES,
    DEFAULT_MIN_GAIN,
    DEFAULT_TIME_LIMIT_S,
    MODULE_TIME_LIMIT_S,
)
from autoplace.errors import ConfigError
from autoplace.ir import Cluster

if TYPE_CHECKING:
    from autoplace.profile.cache import ProfileCache
    from autoplace.solve.options import SolveOptions

__all__ = ["Config", "Cost", "Devices", "Emit", "Parallel", "Solve", "Training"]

def _whole(value: object, name: str, *, least: int = 1) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < least:
        raise ConfigError(f"{{{name}}} must be a whole number, {least} or more, got {value!r}")
    return value


@dataclass(frozen=True)
class Devices:
    """The devices to plan for: a ``spec`` (``"2xA100-40GB,1xT4"``, ``"cuda:0,cuda:1"``), a
    ``cluster`` built in Python, or a cluster ``file`` (TOML); none of them: the GPUs found
    here, or the simulated set when there are none (``autoplace.cluster``)."""

    spec: str | None = None
    cluster: Cluster | None = None
    file: str | os.PathLike[str] | None = None

    def __post_init__(self) -> None:
        given = [n for n, v in (("devices.spec", self.spec), ("devices.cluster", self.cluster),
                                ("devices.file", self.file)) if v is not None]
        if len(given) > 1:
            raise ConfigError(f"{{{given[0]}}} and {{{given[1]}}} both name the devices: "
                              "pass one of them, not both")

    def resolve(self) -> tuple[Cluster, list[str]]:
        """The cluster, and the notes of finding it (``cluster.resolve_cluster``)."""
        from autoplace.cluster import resolve_cluster

        return resolve_cluster(spec=self.spec, cluster=self.cluster,
                               cluster_file=None if self.file is None else str(self.file))


@dataclass(frozen=True)
class Solve:
    """How the placement is searched (``autoplace.solve``).

    ``time_limit_s``: the solver's limit, the what-if rows on fewer devices included (``None``:
    10 s; 1 s at module granularity). ``solver``: ``cpsat`` or one heuristic alone.
    ``max_nodes``: the largest graph CP-SAT solves whole (``None``: 120 for a traced model;
    CP-SAT's own limit for a task graph). ``min_gain``: the smallest gain over the best single
    device worth splitting for. ``whatif``: also solve on the first 1, 2, ... devices."""

    time_limit_s: float | None = None
    solver: str = "cpsat"
    objective: Objective = Objective.LATENCY
    contiguous: bool = False
    seed: int = 0
    deterministic: bool = False
    max_nodes: int | None = None
    min_gain: float = DEFAULT_MIN_GAIN
    whatif: bool = True

    def __post_init__(self) -> None:
        from autoplace.solve.registry import SOLVERS

        object.__setattr__(self, "objective", choice(Objective, self.objective, "solve.objective"))
        if self.time_limit_s is not None and not (0 < self.time_limit_s < math.inf):
            raise ConfigError(f"{{solve.time_limit_s}} must be a positive number of seconds, "
                              f"got {self.time_limit_s!r}")
        if self.solver not in SOLVERS:
            raise ConfigError(f"{{solve.solver}} must be one of {', '.join(SOLVERS)}, got "
                              f"{self.solver!r}")
        if self.max_nodes is not None:
            _whole(self.max_nodes, "solve.max_nodes", least=2)
        if not 0 <= self.min_gain < 1:
            raise ConfigError(
                f"{{solve.min_gain}} must be a fraction in [0, 1), got {self.min_gain:g}: it is "
                "the smallest gain over the best single device worth splitting for (0.05: split "
                "only when at least 5% faster; 0: whenever faster)")

    def options(self) -> SolveOptions:
        """The solver's settings (``solve.SolveOptions``)."""
        from autoplace.solve.options import SolveOptions

        return SolveOptions(time_limit_s=self.time_limit_s or DEFAULT_TIME_LIMIT_S,
                            seed=self.seed, deterministic=self.deterministic,
                            objective=self.objective, contiguous=self.contiguous,
                            solver=self.solver, max_nodes=self.max_nodes)


@dataclass(frozen=True)
class Cost:
    """How ops are costed: with ``profile``, measured on the devices that are here and
    calibrated for the others from ``cache`` (``None``: the cache at its documented place);
    otherwise analytic. ``progress`` shows the profiler's progress on stderr. ``tf32``: whether
    float32 matmuls and convolutions run on TF32 tensor cores where a GPU has them
    (``profile.cost.Tf32``; ``None``: as torch's settings say when the plan is made;
    ``dtype="tf32"`` sets it)."""

    profile: bool = False
    cache: ProfileCache | None = None
    progress: bool = False
    tf32: bool | None = None


@dataclass(frozen=True)
class Training:
    """A training step (``mode="training"``): the ``optimizer`` whose state and update are
    planned, the batch cut into ``microbatches`` run in ``schedule``'s order, ``replicas``
    data-parallel replicas (``"auto"``: every count the devices allow, the fastest kept), and
    where activations are recomputed (``recompute``); whether the replicas shard the model
    (``fsdp``: FSDP2, ZeRO-3, ``train.sharded``); how the layers run (``layers``: ``train``,
    dropout on and batch norm updating its statistics, or ``eval``; ``train.layers``).
    ``docs/training.md``."""

    optimizer: str = "adam"
    microbatches: int = 1
    schedule: PipelineSchedule = PipelineSchedule.AUTO
    replicas: int | Literal["auto"] = "auto"
    recompute: Recompute = Recompute.AUTO
    fsdp: Fsdp = Fsdp.AUTO
    layers: Layers = Layers.TRAIN

    def __post_init__(self) -> None:
        from autoplace.train.graph import OPTIMIZERS

        if self.optimizer not in OPTIMIZERS:
            raise ConfigError(f"{{training.optimizer}} must be one of {', '.join(OPTIMIZERS)}, "
                              f"got {self.optimizer!r}")
        _whole(self.microbatches, "training.microbatches")
        if self.replicas != "auto" and (isinstance(self.replicas, bool)
                                        or not isinstance(self.replicas, int)
                                        or self.replicas < 1):
            raise ConfigError(f"{{training.replicas}} must be auto or a whole number, 1 or "
                              f"more, got {self.replicas!r}")
        object.__setattr__(self, "schedule",
                           choice(PipelineSchedule, self.schedule, "training.schedule"))
        object.__setattr__(self, "recompute",
                           choice(Recompute, self.recompute, "training.recompute"))
        object.__setattr__(self, "fsdp", choice(Fsdp, self.fsdp, "training.fsdp"))
        object.__setattr__(self, "layers", choice(Layers, self.layers, "training.layers"))
        if self.schedule != PipelineSchedule.AUTO and self.microbatches == 1:
            raise ConfigError(f"{{training.schedule}} {self.schedule} orders micro-batches: "
                              "add {training.microbatches=M} (M > 1), or leave the schedule "
                              "auto")
        if self.recompute == Recompute.ALL and self.microbatches == 1:
            raise ConfigError("{training.recompute=all} recomputes each micro-batch's forward "
                              "in its backward, which saves memory only with several in "
                              "flight: add {training.microbatches=M} (M > 1)")

    def changed(self) -> list[str]:
        """The fields set away from their defaults (each is for training plans only)."""
        default = Training()
        return [f"training.{n}" for n in ("microbatches", "replicas", "recompute", "fsdp", "layers")
                if getattr(self, n) != getattr(default, n)]


@dataclass(frozen=True)
class Emit:
    """The partitioned model: built with ``model`` and, with ``verify``, run against the
    original (``torch.testing.assert_close``) with its peak memory per device measured,
    failing above the plan's with ``check_memory`` (``None``: ``emit.ENFORCE_PEAK_DEFAULT``)."""

    model: bool = True
    verify: bool = True
    check_memory: bool | None = None


@dataclass(frozen=True)
class Parallel:
    """Parallelism beside placement: ``tp``, N tensor-parallel ranks (one device each, the
    first N) weighed beside the plan's placement or training step (``solve.tensor``,
    ``emit.distributed.tensor``; ``docs/concepts.md``, ``docs/training.md``); ``"auto"``:
    every degree that divides the leading alike devices of one host, the fastest kept. ``dp``: the
    candidate's data-parallel degree beside ``tp``, a dp x tp mesh of every device, each tp
    group on 1/dp of the batch (in training FSDP2 over dp, or its gradients averaged:
    ``training.fsdp``); ``"auto"``: one tp group on the leading devices and the mesh of every
    device, each weighed, the fastest kept. ``pp``: with a whole ``tp``, the candidate is a
    pp x tp mesh of the first pp x tp devices: the model cut into ``pp`` stages in its
    topological order, each run by a tp group and handed on by ``torch.distributed.pipelining``
    (in training ``training.microbatches`` of them in ``training.schedule``'s order;
    ``pipeline.staged``); ``"auto"``: every pp of 2 or more whose mesh the devices hold,
    each weighed, the fastest kept."""

    tp: int | str | None = None
    dp: int | str | None = None
    pp: int | str | None = None

    def __post_init__(self) -> None:
        if self.tp is not None and self.tp != "auto":
            if isinstance(self.tp, str):
                raise ConfigError(f"{{parallel.tp}} must be a whole number, 2 or more, or "
                                  f"auto, got {self.tp!r}")
            _whole(self.tp, "parallel.tp", least=2)
        if self.dp is not None:
            if self.dp != "auto":
                _whole(self.dp, "parallel.dp", least=2)
            if self.tp is None or (self.dp != "auto" and not isinstance(self.tp, int)):
                raise ConfigError("{parallel.dp} is the data-parallel degree of a "
                                  "tensor-parallel mesh: give {parallel.tp} too, a whole number "
                                  "(or auto with {parallel.dp=auto}; data parallelism alone is "
                                  "{training.replicas})")
        if self.pp is not None:
            if self.pp != "auto":
                if isinstance(self.pp, str):
                    raise ConfigError(f"{{parallel.pp}} must be a whole number, 2 or more, or "
                                      f"auto, got {self.pp!r}")
                _whole(self.pp, "parallel.pp", least=2)
            if not isinstance(self.tp, int):
                raise ConfigError("{parallel.pp} cuts a tensor-parallel mesh into pipeline "
                                  "stages: give {parallel.tp} too, a whole number (pipeline "
                                  "stages alone are the placement's: plan without {parallel.pp})")
            if self.dp is not None:
                raise ConfigError("{parallel.pp} with {parallel.dp} (a 3-D mesh) is not built "
                                  "yet: drop one of them")


@dataclass(frozen=True)
class Config:
    """Everything ``autoplace.plan`` is told besides the model, its inputs and its loss.

    ``devices`` takes a ``Devices``, or a spec or ``Cluster`` for one. ``mode``: inference or
    training (``training`` holds the step's options). ``granularity``: ``op`` (a partitioned
    model) or ``module`` (a Hugging Face ``device_map``; ``no_split``: module classes kept
    whole). ``dtype``: the model and the floating inputs are cast to it before tracing.
    ``pins``: module path -> device (``"cuda:1"``, or ``1``, the second GPU), inference only.
    ``checkpoint``: a safetensors file or a ``save_pretrained`` directory with the weights.
    ``name``: the plan's name for the model. ``generate``: plan text generation of that many
    new tokens after the example inputs, the prompt (``pipeline.generation``)."""

    devices: Devices = field(default_factory=Devices)
    mode: Mode = Mode.INFERENCE
    granularity: Granularity = Granularity.OP
    dtype: DType = DType.FLOAT32
    solve: Solve = field(default_factory=Solve)
    cost: Cost = field(default_factory=Cost)
    training: Training = field(default_factory=Training)
    emit: Emit = field(default_factory=Emit)
    parallel: Parallel = field(default_factory=Parallel)
    pins: Mapping[str, str | int] | None = None
    checkpoint: str | os.PathLike[str] | None = None
    no_split: Sequence[str] | None = None
    name: str = "model"
    generate: int | None = None

    def __post_init__(self) -> None:
        put = object.__setattr__
        if isinstance(self.devices, str):
            put(self, "devices", Devices(spec=self.devices))
        elif isinstance(self.devices, Cluster):
            put(self, "devices", Devices(cluster=self.devices))
        elif self.devices is None:
            put(self, "devices", Devices())
        put(self, "mode", choice(Mode, self.mode, "mode"))
        if str(self.dtype).strip().lower() in ("tf32", "tfloat32"):  # float32 on TF32 cores
            if not isinstance(self.cost, Cost):
                raise ConfigError(f"{{cost}} must be the Cost(...) section, got {self.cost!r}")
            put(self, "cost", replace(self.cost, tf32=True))
            put(self, "dtype", DType.FLOAT32)
        put(self, "granularity", choice(Granularity, self.granularity, "granularity"))
        put(self, "dtype", choice(DType, self.dtype, "dtype"))
        if self.pins is not None:
            put(self, "pins", MappingProxyType(dict(self.pins)) if self.pins else None)
        if isinstance(self.no_split, str):
            raise ConfigError(f"{{no_split}} is a list of module class names, got the text "
                              f"{self.no_split!r}: write [{self.no_split!r}]")
        if self.no_split is not None:
            put(self, "no_split", tuple(self.no_split))
        for name, kind in (("solve", Solve), ("cost", Cost), ("training", Training),
                           ("emit", Emit), ("devices", Devices), ("parallel", Parallel)):
            if not isinstance(getattr(self, name), kind):
                raise ConfigError(f"{{{name}}} must be the {kind.__name__}(...) section, got "
                                  f"{getattr(self, name)!r}")
        self._check_mode()
        self._check_granularity()
        self._check_generate()

    def _check_generate(self) -> None:
        if self.generate is None:
            return
        _whole(self.generate, "generate", least=1)
        if self.mode != Mode.INFERENCE:
            raise ConfigError("{generate} plans inference: set {mode=inference}")
        if self.parallel.tp is not None or (self.pins and self.granularity == Granularity.OP):
            raise ConfigError("{generate} is planned without {parallel.tp}, and at op "
                              "granularity without {pins}, for now: drop them")

    def _check_mode(self) -> None:
        if self.parallel.tp is not None and self.granularity != Granularity.OP:
            raise ConfigError("{parallel.tp} is weighed for plans of ops (a device map of "
                              "tensor-parallel ranks is not built yet): drop it, or plan with "
                              "{granularity=op}")
        if self.parallel.tp is not None and self.mode == Mode.TRAINING and (
                self.dtype != DType.FLOAT32):
            raise ConfigError(f"{{parallel.tp}} in training in {self.dtype} (mixed precision) "
                              "is not built yet: use {dtype=float32}")
        if self.mode == Mode.TRAINING:
            if self.pins:
                raise ConfigError("{pins} apply to inference plans for now: plan the training "
                                  "step without them")
            if self.training.fsdp == Fsdp.ON and self.dtype != DType.FLOAT32:
                raise ConfigError(f"{{training.fsdp=on}} in {self.dtype} (mixed precision) is "
                                  "not built yet: use {dtype=float32}")
            if self.training.fsdp == Fsdp.ON and self.parallel.dp is None:
                self._check_sharded_replicas()  # with {parallel.dp}: the mesh's, over dp
            return
        changed = self.training.changed()
        if changed:
            raise ConfigError(f"{{{changed[0]}}} is for training plans: set "
                              "{mode=training}")

    def _check_sharded_replicas(self) -> None:
        if self.training.replicas == 1:
            raise ConfigError("{training.fsdp=on} shards the model over data-parallel "
                              "replicas: set {training.replicas} to 2 or more, or auto")
        if self.training.microbatches > 1:
            raise ConfigError("{training.fsdp=on} with micro-batches is not built yet (each "
                              "sharded replica runs its shard of the batch at once): drop "
                              "{training.microbatches}, or set {training.fsdp=off}")

    def _check_granularity(self) -> None:
        if self.granularity == Granularity.OP:
            if self.no_split is not None:
                raise ConfigError("{no_split} goes with {granularity=module} (the classes a "
                                  "device_map keeps whole)")
            return
        if self.mode != Mode.INFERENCE:
            raise ConfigError("{granularity=module} plans inference (a device_map places a "
                              "model for its forward pass): set {mode=inference}, or plan at "
                              "op granularity")
        if self.checkpoint is not None:
            raise ConfigError("{checkpoint} goes with op granularity (the emitted model reads "
                              "it): a device_map is loaded with the checkpoint by "
                              "from_pretrained(PATH, device_map=...); leave it out")
        if self.dtype != DType.FLOAT32:
            raise ConfigError("{dtype} is not applied at {granularity=module}: the device_map "
                              "is sized in the model's own dtype; cast the model (model.to("
                              "torch.bfloat16)) and leave the dtype float32")

    @property
    def solving(self) -> Solve:
        """``solve`` with its granularity's defaults filled in: the time limit (10 s; 1 s at
        module granularity) and ``max_nodes`` (120; CP-SAT's own limit for module graphs).
        Read here, not stored, so a copy with another granularity gets that one's."""
        module = self.granularity == Granularity.MODULE
        return replace(self.solve, time_limit_s=self.solve.time_limit_s or (
            MODULE_TIME_LIMIT_S if module else DEFAULT_TIME_LIMIT_S),
            max_nodes=self.solve.max_nodes or (None if module else DEFAULT_MAX_NODES))

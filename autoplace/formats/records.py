"""The parts of a ``Plan`` beside its placement, each a frozen record with its ``plan.json`` form:
``Coarsening``, ``WhatIfRecord`` (a row of the what-if table), ``MinGain``, ``TrainingRecord``
(with its ``ReplicaOption`` rows and its ``TrainingCheck``), ``PinsRecord``, ``DeviceMapRecord``
(with accelerate's maps, ``AccelerateMapRecord``) and ``ProfileRecord``.

``to_dict`` writes the keys ``plan.schema.json`` documents, in the order the pipeline has always
written them; ``from_dict`` reads them back. A field that is ``None`` stands for an optional key
the plan does not hold (a plan from an older autoplace, or one written by hand), and is left out,
so that a plan read and written again is the file it was.
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from autoplace.config.choices import Objective

__all__ = ["AccelerateMapRecord", "Coarsening", "DeviceMapRecord", "GenerationRecord", "MinGain",
           "PinsRecord",
           "ProfileRecord", "ReplicaOption", "SHARDING_SAID", "TensorParallelRecord",
           "TrainingCheck", "TrainingRecord", "WhatIfRecord", "mesh_key", "mesh_said"]

# How a tensor-parallel mesh holds the model over dp, in words (``TensorParallelRecord.sharding``).
SHARDING_SAID = {"fsdp": "FSDP2", "ddp": "gradients averaged"}

# A Hugging Face device_map: module name -> a GPU index, "cpu" or "disk".
HfDeviceMap = Mapping[str, int | str]


def _present(pairs: Iterable[tuple[str, Any]]) -> dict[str, Any]:
    """The pairs whose value is not ``None``: the optional keys a record holds."""
    return {key: value for key, value in pairs if value is not None}


def _tuple(values: Sequence[Any] | None) -> tuple[Any, ...] | None:
    return None if values is None else tuple(values)


def _list(values: Sequence[Any] | None) -> list[Any] | None:
    return None if values is None else list(values)


@dataclass(frozen=True)
class Coarsening:
    """How the traced graph became the plan's: ``traced_ops`` traced, ``plan_nodes`` placed, and
    the ``steps`` that folded (or, for the solver, coarsened) it."""

    traced_ops: int
    plan_nodes: int
    steps: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, Any]:
        return {"traced_ops": self.traced_ops, "plan_nodes": self.plan_nodes,
                "steps": list(self.steps)}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> Coarsening:
        return cls(traced_ops=data["traced_ops"], plan_nodes=data["plan_nodes"],
                   steps=tuple(data.get("steps", ())))


@dataclass(frozen=True)
class WhatIfRecord:
    """A row of the what-if table (``solve.whatif``): the model solved briefly on the first
    ``devices``. ``makespan_s`` and ``objective_s`` are ``None`` where they do not hold it (then
    ``detail`` says why, and ``objective_s`` is not written); ``status`` is the solver's, or
    ``INFEASIBLE``; ``wall_s`` the time the row took."""

    devices: tuple[str, ...]
    makespan_s: float | None
    status: str
    objective_s: float | None = None
    detail: str = ""
    wall_s: float | None = None

    def value_s(self, objective: str) -> float | None:
        """The row's value under ``objective``: the makespan, or (throughput) its objective,
        the makespan where a row does not say it."""
        if objective != Objective.THROUGHPUT or self.objective_s is None:
            return self.makespan_s
        return self.objective_s

    def to_dict(self) -> dict[str, Any]:
        return ({"devices": list(self.devices), "makespan_s": self.makespan_s}
                | _present([("objective_s", self.objective_s)])
                | {"status": self.status, "detail": self.detail}
                | _present([("wall_s", self.wall_s)]))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> WhatIfRecord:
        return cls(devices=tuple(data["devices"]), makespan_s=data["makespan_s"],
                   status=data.get("status", ""), objective_s=data.get("objective_s"),
                   detail=data.get("detail", ""), wall_s=data.get("wall_s"))


@dataclass(frozen=True)
class MinGain:
    """The ``--min-gain`` policy as applied: its ``threshold``, whether it chose the best single
    device and why (``reason``, ``None`` when it did not); the solver's split before it
    (``split_devices``) and what that gained over the single device (``split_gain``, ``None``
    on one device or where no single device fits). Plans older than the split's figures hold
    neither: ``split_devices`` is ``None`` there, and both are left out."""

    threshold: float
    single_device_chosen: bool
    reason: str | None = None
    split_devices: int | None = None
    split_gain: float | None = None

    def to_dict(self) -> dict[str, Any]:
        data = {"threshold": self.threshold, "single_device_chosen": self.single_device_chosen,
                "reason": self.reason}
        if self.split_devices is not None:
            data |= {"split_devices": self.split_devices, "split_gain": self.split_gain}
        return data

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> MinGain:
        return cls(threshold=data["threshold"], single_device_chosen=data["single_device_chosen"],
                   reason=data.get("reason"), split_devices=data.get("split_devices"),
                   split_gain=data.get("split_gain"))


@dataclass(frozen=True)
class ReplicaOption:
    """A replica count a training plan tried: ``replicas`` of ``devices_per_replica`` devices,
    its predicted ``step_s`` (the all-reduce included; ``None`` where it fitted no device, or
    was not solved), whether it ``fits`` (a placement was found within memory), how its
    replicas hold the model (``sharding``: ``ddp``, or ``fsdp``, written only then), and,
    where it was not solved because its lower bound was no less than the tensor-parallel
    mesh's step (``solve.Outpaced``), that bound (``bound_s``, written only then)."""

    replicas: int
    devices_per_replica: int
    fits: bool
    step_s: float | None = None
    sharding: str = "ddp"
    bound_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        return ({"replicas": self.replicas, "devices_per_replica": self.devices_per_replica}
                | _present([("step_s", self.step_s)]) | {"fits": self.fits}
                | ({"sharding": self.sharding} if self.sharding != "ddp" else {})
                | _present([("bound_s", self.bound_s)]))

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ReplicaOption:
        return cls(replicas=data["replicas"], devices_per_replica=data["devices_per_replica"],
                   fits=data["fits"], step_s=data.get("step_s"),
                   sharding=data.get("sharding", "ddp"), bound_s=data.get("bound_s"))


@dataclass(frozen=True)
class TrainingCheck:
    """The emitted model trained beside the original (``emit.check.training.verify_training``,
    ``emit.distributed.replicas.verify_replicas``): ``passed`` or ``skipped``, then, where it
    ran, the steps, both sides' losses, the largest differences (of the buffers too, batch
    norm's running statistics: ``buffers_compared`` of them), where the emitted graphs drop out
    the loss of a step with dropout on (``dropout_ops`` of them; the compared steps run them at
    probability zero), and the step's measured memory (``memory_status``; ``peak_bytes`` and
    ``peak_method`` where it was measured)."""

    status: str = "skipped"
    optimizer: str | None = None
    steps: int | None = None
    dtype: str | None = None
    skipped_steps: int | None = None
    replicas: int | None = None
    losses: tuple[float, ...] | None = None
    original_losses: tuple[float, ...] | None = None
    max_abs_diff_gradients: float | None = None
    max_abs_diff_parameters: float | None = None
    ill_conditioned_elements: int | None = None
    max_abs_diff_buffers: float | None = None
    buffers_compared: int | None = None
    dropout_ops: int | None = None
    loss_with_dropout: float | None = None
    memory_status: str | None = None
    peak_bytes: Mapping[str, Mapping[str, int]] | None = None
    peak_method: str | None = None
    detail: str | None = None

    def to_dict(self) -> dict[str, Any]:
        peaks = None if self.peak_bytes is None else {
            d: dict(v) for d, v in self.peak_bytes.items()}
        return {"status": self.status} | _present([
            ("optimizer", self.optimizer), ("steps", self.steps), ("dtype", self.dtype),
            ("skipped_steps", self.skipped_steps), ("replicas", self.replicas),
            ("losses", _list(self.losses)), ("original_losses", _list(self.original_losses)),
            ("max_abs_diff_gradients", self.max_abs_diff_gradients),
            ("max_abs_diff_parameters", self.max_abs_diff_parameters),
            ("ill_conditioned_elements", self.ill_conditioned_elements),
            ("max_abs_diff_buffers", self.max_abs_diff_buffers),
            ("buffers_compared", self.buffers_compared), ("dropout_ops", self.dropout_ops),
            ("loss_with_dropout", self.loss_with_dropout),
            ("memory_status", self.memory_status), ("peak_bytes", peaks),
            ("peak_method", self.peak_method), ("detail", self.detail)])

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrainingCheck:
        peaks = data.get("peak_bytes")
        return cls(status=data["status"], optimizer=data.get("optimizer"),
                   steps=data.get("steps"), dtype=data.get("dtype"),
                   skipped_steps=data.get("skipped_steps"), replicas=data.get("replicas"),
                   losses=_tuple(data.get("losses")),
                   original_losses=_tuple(data.get("original_losses")),
                   max_abs_diff_gradients=data.get("max_abs_diff_gradients"),
                   max_abs_diff_parameters=data.get("max_abs_diff_parameters"),
                   ill_conditioned_elements=data.get("ill_conditioned_elements"),
                   max_abs_diff_buffers=data.get("max_abs_diff_buffers"),
                   buffers_compared=data.get("buffers_compared"),
                   dropout_ops=data.get("dropout_ops"),
                   loss_with_dropout=data.get("loss_with_dropout"),
                   memory_status=data.get("memory_status"),
                   peak_bytes=None if peaks is None else {d: dict(v) for d, v in peaks.items()},
                   peak_method=data.get("peak_method"), detail=data.get("detail"))


@dataclass(frozen=True)
class TrainingRecord:
    """A training plan's step (``autoplace.train``, ``pipeline.step.Step.record``): its
    ``optimizer`` and ``dtype``, ``microbatches`` run in ``schedule``'s order, ``replicas``
    data-parallel replicas (on ``replica_groups``, as torch devices ``replica_torch_devices``),
    the devices that ``recompute``, every replica count tried (``replica_options``), how the
    replicas hold the model (``sharding``: ``ddp`` or ``fsdp``, ``train.sharded``) and the
    training ``check`` of the emitted model.

    A plan from before micro-batches, replicas or precision were built holds none of those
    (``None`` here): such a plan means one micro-batch (GPipe's order), one replica, float32
    and no recomputation, the defaults ``plan.schema.json`` documents."""

    optimizer: str
    dtype: str | None = None
    layers_mode: str | None = None
    microbatches: int | None = None
    schedule: str | None = None
    replicas: int | None = None
    recompute: tuple[str, ...] | None = None
    microbatch_loss: str | None = None
    replica_groups: tuple[tuple[str, ...], ...] | None = None
    replica_torch_devices: tuple[tuple[str, ...], ...] | None = None
    replica_options: tuple[ReplicaOption, ...] | None = None
    sharding: str | None = None
    check: TrainingCheck = field(default_factory=TrainingCheck)

    def to_dict(self) -> dict[str, Any]:
        def groups(value: tuple[tuple[str, ...], ...] | None) -> list[list[str]] | None:
            return None if value is None else [list(g) for g in value]

        options = (None if self.replica_options is None
                   else [o.to_dict() for o in self.replica_options])
        return {"optimizer": self.optimizer} | _present([
            ("dtype", self.dtype), ("layers_mode", self.layers_mode),
            ("microbatches", self.microbatches), ("schedule", self.schedule),
            ("replicas", self.replicas), ("recompute", _list(self.recompute)),
            ("microbatch_loss", self.microbatch_loss),
            ("replica_groups", groups(self.replica_groups)),
            ("replica_torch_devices", groups(self.replica_torch_devices)),
            ("replica_options", options), ("sharding", self.sharding)]) | {
                "check": self.check.to_dict()}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TrainingRecord:
        def groups(value: Sequence[Sequence[str]] | None) -> tuple[tuple[str, ...], ...] | None:
            return None if value is None else tuple(tuple(g) for g in value)

        options = data.get("replica_options")
        return cls(optimizer=data["optimizer"], dtype=data.get("dtype"),
                   layers_mode=data.get("layers_mode"), microbatches=data.get("microbatches"),
                   schedule=data.get("schedule"), replicas=data.get("replicas"),
                   recompute=_tuple(data.get("recompute")),
                   microbatch_loss=data.get("microbatch_loss"),
                   replica_groups=groups(data.get("replica_groups")),
                   replica_torch_devices=groups(data.get("replica_torch_devices")),
                   replica_options=None if options is None else tuple(
                       ReplicaOption.from_dict(o) for o in options),
                   sharding=data.get("sharding"), check=TrainingCheck.from_dict(data["check"]))


@dataclass(frozen=True)
class PinsRecord:
    """Modules pinned by hand (``autoplace.solve.pins``): each pinned module's device, the
    traced ops (or module nodes) that fixed, and the plan the model gets without them
    (``unpinned_makespan_s``, ``unpinned_objective_s``), which ``Plan.pins_cost_s`` compares
    the plan with. ``plan.json`` also holds that cost, derived (``cost_s``): the plan writes
    it."""

    modules: Mapping[str, str]
    ops: int
    unpinned_makespan_s: float
    unpinned_objective_s: float

    def to_dict(self) -> dict[str, Any]:
        return {"modules": dict(self.modules), "ops": self.ops,
                "unpinned_makespan_s": self.unpinned_makespan_s,
                "unpinned_objective_s": self.unpinned_objective_s}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> PinsRecord:
        return cls(modules=dict(data["modules"]), ops=data["ops"],
                   unpinned_makespan_s=data["unpinned_makespan_s"],
                   unpinned_objective_s=data["unpinned_objective_s"])


@dataclass(frozen=True)
class AccelerateMapRecord:
    """One of accelerate's device maps, and why it is not a placement here (``None`` when it
    is)."""

    map: HfDeviceMap
    note: str | None = None

    def to_dict(self) -> dict[str, Any]:
        return {"map": dict(self.map), "note": self.note}

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> AccelerateMapRecord:
        return cls(map=dict(data["map"]), note=data.get("note"))


@dataclass(frozen=True)
class TensorParallelRecord:
    """An inference plan's tensor-parallel candidate (``--tp N``, ``solve.tensor``): ``ranks``
    on ``devices`` (one each), the matmuls split as ``columns`` and ``rows``, its simulated
    ``makespan_s`` and rank 0's ``peak_bytes``, the collectives DTensor inserts (``collectives``
    of ``collective_bytes`` in all, per pass) and its check on gloo ranks (``check``: passed or
    skipped; ``max_abs_diff``; ``measured_s``, the median pass there). ``split``: each split
    weight of the one-device model in ``OUT/tensor_parallel/model`` (``seg<i>.<name>``) and how,
    ``(column or row, dimension)``. ``weighed``: with ``--tp auto``, each degree weighed and
    its simulated makespan (the fastest is this one). ``optimizer``: a training plan's
    candidate (``--mode training``), whose makespan is a step of it, forward, backward and
    update, every rank on the whole batch; ``check`` then says its 3 steps equalled the
    original's, ``measured_s`` is the median step. ``dp``: a training candidate's
    data-parallel degree (``--dp``): ``devices`` are then a dp x ``ranks`` mesh in rank order,
    each tp group on 1/dp of the batch, ``sharding`` over dp (``fsdp``: FSDP2; ``ddp``: the
    gradients averaged), ``weighed_sharding`` each one priced (``--fsdp auto``).
    ``torch_devices``: each device's torch device, in the order of ``devices`` (the plan's
    cluster may hold only a replica's devices). ``meshes``: with ``--dp auto`` (``--pp auto``),
    each mesh weighed (``"DPxTP"``, ``"ppPPxTP"``: ``mesh_key``) and its prediction (this
    record is the fastest's). ``over_bytes``:
    how far rank 0's simulated peak exceeds its device's memory (0: it fits); a candidate that
    fits is kept before any faster one that does not. ``recompute``: a training candidate's
    units (its FSDP2 units, blocks) recompute their forward before their backward, which it
    needed to fit (``train.recompute.recompute_units``). ``pp``: an inference candidate's
    pipeline stages (``--pp``, ``pipeline.staged``): ``devices`` are a pp x ``ranks`` mesh in
    rank order, stage s on the s-th group of ``ranks``; ``makespan_s`` is one pass through the
    stages, ``peak_bytes`` the largest stage's rank peak and ``stage_peak_bytes`` each stage's
    (its first rank's; the others mirror it); a training candidate's ``microbatches`` run in
    ``schedule``'s order (``gpipe`` or ``1f1b``), its makespan the step of them all."""

    ranks: int
    devices: tuple[str, ...]
    makespan_s: float
    peak_bytes: int
    columns: int
    rows: int
    collectives: int
    collective_bytes: int
    check: str = "skipped"
    max_abs_diff: float | None = None
    measured_s: float | None = None
    split: Mapping[str, tuple[str, int]] = field(default_factory=dict)
    weighed: Mapping[int, float] = field(default_factory=dict)
    optimizer: str | None = None
    dp: int = 1
    sharding: str | None = None
    weighed_sharding: Mapping[str, float] = field(default_factory=dict)
    torch_devices: tuple[str, ...] = ()
    meshes: Mapping[str, float] = field(default_factory=dict)
    over_bytes: int = 0
    recompute: bool = False
    pp: int = 1
    stage_peak_bytes: tuple[int, ...] = ()
    microbatches: int = 1
    schedule: str | None = None

    @property
    def fits(self) -> bool:
        """Whether rank 0's simulated peak is within its device's memory."""
        return self.over_bytes == 0

    @property
    def world(self) -> int:
        """The ranks that run it: ``pp`` x ``dp`` x ``ranks``."""
        return self.pp * self.dp * self.ranks

    @property
    def mesh_text(self) -> str:
        """The mesh in words: ``"dp 8 x tp 8 (FSDP2 over dp), each block recomputed"``,
        ``"pp 2 x tp 2, 1F1B with 4 micro-batches"``, ``"tp 2"``; every note, error and
        summary that names it says this."""
        return ((f"pp {self.pp} x " if self.pp > 1 else "")
                + (f"dp {self.dp} x tp {self.ranks}" if self.dp > 1 else f"tp {self.ranks}")
                + (f" ({SHARDING_SAID[self.sharding]} over dp)" if self.sharding else "")
                + (f", {self.schedule.upper()} with {self.microbatches} micro-batches"
                   if self.schedule and self.microbatches > 1 else "")
                + (", each block recomputed" if self.recompute else ""))

    @property
    def stages_text(self) -> str:
        """A pp x tp mesh's stages in words, for its note (empty without ``pp``): ``"a pp 2 x
        tp 2 mesh, the model cut into 2 pipeline stages (rank peaks by stage: 9, 8 bytes), 4
        micro-batches a step in 1F1B's order; "``."""
        if self.pp == 1:
            return ""
        return (f"a pp {self.pp} x tp {self.ranks} mesh, the model cut into {self.pp} pipeline "
                "stages (rank peaks by stage: " + ", ".join(map(str, self.stage_peak_bytes))
                + " bytes)" + (f", {self.microbatches} micro-batches a step in "
                               f"{self.schedule.upper()}'s order"
                               if self.schedule and self.microbatches > 1 else "") + "; ")

    def to_dict(self) -> dict[str, Any]:
        return {"ranks": self.ranks, "devices": list(self.devices),
                "makespan_s": self.makespan_s, "peak_bytes": self.peak_bytes,
                "columns": self.columns, "rows": self.rows, "collectives": self.collectives,
                "collective_bytes": self.collective_bytes, "check": self.check,
                "split": {k: list(v) for k, v in self.split.items()}} | _present([
                    ("max_abs_diff", self.max_abs_diff), ("measured_s", self.measured_s),
                    ("weighed", {str(d): s for d, s in self.weighed.items()} or None),
                    ("optimizer", self.optimizer), ("dp", self.dp if self.dp > 1 else None),
                    ("sharding", self.sharding),
                    ("weighed_sharding", dict(self.weighed_sharding) or None),
                    ("torch_devices", list(self.torch_devices) or None),
                    ("meshes", dict(self.meshes) or None),
                    ("over_bytes", self.over_bytes or None),
                    ("recompute", self.recompute or None),
                    ("pp", self.pp if self.pp > 1 else None),
                    ("stage_peak_bytes", list(self.stage_peak_bytes) or None),
                    ("microbatches", self.microbatches if self.microbatches > 1 else None),
                    ("schedule", self.schedule)])

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> TensorParallelRecord:
        return cls(ranks=data["ranks"], devices=tuple(data["devices"]),
                   makespan_s=data["makespan_s"], peak_bytes=data["peak_bytes"],
                   columns=data["columns"], rows=data["rows"], collectives=data["collectives"],
                   collective_bytes=data["collective_bytes"], check=data.get("check", "skipped"),
                   max_abs_diff=data.get("max_abs_diff"), measured_s=data.get("measured_s"),
                   split={k: (v[0], v[1]) for k, v in data.get("split", {}).items()},
                   weighed={int(d): s for d, s in data.get("weighed", {}).items()},
                   optimizer=data.get("optimizer"), dp=data.get("dp", 1),
                   sharding=data.get("sharding"),
                   weighed_sharding=dict(data.get("weighed_sharding", {})),
                   torch_devices=tuple(data.get("torch_devices", ())),
                   meshes=dict(data.get("meshes", {})), over_bytes=data.get("over_bytes", 0),
                   recompute=data.get("recompute", False), pp=data.get("pp", 1),
                   stage_peak_bytes=tuple(data.get("stage_peak_bytes", ())),
                   microbatches=data.get("microbatches", 1), schedule=data.get("schedule"))


def mesh_key(record: TensorParallelRecord) -> str:
    """A mesh's key in ``TensorParallelRecord.meshes``: ``"DPxTP"``, or ``"ppPPxTP"`` for a
    pp x tp one (``mesh_said`` says it)."""
    return f"pp{record.pp}x{record.ranks}" if record.pp > 1 else f"{record.dp}x{record.ranks}"


def mesh_said(key: str) -> str:
    """``mesh_key``'s key in words: ``"dp 8 x tp 8"``, ``"pp 2 x tp 2"``."""
    outer, tp = key.split("x")
    return f"pp {outer[2:]} x tp {tp}" if outer.startswith("pp") else f"dp {outer} x tp {tp}"


@dataclass(frozen=True)
class DeviceMapRecord:
    """A ``--granularity module`` plan's Hugging Face ``device_map`` (``pipeline.modules``,
    also written to ``device_map.json``): the module classes kept whole (``no_split``), the
    ``map``, the device of the model's inputs, and accelerate's maps by baseline name."""

    map: HfDeviceMap
    no_split: tuple[str, ...] = ()
    accelerate: Mapping[str, AccelerateMapRecord] = field(default_factory=dict)
    input_device: str | None = None
    granularity: str = "module"

    def to_dict(self) -> dict[str, Any]:
        return ({"granularity": self.granularity, "no_split": list(self.no_split),
                 "map": dict(self.map)} | _present([("input_device", self.input_device)])
                | {"accelerate": {name: m.to_dict() for name, m in self.accelerate.items()}})

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> DeviceMapRecord:
        return cls(map=dict(data["map"]), no_split=tuple(data.get("no_split", ())),
                   accelerate={name: AccelerateMapRecord.from_dict(m)
                               for name, m in data.get("accelerate", {}).items()},
                   input_device=data.get("input_device"),
                   granularity=data.get("granularity", "module"))


@dataclass(frozen=True)
class ProfileRecord:
    """What ``autoplace.profile`` measured for the plan (``Profiled.to_dict``), kept as it was
    measured: per device the ops measured and from the cache, the sum of their times and the
    whole forward pass's; the links measured; the calibration fits by device type; calibrated
    predictions against measurements; the cache used; the time it all took. Each entry is the
    profiler's own JSON, passed through."""

    devices: tuple[Mapping[str, object], ...] | None = None
    links: tuple[Mapping[str, object], ...] | None = None
    calibration: Mapping[str, Mapping[str, object]] | None = None
    comparisons: tuple[Mapping[str, object], ...] | None = None
    cache: Mapping[str, object] | None = None
    wall_s: float | None = None

    @property
    def device_names(self) -> tuple[str, ...]:
        """The plan's devices that were profiled."""
        return tuple(str(d["device"]) for d in self.devices or ())

    def to_dict(self) -> dict[str, Any]:
        return _present([
            ("devices", None if self.devices is None else [dict(d) for d in self.devices]),
            ("links", None if self.links is None else [dict(lk) for lk in self.links]),
            ("calibration", None if self.calibration is None else {
                name: dict(fit) for name, fit in self.calibration.items()}),
            ("comparisons", None if self.comparisons is None else [
                dict(c) for c in self.comparisons]),
            ("cache", None if self.cache is None else dict(self.cache)),
            ("wall_s", self.wall_s)])

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> ProfileRecord:
        calibration = data.get("calibration")
        cache = data.get("cache")
        return cls(devices=_tuple(data.get("devices")), links=_tuple(data.get("links")),
                   calibration=None if calibration is None else dict(calibration),
                   comparisons=_tuple(data.get("comparisons")),
                   cache=None if cache is None else dict(cache), wall_s=data.get("wall_s"))


@dataclass(frozen=True)
class GenerationRecord:
    """A generation plan (``--generate N``, ``pipeline.generation``): ``batch`` prompts of
    ``prompt_tokens`` and ``new_tokens`` generated greedily after them. ``prefill_s``: the
    prompt's pass (it gives the first new token), ``step_s``: one decode step (each further
    token), each simulated on its own graph under the plan's placement; ``total_s`` is the
    prefill and ``new_tokens - 1`` steps. ``cache_bytes``: the key-value cache each device holds
    (sized for prompt + new tokens). ``lower_bound_s``: a bound on ``total_s`` of any placement
    (the solver's, on the graph that sums both passes). ``baselines``: each baseline's
    ``total_s``. ``check``: whether the emitted model generated the original's tokens;
    ``measured_cache_bytes``: the cache the emitted model holds per device; ``measured_step_s``:
    its median decode step there."""

    new_tokens: int
    prompt_tokens: int
    batch: int
    prefill_s: float
    step_s: float
    cache_bytes: Mapping[str, int]
    lower_bound_s: float
    baselines: Mapping[str, float] = field(default_factory=dict)
    check: str = "skipped"
    measured_cache_bytes: Mapping[str, int] | None = None
    measured_step_s: float | None = None

    @property
    def total_s(self) -> float:
        return self.prefill_s + (self.new_tokens - 1) * self.step_s

    @property
    def tokens_per_s(self) -> float:
        """New tokens a second over the batch while decoding."""
        return self.batch / self.step_s if self.step_s > 0 else math.inf

    def to_dict(self) -> dict[str, Any]:
        return {"new_tokens": self.new_tokens, "prompt_tokens": self.prompt_tokens,
                "batch": self.batch, "prefill_s": self.prefill_s, "step_s": self.step_s,
                "total_s": self.total_s, "tokens_per_s": self.tokens_per_s,
                "cache_bytes": dict(self.cache_bytes), "lower_bound_s": self.lower_bound_s,
                "baselines": dict(self.baselines), "check": self.check} | _present([
                    ("measured_cache_bytes", None if self.measured_cache_bytes is None
                     else dict(self.measured_cache_bytes)),
                    ("measured_step_s", self.measured_step_s)])

    @classmethod
    def from_dict(cls, data: Mapping[str, Any]) -> GenerationRecord:
        measured = data.get("measured_cache_bytes")
        return cls(new_tokens=data["new_tokens"], prompt_tokens=data["prompt_tokens"],
                   batch=data["batch"], prefill_s=data["prefill_s"], step_s=data["step_s"],
                   cache_bytes=dict(data["cache_bytes"]), lower_bound_s=data["lower_bound_s"],
                   baselines=dict(data.get("baselines", {})), check=data.get("check", "skipped"),
                   measured_cache_bytes=None if measured is None else dict(measured),
                   measured_step_s=data.get("measured_step_s"))

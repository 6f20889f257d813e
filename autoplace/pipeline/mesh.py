"""The mesh of a tensor-parallel candidate (``pipeline.tensor``): its devices and the degrees
weighed (``tensor_devices``, ``tensor_degrees``, ``dp_values``); its dp dimension (``--dp``):
a dp x tp mesh whose tp groups each run 1/dp of the batch (``dp_shard``). In training, what
dp adds to rank 0's step (``over_dp``): FSDP2 over dp (``train.sharded``) or the gradients
averaged (``train.dataparallel``), on rank 0's shards, measured on gloo processes here where
the devices are this machine's CPU workers (``_averaging_s``); the split renamed to the
one-device model that FSDP2's units cut into segments (``renamed``). Ranks that outnumber this
host's cores share them (``stretch``). Where no placement fits, or beats it, the plan is the
mesh (``mesh_plan``, ``mesh_faster``). docs/training.md, "A dp x tp mesh".
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

from autoplace.config import Config
from autoplace.errors import ConfigError
from autoplace.formats.plan import (
    MESH_SOLVER,
    NO_PLACEMENT_FITS,
    PLACEMENT_SLOWER,
    BaselineResult,
    Plan,
    SolverRecord,
    Verification,
)
from autoplace.formats.records import Coarsening, TensorParallelRecord, TrainingRecord
from autoplace.ir import Cluster, Device, Problem, Schedule
from autoplace.progress.notes import note

__all__ = ["SHARDINGS", "Mesh", "dp_shard", "dp_values", "mesh_faster", "mesh_plan", "over_dp",
           "renamed", "stretch", "stretched", "tensor_degrees", "tensor_devices"]


@dataclass(frozen=True)
class Mesh:
    """A candidate's data-parallel dimension (``--dp``): ``dp`` tp groups, each on 1/dp of
    the batch, and in training the ``shardings`` to price over dp (``fsdp``: FSDP2 per unit,
    ``train.sharded``; ``ddp``: the gradients averaged in DDP's buckets,
    ``train.dataparallel``), the faster kept; measured as gloo processes here where the
    devices are ``profiled`` CPU workers (the figures kept in ``cache``)."""

    dp: int
    shardings: tuple[str, ...]
    profiled: Any = None
    cache: Any = None


SHARDINGS = {"on": ("fsdp",), "off": ("ddp",), "auto": ("fsdp", "ddp")}


def dp_shard(args: tuple[Any, ...], kwargs: dict[str, Any], dp: int
             ) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """The first tp group's share of the batch (``ConfigError`` naming ``--dp`` where ``dp``
    does not divide it)."""
    from autoplace.emit.train.microbatch import split_batch
    from autoplace.errors import AutoplaceError

    try:
        return split_batch(args, kwargs, dp, what="data-parallel groups")[0]
    except AutoplaceError as exc:
        raise ConfigError(f"{{parallel.dp={dp}}}: {exc}") from None


def over_dp(cluster: Cluster, group: tuple[str, ...], sharding: str | None,
            mesh: Mesh | None, optimizer: str) -> Any:
    """What the data-parallel dimension adds to rank 0's step (``sharding`` over the ``group``
    of devices that hold its part, one from each tp group), as ``tensor_step_problem``'s
    ``data_parallel``: FSDP2's gathers, reduce-scatters and shards (``train.sharded``) or the
    gradients' averaging (``train.dataparallel``), by the ring formulas or, where the devices
    are this machine's profiled CPU workers, measured on gloo processes (``_averaging_s``);
    ``None`` without a mesh."""
    from autoplace.train.dataparallel import with_allreduce
    from autoplace.train.sharded import with_fsdp

    if mesh is None or sharding is None:
        return None
    groups = [(name,) for name in group]

    def priced(step: Problem) -> Problem:
        measured = _averaging_s(step, cluster, groups, sharding, mesh, optimizer)
        if sharding == "fsdp":
            return with_fsdp(step, cluster, groups, measured_s=measured)
        return with_allreduce(step, cluster, groups, measured_s=measured)

    return priced


def _averaging_s(step: Problem, cluster: Cluster, groups: list[tuple[str, ...]], sharding: str,
                 mesh: Mesh, optimizer: str) -> float | None:
    """What averaging rank 0's gradients over the ``groups`` adds to its step, measured on
    gloo processes of this host (``profile.allreduce``: bucketed all-reduces, or FSDP2 by
    unit with ``optimizer``'s update) for the float32 elements each of the step's forward
    nodes trains (rank 0's shards: a node's parameters as one tensor), where every device is
    a profiled CPU worker; ``None`` elsewhere, or when it fails (the ring formulas then)."""
    from autoplace.pipeline.measured import measured_averaging
    from autoplace.simulate.schedules import phase_of
    from autoplace.train.sharded import fsdp_units

    trained = [(n.name, n.trainable_bytes // 4) for n in step.graph.nodes
               if phase_of(n.name)[1] == "forward" and n.trainable_bytes]
    numels: Any = [numel for _, numel in trained]
    mode = "buckets"
    if sharding == "fsdp":
        unit_of = fsdp_units(step.graph)
        by_unit: dict[str | None, list[int]] = {}
        for name, numel in trained:
            by_unit.setdefault(unit_of.get(name), []).append(numel)
        mode, numels = "fsdp", [v for k, v in by_unit.items() if k is not None] + [
            by_unit.get(None, [])]
    found = measured_averaging(mesh.profiled, cluster, groups, numels, mode=mode,
                               cache=mesh.cache, optimizer=optimizer)
    if found is None:
        return None
    note(f"dp {len(groups)} of the tensor-parallel mesh, {sharding} over gloo processes here: "
         f"{found[0] * 1e3:.3f} ms a step measured for rank 0's shards")
    return found[0]


def stretch(ranks: int) -> float:
    """How much longer each of ``ranks`` single-threaded processes of this host takes where
    they outnumber its cores: every rank busy at once, each gets cores / ranks of one (gloo's
    copies and sums run on the same cores); 1 where each has a core of its own."""
    from autoplace.cluster.local import cores_here

    cores = cores_here()
    if ranks <= cores:
        return 1.0
    note(f"the {ranks} ranks are processes of this host, which has {cores} cores: they share "
         f"them, so rank 0's step is priced at {ranks / cores:.2f}x its time on a core of its "
         "own")
    return ranks / cores


def stretched(problem: Problem, stretch: float) -> Problem:
    """``problem`` with every node's time ``stretch`` times as long."""
    if stretch == 1.0:
        return problem
    return replace(problem, costs=replace(problem.costs, compute_s={
        name: {d: t * stretch for d, t in per.items()}
        for name, per in problem.costs.compute_s.items()}))


def renamed(split: Mapping[str, tuple[str, int]], model: Any) -> dict[str, tuple[str, int]]:
    """``split`` (of ``traced`` emitted as one segment, ``seg0.<name>``) named as ``model``
    (the same emitted in several) holds each parameter: ``seg<i>.<name>``."""
    where = {name.split(".", 1)[1]: name for name, _ in model.named_parameters()}
    return {where[name.split(".", 1)[1]]: how for name, how in split.items()}


def mesh_plan(record: TensorParallelRecord, rank0: Problem, schedule: Schedule, *, name: str,
              tracer: str, dtype: str, traced_ops: int, status: str = NO_PLACEMENT_FITS
              ) -> Plan:
    """The plan where no placement fits and the tensor-parallel candidate ``record`` does: its
    problem and schedule rank 0's (``rank0``, on its one device; every rank runs its mirror),
    its solver ``MESH_SOLVER`` with no lower bound proven (``Plan.gap`` is ``None``; its
    ``wall_s`` the caller's to set; ``status``: ``formats.plan.unplaced``'s), no
    baselines (none fits), a training plan's step one rank's, and its check the mesh's on gloo
    ranks. ``traced_ops``: the ops traced, of which rank 0's problem holds its share."""
    import datetime as _dt

    return Plan(
        problem=rank0, schedule=schedule, lower_bound_s=0.0,
        solver=SolverRecord(name=MESH_SOLVER, wall_s=0.0,
                            status=status),
        baselines={}, best_single_device=None, model=name, tracer=tracer,
        coarsening=Coarsening(traced_ops=traced_ops, plan_nodes=len(rank0.graph.nodes)),
        verification=Verification(
            status="passed", max_abs_diff=record.max_abs_diff,
            detail=f"the mesh's {record.world} gloo ranks gave the original's "
            + ("losses, gradients and parameters" if record.optimizer else "outputs"))
        if record.check == "passed" else Verification(detail="the mesh was not run"),
        training=TrainingRecord(optimizer=record.optimizer, dtype=dtype, microbatches=1,
                                schedule="gpipe", replicas=1)
        if record.optimizer is not None else None,
        created=_dt.datetime.now(_dt.UTC).isoformat(timespec="seconds"))


def mesh_faster(placed: Plan, rank0: Problem, schedule: Schedule, *, name: str, tracer: str,
                dtype: str, traced_ops: int) -> Plan:
    """The plan of a training step whose mesh (``placed.tensor_parallel``, weighed first; its
    rank 0 ``rank0`` and ``schedule``) fits and is faster than the placement ``placed`` that
    was solved (its lower bound was below the mesh's step; its step is not): the mesh
    (``mesh_plan``, ``PLACEMENT_SLOWER``), the placement among its baselines ("placement (R
    replicas)"; the replica counts tried in its training record), whose emitted model the
    pipeline drops."""
    record, replicas = placed.tensor_parallel, placed.training.replicas or 1
    said = f"placement ({replicas} replica{'s' if replicas > 1 else ''})"
    note(f"the {said} steps in {placed.makespan_s * 1e3:.3f} ms, the mesh in "
         f"{record.makespan_s * 1e3:.3f} ms: the plan is the mesh, and the placement is among "
         f"its baselines ({said!r})")
    made = mesh_plan(record, rank0, schedule, name=name, tracer=tracer, dtype=dtype,
                     traced_ops=traced_ops, status=PLACEMENT_SLOWER)
    return replace(made, tensor_parallel=record,
                   solver=replace(made.solver, wall_s=placed.solver.wall_s),  # its solve's
                   baselines={said: BaselineResult.of(placed.schedule)},
                   training=replace(made.training,
                                    replica_options=placed.training.replica_options))


def dp_values(cluster: Cluster, config: Config, args: tuple[Any, ...],
               kwargs: dict[str, Any]) -> list[int]:
    """The data-parallel degrees to weigh: 1 without ``parallel.dp``, its value, or for
    ``auto`` 1 (tp on the leading devices) and each mesh of every device that a tp degree
    leaves (devices / tp, 2 or more, dividing the batch; a note names one that does not)."""
    dp = config.parallel.dp
    if dp is None or isinstance(dp, int):
        return [dp or 1]
    count, values = len(cluster.devices), [1]
    for degree in tensor_degrees(cluster, config.parallel.tp):
        groups = count // degree
        if count % degree or groups < 2 or groups in values:
            continue
        try:
            dp_shard(args, kwargs, groups)
        except ConfigError as refused:
            note(f"dp {groups} x tp {degree} not weighed (--dp auto): {refused}")
            continue
        values.append(groups)
    return values


def tensor_degrees(cluster: Cluster, ranks: int | str, *, dp: int = 1) -> list[int]:
    """The degrees to weigh: ``[ranks]`` (its devices, ``dp`` groups of them, checked by
    ``tensor_devices``), or for ``"auto"`` every degree of 2 or more that divides the number
    of leading devices alike on the first's host (its type and memory: a tp group's
    collectives sit on the critical path, and stay inside a host's NVLink domain, as
    Megatron-LM and torchtitan keep them); with ``dp`` > 1 the one that makes a mesh of every
    device, where they are alike and each group is on one host."""
    if ranks != "auto":
        tensor_devices(cluster, int(ranks), dp=dp)
        return [int(ranks)]
    devices = cluster.devices
    if dp > 1:  # the mesh of every device
        size = len(devices) // dp
        return [size] if size >= 2 and size * dp == len(devices) and len(
            {(d.type, d.memory_bytes) for d in devices}) == 1 and all(
            len({d.host for d in devices[i:i + size]}) == 1
            for i in range(0, len(devices), size)) else []
    first = devices[0]
    alike = next((i for i, d in enumerate(devices) if (d.type, d.memory_bytes, d.host)
                  != (first.type, first.memory_bytes, first.host)), len(devices))
    return [d for d in range(2, alike + 1) if alike % d == 0]


def tensor_devices(cluster: Cluster, ranks: int, *, dp: int = 1) -> tuple[Device, ...]:
    """The first ``ranks`` devices of ``cluster`` (with ``dp`` > 1 every device, a dp x
    ``ranks`` mesh in rank order, their product the devices' count), which must be alike;
    else ``ConfigError``."""
    devices = cluster.devices
    if dp > 1 and dp * ranks != len(devices):
        fits = [f"--dp {d} --tp {len(devices) // d}" for d in range(2, len(devices) // 2 + 1)
                if len(devices) % d == 0]
        raise ConfigError(f"{{parallel.dp={dp}}} x {{parallel.tp={ranks}}} make a mesh of "
                          f"{dp * ranks} ranks, and the cluster has {len(devices)} devices: "
                          "choose degrees whose product is the devices' count"
                          + (f" ({', '.join(fits)})" if fits else ""))
    if ranks > len(devices):
        raise ConfigError(f"{{parallel.tp={ranks}}} asks for more ranks than the "
                          f"{len(devices)} devices: choose at most {len(devices)}")
    chosen = devices[:ranks * dp]
    if len({(d.type, d.memory_bytes) for d in chosen}) > 1:
        raise ConfigError(f"{{parallel.tp={ranks}}} splits every op evenly, and "
                          f"{', '.join(d.name for d in chosen)} are not alike: plan it on "
                          "devices of one type")
    return chosen

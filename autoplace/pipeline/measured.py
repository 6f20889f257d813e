"""What a training step's plan measures where its devices are here (``step.plan_step``): the
backward against the forward and the forward with autograd recording (``backward_factors``),
the optimizer's update (``update_rates``) and what the replicas' averaging adds
(``replica_averaging``: DDP's all-reduce, or FSDP2's collectives), each once per kind of device
(``per_kind``); a device not profiled here keeps the analytic figures."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any, TypeVar

import torch

from autoplace.ir import Cluster, Problem
from autoplace.pipeline.forward import Tracing
from autoplace.progress.notes import note
from autoplace.train.graph import model_bytes
from autoplace.train.sharded import fsdp_units, unit_of

__all__ = ["backward_factors", "measured_averaging", "per_kind", "replica_averaging",
           "unit_numels", "update_rates"]

T = TypeVar("T")


def backward_factors(profiled: Any, model: torch.nn.Module, args: tuple[Any, ...],
                      kwargs: dict[str, Any], cluster: Cluster
                      ) -> tuple[dict[str, float], dict[str, float]]:
    """The backward's time over the forward's, measured through autograd on each profiled
    device (one measurement per kind of device), for ``train.step_problem``, and the whole
    forward pass's seconds there with autograd recording, for
    ``train.updates.with_measured_forward``."""
    if profiled is None:
        return {}, {}
    from autoplace.profile.backward import measure_training_passes

    passes = per_kind(profiled, cluster, lambda torch_device: measure_training_passes(
        model, args, kwargs, torch_device))
    factors = {d: p.backward_factor for d, p in passes.items()}
    forwards = {d: p.forward_s for d, p in passes.items()}
    if factors:
        note("backward measured through autograd: " + ", ".join(
            f"{f:.2f}x the forward on {d}" for d, f in factors.items())
            + " (the analytic model's 2x elsewhere)")
        note("forward measured whole, with autograd recording: " + ", ".join(
            f"{s * 1e3:.3f} ms on {d}" for d, s in forwards.items())
            + " (the training step's forward nodes scaled to it)")
    return factors, forwards


def update_rates(profiled: Any, model: torch.nn.Module, args: tuple[Any, ...],
                  kwargs: dict[str, Any], cluster: Cluster, *,
                  optimizer: str) -> dict[str, float]:
    """The optimizer's update measured through ``torch.optim`` on each profiled device (one
    measurement per kind of device, after the forward and backward of ``args``/``kwargs``),
    in seconds per byte of trainable parameters, for ``train.updates.with_measured_updates``."""
    if profiled is None:
        return {}
    from autoplace.profile.update import measure_update_s_per_byte

    def measure(torch_device: str) -> float | None:
        return measure_update_s_per_byte(model, args, kwargs, optimizer=optimizer,
                                         torch_device=torch_device)

    rates = {d: r for d, r in per_kind(profiled, cluster, measure).items() if r is not None}
    if rates:
        _, trained = model_bytes(model)
        note(f"{optimizer} update measured through torch.optim: " + ", ".join(
            f"{r * trained * 1e3:.3f} ms for all {trained} trainable bytes on {d}"
            for d, r in rates.items()) + " (the roofline elsewhere)")
    return rates


def replica_averaging(profiled: Any, model: torch.nn.Module, cluster: Cluster,
                       groups: Sequence[Sequence[str]], how: Tracing, *,
                       microbatches: int, sharding: str = "ddp", optimizer: str = "adam",
                       forward: Problem | None = None) -> float | None:
    """What averaging ``model``'s gradients across the ``groups`` adds to a step, measured
    with the replicas as processes of this host (``profile.allreduce``: under DDP, or with
    micro-batches ``train.dataparallel.average_gradients``, or with ``sharding="fsdp"`` FSDP2
    on the units of ``forward``'s graph with ``optimizer``'s update), where every device of
    every group is a CPU device profiled here; ``None`` elsewhere or when it cannot be
    measured (the ring formulas of ``train.dataparallel`` and ``train.sharded`` price it
    then)."""
    if profiled is None:
        return None
    numels: Any = [p.numel() for p in model.parameters() if p.requires_grad]
    mode = "ddp" if microbatches == 1 else "buckets"
    if sharding == "fsdp":
        assert forward is not None
        mode, numels = "fsdp", unit_numels(model, forward)
    found = measured_averaging(profiled, cluster, groups, numels, mode=mode,
                               cache=how.cache, optimizer=optimizer)
    if found is None:
        return None
    seconds, cached = found
    way = {"ddp": "DistributedDataParallel", "buckets": "bucketed all-reduces",
           "fsdp": f"FSDP2's gathers, reduce-scatters and sharded {optimizer} update"}[mode]
    note(f"gradients averaged across {len(groups)} replicas ({way}, gloo over "
         f"127.0.0.1) measured{' before' if cached else ''}: {seconds * 1e3:.3f} ms a "
         "step for the model's gradients, charged to the updates by bytes")
    return seconds


def measured_averaging(profiled: Any, cluster: Cluster, groups: Sequence[Sequence[str]],
                       numels: Any, *, mode: str, cache: Any = None, optimizer: str = "adam"
                       ) -> tuple[float, bool] | None:
    """``profile.allreduce.allreduce_s`` of ``numels`` over the ``groups`` as processes of
    this host (``mode``: ``ddp``, ``buckets`` or ``fsdp``, with ``optimizer``'s update),
    kept in ``cache`` (the default one where ``None``), with whether it came from there:
    where every device of every group is a CPU device ``profiled`` here; ``None`` elsewhere,
    or when it cannot be measured (a note says why: the ring formulas price it then)."""
    if profiled is None:
        return None
    here = {dp.device: dp.device_key for dp in profiled.devices}
    if not all(d in here and cluster.device(d).torch_device.startswith("cpu")
               for g in groups for d in g):
        return None
    from autoplace.profile import open_cache
    from autoplace.profile.allreduce import allreduce_s

    try:
        return allreduce_s(numels, replicas=len(groups), mode=mode,
                           cache=cache if cache is not None else open_cache(),
                           device_key=here[groups[0][0]],
                           optimizer=optimizer if mode == "fsdp" else None)
    except Exception as exc:  # noqa: BLE001 - the ring formula still prices it
        note(f"the gradients' averaging across {len(groups)} groups ({mode}) could not be "
             f"measured ({type(exc).__name__}: {exc}); the ring formula prices it")
        return None


def unit_numels(model: torch.nn.Module, forward: Problem) -> list[list[int]]:
    """The trainable parameters' sizes of ``model`` grouped by FSDP unit as ``forward``'s graph
    has them (``train.sharded.fsdp_units``, by each parameter's module), the root's last."""
    kept = {u for u in fsdp_units(forward.graph).values() if u is not None}
    by_unit: dict[str | None, list[int]] = {}
    for name, param in model.named_parameters():
        if param.requires_grad:
            unit = unit_of(name.rpartition(".")[0])
            by_unit.setdefault(unit if unit in kept else None, []).append(param.numel())
    return [numels for unit, numels in by_unit.items() if unit is not None] + [
        by_unit.get(None, [])]


def per_kind(profiled: Any, cluster: Cluster, measure: Callable[[str], T]) -> dict[str, T]:
    """``measure(torch_device)`` for each profiled device, once per kind of device (its
    ``device_key``: alike devices share the figure), by device name."""
    by_key: dict[str, T] = {}
    found: dict[str, T] = {}
    for dp in profiled.devices:
        if dp.device_key not in by_key:
            by_key[dp.device_key] = measure(cluster.device(dp.device).torch_device)
        found[dp.device] = by_key[dp.device_key]
    return found

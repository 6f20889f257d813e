"""The recipes practitioners write by hand, scored by the plan's one simulator and kept among a
training plan's baselines (``recipe_baselines``): DDP and FSDP2 over every device (a replica a
device), Megatron-style (tp over a host's devices, its NVLink domain; dp over the hosts, the
gradients averaged) and torchtitan's FSDP + TP (the same mesh, FSDP2 over dp). Each is read off
what the plan weighed, its replica counts (``ReplicaOption``, ``pipeline.step``) and its meshes
(``pipeline.tensor.Weighed``), not priced again; one that was not weighed is a baseline that
did not run, saying which flags weigh it. FSDP + TP + PP (a 3-D mesh) is not built yet: said."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from autoplace.formats.plan import BaselineResult
from autoplace.formats.records import ReplicaOption
from autoplace.ir import Cluster

__all__ = ["RECIPE", "recipe_baselines", "recipes_said"]

RECIPE = "recipe: "  # the baselines' names begin so


def recipe_baselines(found: Sequence[Any], options: Sequence[ReplicaOption], cluster: Cluster
                     ) -> dict[str, BaselineResult]:
    """Each recipe on ``cluster`` by name (``RECIPE`` first), as the meshes ``found``
    (``pipeline.tensor.Weighed``, one per dp degree) and the replica counts ``options`` of the
    plan's own step priced it."""
    devices = cluster.devices
    count = len(devices)
    recipes = {f"{RECIPE}{label} ({count} replicas)": _replicas(options, count, sharding)
               for sharding, label in (("ddp", "DDP"), ("fsdp", "FSDP"))}
    tp = sum(1 for d in devices if d.host == devices[0].host)
    if tp < 2 or count % tp:
        return recipes
    dp = count // tp
    if dp == 1:
        recipes[f"{RECIPE}Megatron-style (tp {tp})"] = _mesh(found, 1, tp, None)
        return recipes
    mesh = f"dp {dp} x tp {tp}"
    recipes[f"{RECIPE}Megatron-style ({mesh}, DDP)"] = _mesh(found, dp, tp, "ddp")
    recipes[f"{RECIPE}FSDP + TP ({mesh})"] = _mesh(found, dp, tp, "fsdp")
    recipes[f"{RECIPE}FSDP + TP + PP"] = BaselineResult.of(
        None, not_run="not built yet: a pp x tp mesh with a dp dimension (--pp with --dp)")
    return recipes


def recipes_said(recipes: dict[str, BaselineResult]) -> str:
    """The recipes' note: each one's step (or why it has none), for the text summary, whose
    baselines table says "not run" without the reason."""
    def said(result: BaselineResult) -> str:
        if result.not_run is not None:
            return result.not_run
        if result.makespan_s is None:
            return "fits no device"
        return f"{result.makespan_s * 1e3:.3f} ms" + ("" if result.feasible else
                                                       ", over memory")

    return ("recipes written by hand, scored by the same simulator (plan.json's baselines "
            "\"recipe: ...\"): " + "; ".join(f"{name[len(RECIPE):]}: {said(result)}"
                                             for name, result in recipes.items()))


def _replicas(options: Sequence[ReplicaOption], count: int, sharding: str) -> BaselineResult:
    """``count`` replicas of one device each holding the model as ``sharding`` says, as the
    plan's replica counts found them."""
    option = next((o for o in options if o.replicas == count and o.sharding == sharding), None)
    if option is None:
        return BaselineResult.of(None, not_run=(
            f"not weighed: {count} replicas were not among the plan's replica counts (the "
            "batch must divide into them; the notes say why)" if not any(
                o.replicas == count for o in options) else
            "not weighed: FSDP replicas of a count are weighed where its whole ones do not "
            "fit (--fsdp auto), or always with --fsdp on" if sharding == "fsdp" else
            "not weighed: --fsdp on weighs only sharded replicas"))
    if option.bound_s is not None:
        return BaselineResult.of(None, not_run=(
            f"not solved: its step takes at least {option.bound_s * 1e3:.3f} ms (a lower "
            "bound), no less than the mesh's"))
    return BaselineResult(makespan_s=option.step_s, feasible=option.fits)


def _mesh(found: Sequence[Any], dp: int, tp: int, sharding: str | None) -> BaselineResult:
    """The dp x ``tp`` mesh with ``sharding`` over dp (``None``: no dp), as ``found`` priced
    it."""
    for weighed in found:
        if weighed is None or weighed.record.dp != dp:
            continue
        priced = weighed.degrees.get(tp)
        if priced is None:
            continue
        if sharding is None:
            record = priced.record
            return BaselineResult(makespan_s=record.makespan_s, feasible=record.fits,
                                  peak_bytes={record.devices[0]: record.peak_bytes})
        if sharding not in priced.shardings:
            return BaselineResult.of(None, not_run=(
                f"not weighed: --fsdp {'on' if sharding == 'fsdp' else 'off'} leaves it out"))
        step_s, over = priced.shardings[sharding]
        return BaselineResult(makespan_s=step_s, feasible=not over)
    flags = f"--tp {tp}" + (f" --dp {dp}" if dp > 1 else "")
    return BaselineResult.of(None, not_run=(
        f"not weighed: {flags} (or --tp auto" + (" --dp auto" if dp > 1 else "")
        + ") weighs it, where DTensor can run that degree (the notes say why one was not)"))

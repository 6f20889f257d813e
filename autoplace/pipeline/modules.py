"""The pipeline at module granularity (``--granularity module``): a Hugging Face ``device_map``.

trace_modules -> cost -> solve (every candidate, accelerate's own maps among them, scored by
the one simulator) -> ``device_map``. No fx graph is made, so no partitioned model is emitted:
the artefact is ``OUT/device_map.json``, which ``from_pretrained(..., device_map=...)`` and
``accelerate.dispatch_model`` take unchanged, beside ``plan.json`` and the report. Costs are
analytic (``cost_models``' roofline per module: its FLOPs and the bytes it reads and writes).

``plan_modules`` returns a ``Plan`` whose ``device_map`` holds the plan's map and accelerate's
(for the report), and ``pipeline.save`` writes the map beside ``plan.json``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import replace
from typing import Any

import torch

from autoplace.config import Config
from autoplace.emit.files.hf_device_map import check_units_fit, device_map, uncovered
from autoplace.errors import ConfigError, EmitError
from autoplace.formats.plan import Plan
from autoplace.formats.records import AccelerateMapRecord, Coarsening, DeviceMapRecord
from autoplace.ir import Cluster, Placement, Problem
from autoplace.pipeline.generation import cache_on_modules, cache_overflow
from autoplace.pipeline.record import min_gain, plan_of, unpinned_record
from autoplace.profile.cost import costs as cost_nodes
from autoplace.progress import stage
from autoplace.solve import solve
from autoplace.solve.baselines.accelerate import (
    NOT_INSTALLED,
    AccelerateMap,
    accelerate_available,
    accelerate_maps,
    baselines_on,
)
from autoplace.solve.pins import pin_costs, pins_note, resolve_unit_pins
from autoplace.trace import cache_off
from autoplace.trace.load import normalize_inputs
from autoplace.trace.modules import INPUT, ModuleTrace, module_units, trace_modules
from cost_models.units import format_bytes

__all__ = ["plan_modules"]


MODULE_NOTE = ("--granularity module: whole modules placed, costed analytically from one forward "
               "pass; the artefact is device_map.json (for from_pretrained's or "
               "dispatch_model's device_map), no partitioned model is emitted or verified")


def plan_modules(model: torch.nn.Module, example_inputs: Any, config: Config) -> Plan:
    """Plan ``model`` module by module as ``config`` says (``autoplace.plan`` with
    ``granularity="module"`` calls this) and return the ``Plan`` with its ``device_map``.
    ``config.no_split``: module classes kept whole (default: ``model._no_split_modules``).
    Raises ``InfeasibleError`` naming the module when one kept whole fits no device.
    ``config.pins`` (a partial ``device_map``, say) fix those modules' nodes to those devices
    (``pins.resolve_unit_pins``: a pin inside a module kept whole pins it whole); the solver
    places the rest, the model is also solved without them, and ``Plan.pins`` says what they
    cost."""
    options, threshold, no_split, pins = (config.solving.options(), config.solve.min_gain,
                                          config.no_split, config.pins)
    cluster, found = config.devices.resolve()
    notes: list[str] = [*found, MODULE_NOTE]
    args, kwargs = normalize_inputs(example_inputs, where="example_inputs")
    model.eval()
    off = cache_off(model, kwargs)  # as the op-level plan does; --generate counts the cache
    notes += [off] if off and config.generate is None else []
    if no_split is not None:
        _check_classes(model, no_split)
    tree = module_units(model, None if no_split is None else tuple(no_split))
    check_units_fit(tree.param_bytes, tree.tied, {u.name: u.cls for u in tree.found.values()},
                    cluster, tree.no_split)  # before running the model: a clear error at once
    stage("trace")
    traced = trace_modules(model, args, kwargs, name=config.name, tree=tree)
    notes += traced.notes
    cache: dict[str, int] = {}
    if config.generate is not None:  # each layer's key-value cache, where it will live
        graph, cache = cache_on_modules(traced.graph, model, args, kwargs,
                                        new_tokens=config.generate)
        traced = replace(traced, graph=graph)
    free = Problem(graph=traced.graph, cluster=cluster, costs=cost_nodes(traced.graph, cluster))
    resolved = resolve_unit_pins(model, traced.graph, cluster, pins, {
        n: u.aliases for n, u in traced.units.items()}) if pins else None
    problem = free if resolved is None else Problem(
        graph=free.graph, cluster=cluster, costs=pin_costs(free.costs, resolved.device_of_op))
    if resolved is not None:
        notes.append(pins_note(resolved, cluster.names, "module nodes"))
    stage("solve")
    found, maps = _accelerate(model, traced, cluster)
    extra, map_notes = baselines_on(problem, found)
    notes += map_notes if accelerate_available() else [NOT_INSTALLED]
    result, gain = min_gain(solve(problem, options=options, extra_baselines=extra), threshold)
    notes += result.notes
    if config.generate is not None:
        notes += _cache_notes(problem, result.schedule.placement, extra, cache,
                              new_tokens=config.generate)
    planned = plan_of(result, problem, name=config.name, tracer="modules",
                      coarsening=Coarsening(traced_ops=len(traced.graph.nodes) - 1,
                                            plan_nodes=len(traced.graph.nodes)))
    mapping = device_map({n: u.aliases for n, u in traced.units.items()},
                         result.schedule.placement.device_of, cluster)
    missing = uncovered(model, mapping)
    if missing:  # every parameter and buffer is in some unit: a miss is autoplace's bug
        raise EmitError(f"the device_map leaves {len(missing)} tensor(s) unplaced, "
                        f"{', '.join(missing[:3])}: please report this")
    return replace(planned, notes=tuple(notes), min_gain=gain,
                   pins=None if resolved is None else unpinned_record(
                       resolved, free, found, options, threshold), device_map=DeviceMapRecord(
        map=mapping, no_split=tuple(traced.no_split), accelerate=maps,
        input_device=result.schedule.placement.device_of[INPUT]))


def _cache_notes(problem: Problem, placement: Placement, maps: Mapping[str, Placement],
                 cache: Mapping[str, int], *, new_tokens: int) -> list[str]:
    """What ``--generate`` adds to a device_map plan: the cache each device holds under the
    plan, and by how much each of accelerate's maps overflows once it is counted."""
    per_device: dict[str, int] = {}
    for node, size in cache.items():
        device = placement.device_of[node]
        per_device[device] = per_device.get(device, 0) + size
    said = [f"--generate {new_tokens}: the key-value cache (prompt + {new_tokens} tokens) is "
            "counted with the parameters of the module that writes it: "
            + ", ".join(f"{format_bytes(b)} on {d}" for d, b in per_device.items())]
    for name, other in maps.items():
        over = cache_overflow(problem, other)
        said.append(f"{name} with the cache counted: " + (
            "fits" if not over else "over by " + ", ".join(
                f"{format_bytes(b)} on {d}" for d, b in over.items())
            + " before any activation"))
    return said


def _check_classes(model: torch.nn.Module, no_split: Sequence[str]) -> None:
    """A ``--no-split`` class the model does not use is a typo, not a request."""
    classes = sorted({type(m).__name__ for m in model.modules()})
    unknown = [c for c in no_split if c not in classes]
    if unknown:
        raise ConfigError(
            f"{{no_split}} names {', '.join(unknown)}, which no module of the model is: its "
            f"module classes are {', '.join(classes)}")


def _accelerate(model: torch.nn.Module, traced: ModuleTrace, cluster: Cluster
                ) -> tuple[tuple[AccelerateMap, ...], dict[str, AccelerateMapRecord]]:
    """accelerate's maps (with the same no-split classes), and the maps themselves for the
    report (with the reason where one is not a placement here)."""
    if not accelerate_available():
        return (), {}
    found = accelerate_maps(model, traced.graph, cluster, no_split=traced.no_split)
    return found, {m.name: AccelerateMapRecord(map=dict(m.device_map), note=m.note)
                   for m in found}

"""Hugging Face accelerate's own device maps as baselines: the tool a user would pick instead.

accelerate's ``infer_auto_device_map`` assigns whole modules to devices by parameter size, filling
GPU 0, then 1, ... (``device_map="sequential"``), or first capping each GPU at an even share with
``get_balanced_memory`` (``"balanced"``), as transformers' ``from_pretrained`` does
(``transformers.integrations.accelerate._get_device_map``). Given the plan's devices, memory limits
and the model's ``_no_split_modules``, its map becomes a placement the simulator scores like any
baseline: each op on the device of the longest key prefixing its module path; an op no key covers
(a parent's glue, which accelerate's hooks run where its inputs are) where its first input is, and
one with no input (an ``arange``) on the map's first device, where accelerate's top hook moves
inputs. A map offloading to a ``cpu`` or ``disk`` the cluster lacks is reported, not used.

Read ``accelerate_maps`` (accelerate's maps, each op's device), then ``on_graph`` (the same on a
coarsened graph) and ``accelerate_baselines`` (both, for ``solve``'s ``extra_baselines``).
accelerate is optional (the ``examples``, ``dev`` extras): without it, a note.
"""

from __future__ import annotations

import contextlib
import importlib.util
import logging
from collections.abc import Container, Iterator, Mapping, Sequence
from dataclasses import dataclass

import torch

from autoplace.ir import Cluster, OpGraph, Placement, Problem
from autoplace.progress.notes import note, note_all
from autoplace.solve.baselines.heuristics import majority_devices

__all__ = ["ACCELERATE_STRATEGIES", "AccelerateMap", "accelerate_available",
           "NOT_INSTALLED", "accelerate_baselines", "accelerate_maps", "baselines_on",
           "covering_key", "device_keys", "on_graph"]

# Baseline names, each with whether it balances first (get_balanced_memory) as "balanced" does.
ACCELERATE_STRATEGIES = {"accelerate-sequential": False, "accelerate-balanced": True}


def accelerate_available() -> bool:
    return importlib.util.find_spec("accelerate") is not None


@dataclass(frozen=True)
class AccelerateMap:
    """One of accelerate's maps: its own ``device_map`` (module -> accelerate device key), and
    each traced op's device in the cluster, or ``None`` with the reason in ``note``."""

    name: str
    device_map: Mapping[str, int | str]
    device_of_op: Mapping[str, str] | None
    note: str | None = None


def covering_key(path: str, keys: Container[str]) -> str | None:
    """The deepest of ``keys`` (module paths, ``""`` the whole model) that covers the module or
    tensor ``path``: itself or a module it is under, as a ``device_map``'s keys cover; ``None``
    where none does."""
    parts = path.split(".") if path else []
    for i in range(len(parts), -1, -1):
        key = ".".join(parts[:i])
        if key in keys:
            return key
    return None


def device_keys(cluster: Cluster) -> dict[int | str, str]:
    """accelerate's device key -> cluster device: GPUs are integers in the cluster's order (as
    ``cuda:N`` is N), a CPU is ``"cpu"``."""
    keys: dict[int | str, str] = {}
    for device in cluster.devices:
        if device.torch_device.startswith("cpu"):
            keys.setdefault("cpu", device.name)
        else:
            keys[sum(isinstance(k, int) for k in keys)] = device.name
    return keys


@contextlib.contextmanager
def _quiet() -> Iterator[None]:
    """accelerate warns that the planned GPUs are "not available" here: planning for devices
    that are not here is the point, so its warnings are silenced while it runs."""
    logger = logging.getLogger("accelerate")
    level = logger.level
    logger.setLevel(logging.ERROR)
    try:
        yield
    finally:
        logger.setLevel(level)


def no_split_classes(model: torch.nn.Module) -> list[str]:
    """The module classes accelerate must keep whole: transformers models list them."""
    return sorted(getattr(model, "_no_split_modules", None) or [])


def accelerate_maps(model: torch.nn.Module, graph: OpGraph, cluster: Cluster, *,
                    no_split: Sequence[str] | None = None) -> tuple[AccelerateMap, ...]:
    """accelerate's sequential and balanced maps of ``model`` for ``cluster``'s devices and
    memory limits, each op of the traced ``graph`` placed by its module path. ``no_split``:
    the classes kept whole (default: the model's, ``no_split_classes``)."""
    from accelerate.utils import get_balanced_memory, infer_auto_device_map

    keys = device_keys(cluster)
    limits = {key: cluster.device(name).memory_bytes for key, name in keys.items()}
    no_split = no_split_classes(model) if no_split is None else list(no_split)
    maps: list[AccelerateMap] = []
    for name, balanced in ACCELERATE_STRATEGIES.items():
        max_memory = dict(limits)
        try:
            with _quiet():
                if balanced:
                    max_memory = get_balanced_memory(model, max_memory=max_memory,
                                                     no_split_module_classes=no_split)
                device_map = infer_auto_device_map(model, max_memory=max_memory,
                                                   no_split_module_classes=no_split)
        except Exception as exc:  # noqa: BLE001 - accelerate's own failure, reported as such
            # accelerate 1.16 raises IndexError in get_module_size_with_ties for BERT's tied
            # decoder once a device holds the whole model: its map is missing, the plan is not.
            maps.append(AccelerateMap(name, {}, None, note=(
                f"{name}: accelerate's infer_auto_device_map failed ({type(exc).__name__}: "
                f"{exc}); not a baseline")))
            continue
        outside = sorted({str(v) for v in device_map.values() if v not in keys})
        if outside:
            moved = [m or "(the whole model)" for m, v in device_map.items() if v not in keys]
            maps.append(AccelerateMap(name, device_map, None, note=(
                f"{name} offloads {len(moved)} module(s) ({', '.join(moved[:3])}"
                f"{', ...' if len(moved) > 3 else ''}) to {', '.join(outside)}, which is not a "
                "device of this cluster: the weights do not fit the devices' limits its way; "
                "not a baseline")))
            continue
        maps.append(AccelerateMap(name, device_map,
                                  _device_of_op(graph, device_map, keys)))
    return tuple(maps)


def _device_of_op(graph: OpGraph, device_map: Mapping[str, int | str],
                  keys: Mapping[int | str, str]) -> dict[str, str]:
    """Each op's device: its module's longest key, else its first input's device, else the
    map's first device (see the module docstring)."""
    first = keys[next(iter(device_map.values()))]
    device_of: dict[str, str] = {}
    for node in graph.nodes:  # topological order: an op's inputs are placed before it
        key = covering_key(node.module, device_map)
        if key is not None:
            device_of[node.name] = keys[device_map[key]]
            continue
        inputs = graph.in_edges(node.name)
        device_of[node.name] = device_of[inputs[0].src] if inputs else first
    return device_of


def on_graph(problem: Problem, device_of_op: Mapping[str, str]) -> tuple[Placement | None, str]:
    """The placement of ``problem``'s (possibly coarsened) nodes that ``device_of_op`` implies,
    and what had to give: a node whose ops accelerate splits goes where most of its ops are.
    ``None`` when a node would land on a device where it cannot run."""
    # accelerate keeps tied parameters together too, as the colocation groups do.
    device_of = majority_devices(problem, {n.name: n.ops for n in problem.graph.nodes},
                                 device_of_op)
    split = sum(len({device_of_op[op] for op in n.ops}) > 1 for n in problem.graph.nodes)
    banned = [n for n, d in device_of.items() if d not in problem.allowed[n]]
    if banned:
        return None, (f"places {banned[0]!r} on {device_of[banned[0]]}, where it cannot run; "
                      "not a baseline")
    return Placement(device_of=device_of), (
        f"{split} of {len(problem.graph.nodes)} coarse nodes straddle its split; each went "
        "where most of its ops are" if split else "")


NOT_INSTALLED = ("accelerate is not installed: its device maps are not among the baselines "
                 "(pip install 'autoplace[examples]')")


def baselines_on(problem: Problem, maps: Sequence[AccelerateMap]
                 ) -> tuple[dict[str, Placement], list[str]]:
    """accelerate's ``maps`` (``accelerate_maps``' answer) as ``solve``'s ``extra_baselines``
    for ``problem`` (whose nodes' ops are ops of the graph the maps were made for), and the
    notes a user must see: a map that is no placement here (it offloads, or it puts a node
    where it cannot run, such as against a pin) is no baseline."""
    placements: dict[str, Placement] = {}
    notes: list[str] = []
    for found in maps:
        if found.device_of_op is None:
            notes.append(found.note or f"{found.name}: not a baseline")
            continue
        placement, why = on_graph(problem, found.device_of_op)
        if why:
            notes.append(f"{found.name} {why}")
        if placement is not None:
            placements[found.name] = placement
    return placements, notes


def accelerate_baselines(model: torch.nn.Module, graph: OpGraph, problem: Problem
                         ) -> tuple[dict[str, Placement], tuple[AccelerateMap, ...]]:
    """accelerate's maps of ``model`` (traced as ``graph``) on ``problem``'s cluster, as
    ``baselines_on`` ``problem`` gives them (its notes to the open collector,
    ``progress.notes``), and the maps themselves (to score on another problem of the same
    graph without making them again)."""
    if not accelerate_available():
        note(NOT_INSTALLED)
        return {}, ()
    maps = accelerate_maps(model, graph, problem.cluster)
    extra, found = baselines_on(problem, maps)
    note_all(found)
    return extra, maps

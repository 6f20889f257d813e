"""A module-granularity plan as a Hugging Face ``device_map``: module name -> device.

The format is the one ``transformers``' ``from_pretrained(..., device_map=...)`` and
accelerate's ``dispatch_model`` take: keys are module names (``""`` for the whole model), values
a GPU index (an ``int``, the ``N`` of ``cuda:N``) or ``"cpu"``. A planned device is named by its
index among the cluster's GPUs (as accelerate's own maps name them, ``solve.accelerate``), so on
a machine with those GPUs the map loads as planned; ``remapped`` turns every device into one
(``"cpu"``) to load it on a machine without them.

Read ``device_map`` (the plan's map, every name a unit goes by), then ``uncovered`` (the
parameters and buffers no key covers: none, or it is a bug) and ``check_units_fit`` (the error
for a unit no device can hold).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch

from autoplace.errors import InfeasibleError
from autoplace.ir import Cluster, OpGraph
from autoplace.solve.accelerate import device_keys

__all__ = ["check_units_fit", "device_map", "remapped", "uncovered"]


def device_map(units: Mapping[str, Iterable[str]], device_of: Mapping[str, str],
               cluster: Cluster) -> dict[str, int | str]:
    """The ``device_map`` of a placement: each unit (``units``: node name -> every module name
    it goes by) under each of its names, on its node's device as accelerate names it."""
    key_of = {device: key for key, device in device_keys(cluster).items()}
    return {alias: key_of[device_of[name]]
            for name, aliases in units.items() for alias in aliases}


def remapped(mapping: Mapping[str, int | str], device: int | str = "cpu") -> dict[str, int | str]:
    """``mapping`` with every module on ``device``: to load a plan where its GPUs are not."""
    return {module: device for module in mapping}


def uncovered(model: torch.nn.Module, mapping: Mapping[str, int | str]) -> list[str]:
    """The ``state_dict`` entries of ``model`` that no key of ``mapping`` covers (a key covers
    itself and everything under ``key.``), as accelerate's ``check_device_map`` requires."""
    keys = set(mapping)
    if "" in keys:
        return []
    missing = []
    for name in model.state_dict(keep_vars=True):
        parts = name.split(".")
        if not any(".".join(parts[:i]) in keys for i in range(1, len(parts) + 1)):
            missing.append(name)
    return missing


def check_units_fit(graph: OpGraph, classes: Mapping[str, str], cluster: Cluster,
                    no_split: Iterable[str]) -> None:
    """Raise ``InfeasibleError`` naming the first module (with its colocated, tied ones) whose
    parameters and buffers no device of ``cluster`` can hold, with the bytes."""
    room = {d.name: d.memory_bytes - d.reserved_bytes for d in cluster.devices}
    largest = max(room, key=room.__getitem__)
    kept = set(no_split)
    for node in graph.nodes:
        group = graph.colocation_of[node.name]
        if node.name != group[0]:
            continue
        need = sum(graph.node(n).param_bytes for n in group)
        if need <= room[largest]:
            continue
        cls = classes.get(node.name, "")
        why = (f"a {cls}, which --no-split keeps whole" if cls in kept
               else f"a {cls} without submodules to split it into" if cls else "the model")
        tied = f" (with {', '.join(group[1:])}, which share its weights)" if len(group) > 1 else ""
        raise InfeasibleError(
            f"module {node.name or '(the whole model)'!r}{tied} needs {need:,} bytes of "
            f"parameters and buffers ({why}), but the largest device, {largest}, holds "
            f"{room[largest]:,} bytes beside its runtime reserve: a device_map places a module "
            f"whole, so add a device with more memory"
            + (f", or pass --no-split without {cls} to split it into its submodules"
               if cls in kept else ", or plan at op granularity (--granularity op)"))

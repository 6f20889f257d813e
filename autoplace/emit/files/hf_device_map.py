"""A module-granularity plan as a Hugging Face ``device_map``: module name -> device.

The format is the one ``transformers``' ``from_pretrained(..., device_map=...)`` and
accelerate's ``dispatch_model`` take: keys are module names (``""`` for the whole model), values
a GPU index (an ``int``, the ``N`` of ``cuda:N``) or ``"cpu"``. A planned device is named by its
index among the cluster's GPUs (as accelerate's own maps name them,
``solve.baselines.accelerate``), so on a machine with those GPUs the map loads as planned;
``remapped`` turns every device into one (``"cpu"``) to load it on a machine without them.

Read ``device_map`` (the plan's map, every name a unit goes by), then ``uncovered`` (the
parameters and buffers no key covers: none, or it is a bug) and ``check_units_fit`` (the error
for a unit no device can hold).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping

import torch
from networkx.utils import UnionFind

from autoplace.errors import InfeasibleError
from autoplace.ir import Cluster
from autoplace.solve.baselines.accelerate import covering_key, device_keys

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
    return [name for name in model.state_dict(keep_vars=True)
            if covering_key(name, keys) is None]


def check_units_fit(param_bytes: Mapping[str, int], tied: Iterable[Iterable[str]],
                    classes: Mapping[str, str], cluster: Cluster,
                    no_split: Iterable[str]) -> None:
    """Raise ``InfeasibleError`` naming the first unit (with the units tied to it) whose
    parameters and buffers (``param_bytes``) no device of ``cluster`` can hold, with the bytes.
    ``classes``: each unit's class, in the model's order."""
    room = {d.name: d.memory_bytes - d.reserved_bytes for d in cluster.devices}
    largest = max(room, key=room.__getitem__)
    kept = set(no_split)
    sets = UnionFind(classes)
    for group in tied:
        sets.union(*group)
    groups: dict[str, list[str]] = {}
    for name in classes:
        groups.setdefault(sets[name], []).append(name)
    for group in groups.values():
        need = sum(param_bytes.get(n, 0) for n in group)
        if need <= room[largest]:
            continue
        name = max(group, key=lambda n: param_bytes.get(n, 0))
        cls = classes[name]
        why = (f"a {cls}, which --no-split keeps whole" if cls in kept
               else f"a {cls}, which has no submodules to split it into")
        others = [n for n in group if n != name]
        tied_text = (f" (with {', '.join(others)}, which share its weights)" if others else "")
        raise InfeasibleError(
            f"module {name or '(the whole model)'!r}{tied_text} needs {need:,} bytes of "
            f"parameters and buffers ({why}), but the largest device, {largest}, holds "
            f"{room[largest]:,} bytes beside its runtime reserve: a device_map places a module "
            f"whole, so add a device with more memory"
            + (f", or pass --no-split without {cls} to split it into its submodules"
               if cls in kept else ", or plan at op granularity (--granularity op)"))

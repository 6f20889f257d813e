"""Manual pins mixed with automatic placement: some modules fixed to a device, the rest solved.

A pin names a module as ``model.named_modules()`` does (``model.layers.0``; ``0`` in an
``nn.Sequential``) and a device of the cluster: its name (``cuda:1``), its torch device, or as
in a Hugging Face ``device_map`` an integer (the i-th GPU) or ``"cpu"``. Pins come from
``--pin MODULE=DEVICE`` (``parse_pins``), a partial ``device_map`` JSON (``read_pin_map``), or
``Config(pins={...})``; ``merge_pins`` joins them (``docs/cli.md``, "Pins").

``resolve_pins`` turns them into a device for each traced op (the op's module is the pinned one
or inside it; the deepest pinned module wins, as in a ``device_map``), extended to the op's
colocation group (tied weights); ``resolve_unit_pins`` does the same for a module-level graph
(``--granularity module``), where a pin inside a module kept whole pins it whole and pins that
would split it are an error. ``pin_costs`` then makes every other device's time infinite, as a
task graph's ``"pinned"`` does (``formats.graph``), so every later stage (folding, coarsening,
solvers, baselines, bounds, the memory diagnosis) sees pins as the devices a node may run on.
"""

from __future__ import annotations

import difflib
import json
import math
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

from autoplace.errors import PinError
from autoplace.ir import Cluster, Costs, OpGraph
from autoplace.solve.baselines.accelerate import covering_key, device_keys

__all__ = ["Pins", "merge_pins", "parse_pins", "pin_costs", "pin_list", "read_pin_map",
           "resolve_pins", "resolve_unit_pins"]

PinSpec = Mapping[str, "str | int"]


@dataclass(frozen=True)
class Pins:
    """Pins resolved on a traced graph: each pinned module's device (by cluster name), and the
    device of every op they fix."""

    modules: Mapping[str, str]
    device_of_op: Mapping[str, str]


def parse_pins(texts: Iterable[str]) -> dict[str, str | int]:
    """``["model.layers.0=cuda:1", "lm_head=cpu"]`` as a mapping; a module given twice with
    different devices is an error. A bare integer device is the i-th GPU, as in a
    ``device_map``."""
    pins: dict[str, str | int] = {}
    for text in texts:
        module, sep, device = text.partition("=")
        module, device = module.strip(), device.strip()
        if not sep or not device:
            raise PinError(f"--pin {text!r}: write MODULE=DEVICE, e.g. --pin model.layers.0=cuda:1"
                           " (MODULE as in model.named_modules(), DEVICE a planned device)")
        _add(pins, module, int(device) if device.isdigit() else device, where="--pin")
    return pins


def read_pin_map(path: str | Path) -> dict[str, str | int]:
    """A partial Hugging Face-style ``device_map`` JSON file: ``{"model.embed_tokens": 0,
    "lm_head": "cpu"}``."""
    try:
        data = json.loads(Path(path).read_text())
    except OSError as exc:
        raise PinError(f"--pin-map {str(path)!r} cannot be read: {exc.strerror or exc}") from exc
    except json.JSONDecodeError as exc:
        raise PinError(f"--pin-map {str(path)!r} is not JSON: {exc.msg} at line {exc.lineno}; "
                       'write {"MODULE": DEVICE, ...}') from exc
    if not isinstance(data, dict) or not all(
            isinstance(v, (str, int)) and not isinstance(v, bool) for v in data.values()):
        raise PinError(f"--pin-map {str(path)!r} must be a JSON object of module names to "
                       'devices (an integer GPU index or a device name), e.g. '
                       '{"model.embed_tokens": 0, "lm_head": "cpu"}')
    return dict(data)


def merge_pins(*sources: PinSpec | None) -> dict[str, str | int]:
    """The pins of every source; a module pinned by two to different devices is an error
    (``_add``)."""
    pins: dict[str, str | int] = {}
    for source in sources:
        for module, device in (source or {}).items():
            _add(pins, module, device, where="pins")
    return pins


def _add(pins: dict[str, str | int], module: str, device: str | int, *, where: str) -> None:
    if module in pins and pins[module] != device:
        raise PinError(f"{where}: module {module!r} is pinned twice, to {pins[module]!r} and to "
                       f"{device!r}: pin each module once")
    pins[module] = device


def _device_name(device: str | int, cluster: Cluster) -> str:
    """The cluster name of a pin's device: a name, a torch device, or the i-th GPU, numbered
    as device_map.json and accelerate's maps number them
    (``solve.baselines.accelerate.device_keys``)."""
    gpus = [name for key, name in device_keys(cluster).items() if isinstance(key, int)]
    if isinstance(device, int):
        if 0 <= device < len(gpus):
            return gpus[device]
    else:
        for d in cluster.devices:
            if device in (d.name, d.torch_device):
                return d.name
    valid = list(cluster.names) + [f"{i} (= {g})" for i, g in enumerate(gpus)]
    raise PinError(f"pin to unknown device {device!r}: the planned devices are "
                   f"{', '.join(valid)}; pin to one of them, or plan with that device "
                   "(--devices)")


def _inside(op_module: str, module: str) -> bool:
    return module == "" or op_module == module or op_module.startswith(module + ".")


def _resolve_modules(model: torch.nn.Module, cluster: Cluster, pins: PinSpec) -> dict[str, str]:
    """Each pinned module's device by cluster name; an unknown module or device is an error."""
    known = [name for name, _ in model.named_modules()]
    modules: dict[str, str] = {}
    for module, device in pins.items():
        if module not in known:
            close = difflib.get_close_matches(module, known, n=3, cutoff=0.6)
            hint = f"did you mean {', '.join(map(repr, close))}?" if close else (
                f"modules include {', '.join(map(repr, known[1:6]))}")
            raise PinError(f"pin of unknown module {module!r}: {hint} (names as in "
                           "model.named_modules())")
        modules[module] = _device_name(device, cluster)
    return modules


def _deepest_first(modules: Mapping[str, str]) -> list[str]:
    return sorted(modules, key=lambda m: (m.count(".") + bool(m), m), reverse=True)


def _finish(graph: OpGraph, modules: dict[str, str], device_of_op: dict[str, str],
            pinned_by: dict[str, str], applied: set[str] | None = None) -> Pins:
    """Every pin must fix something (``applied``: the pins used, by default those in
    ``pinned_by``); then the pins spread to the colocation groups."""
    used = set(pinned_by.values()) if applied is None else applied
    empty = [m for m in modules if m not in used]
    if empty:
        raise PinError(f"pinned module {empty[0]!r} runs no op in the traced forward pass: "
                       "pin a module the forward calls")
    _spread_to_colocated(graph, device_of_op, pinned_by)
    return Pins(modules=modules, device_of_op=device_of_op)


def _within(module: str, unit: str) -> bool:
    """``module`` is strictly inside ``unit``."""
    return module != unit and (unit == "" or module.startswith(unit + "."))


def resolve_pins(model: torch.nn.Module, graph: OpGraph, cluster: Cluster,
                 pins: PinSpec) -> Pins:
    """Each pinned module's device, and each op's: the deepest pinned module holding it. Ops
    that share a parameter (a colocation group) share a pin; two pins that split one are an
    error."""
    modules = _resolve_modules(model, cluster, pins)
    device_of_op: dict[str, str] = {}
    pinned_by: dict[str, str] = {}
    for node in graph.nodes:
        if node.is_input:
            continue
        module = covering_key(node.module, modules)
        if module is not None:
            device_of_op[node.name], pinned_by[node.name] = modules[module], module
    return _finish(graph, modules, device_of_op, pinned_by)


def resolve_unit_pins(model: torch.nn.Module, graph: OpGraph, cluster: Cluster,
                      pins: PinSpec, aliases: Mapping[str, Sequence[str]]) -> Pins:
    """``resolve_pins`` on a module-level graph (``trace_modules``: one node per module kept
    whole, ``aliases`` its names). A node is pinned by the deepest pin holding it, as an op is;
    a pin inside a node's module (a submodule of a no-split layer) pins the whole node, and
    pins that would put parts of one node on different devices are an error naming both."""
    modules = _resolve_modules(model, cluster, pins)
    by_depth = _deepest_first(modules)
    device_of_op: dict[str, str] = {}
    pinned_by: dict[str, str] = {}
    applied: set[str] = set()
    for node in graph.nodes:
        if node.is_input:
            continue
        names = aliases.get(node.name) or (node.module,)
        outer = next((m for m in by_depth if any(_inside(n, m) for n in names)), None)
        inner = [m for m in by_depth if any(_within(m, n) for n in names)]
        covering = [*inner, *([outer] if outer is not None else [])]
        split = [m for m in covering if modules[m] != modules[covering[0]]] if covering else []
        if split:
            raise PinError(
                f"pins split module {node.name or '(whole model)'!r}, which the device_map "
                f"keeps whole (--no-split, or a module holding tensors itself): "
                f"{covering[0]!r} on "
                f"{modules[covering[0]]} and {split[0]!r} on {modules[split[0]]}; pin them to "
                f"one device, or pin {node.name or '(whole model)'!r} itself")
        if covering:
            device_of_op[node.name], pinned_by[node.name] = modules[covering[0]], covering[0]
            applied.update(covering)
    return _finish(graph, modules, device_of_op, pinned_by, applied)


def _spread_to_colocated(graph: OpGraph, device_of_op: dict[str, str],
                         pinned_by: dict[str, str]) -> None:
    """Pin every member of a colocation group (ops reading one parameter, such as tied
    embeddings) where a member is pinned."""
    for group in graph.colocate:
        devices = {device_of_op[m]: m for m in group if m in device_of_op}
        if len(devices) > 1:
            (a, op_a), (b, op_b) = list(devices.items())[:2]
            raise PinError(
                f"pins split ops that share a parameter (tied weights): {pinned_by[op_a]!r} "
                f"on {a} and {pinned_by[op_b]!r} on {b}; pin them to one device")
        if devices:
            (device, op), = devices.items()
            for member in group:
                if member not in device_of_op:
                    device_of_op[member], pinned_by[member] = device, pinned_by[op]


def pin_costs(costs: Costs, device_of_op: Mapping[str, str]) -> Costs:
    """``costs`` with each pinned op's time infinite on every other device (how a task graph's
    ``"pinned"`` is read, ``formats.graph``)."""
    if not device_of_op:
        return costs
    compute_s = {
        node: ({d: (t if d == device_of_op[node] else math.inf) for d, t in per.items()}
               if node in device_of_op else per)
        for node, per in costs.compute_s.items()}
    return Costs(compute_s=compute_s, source=costs.source, device_source=costs.device_source,
                 host=costs.host)


def pin_list(modules: Mapping[str, str]) -> str:
    """``"model.0 -> cuda:0, (whole model) -> cpu"``: pinned modules and their devices."""
    return ", ".join(f"{m or '(whole model)'} -> {d}" for m, d in modules.items())


def pins_note(pins: Pins, devices: Sequence[str], what: str = "traced ops") -> str:
    """The plan's note: which modules were pinned where, and how many ops (``what``: module
    nodes at module granularity) that fixed."""
    return (f"pinned by hand: {pin_list(pins.modules)} ({len(pins.device_of_op)} {what} "
            f"fixed); the solver placed the rest on {', '.join(devices)}")

"""What the report says about a module-granularity plan's Hugging Face ``device_map``, as data.

The plan's map sits next to accelerate's own maps (sequential and balanced, with the same
no-split classes), each scored by the one simulator with activations counted: its makespan,
its peak per device against the capacity, and where it overflows and by how much (accelerate
sizes its maps by weights alone, so its map can fit its own accounting and still run out of
memory once logits and other activations count). Then the maps module by module, runs of
consecutive modules placed alike merged into one row. Read ``device_map_facts``.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from autoplace.formats.plan import Plan
from autoplace.solve.baselines.accelerate import covering_key, device_keys

__all__ = ["DeviceMapFacts", "MapColumn", "device_map_facts"]

PLAN = "autoplace"


@dataclass(frozen=True)
class MapColumn:
    """One map scored: ``makespan_s`` ``None`` (with ``note``) where it is not a placement on
    these devices; ``over`` lists ``(device, bytes over capacity)``."""

    name: str
    makespan_s: float | None
    peak_bytes: Mapping[str, int]
    over: tuple[tuple[str, int], ...]
    note: str | None = None


@dataclass(frozen=True)
class MapRow:
    """A run of consecutive modules (``first`` .. ``last``, ``count`` of them) and the device
    each map gives them (``None`` where a map does not place them)."""

    first: str
    last: str
    count: int
    devices: tuple[str | None, ...]

    @property
    def cells(self) -> tuple[str, ...]:
        return tuple(d or "" for d in self.devices)

    @property
    def label(self) -> str:
        first = self.first or "(the whole model)"
        return first if self.count == 1 else f"{first} … {self.last} ({self.count})"


@dataclass(frozen=True)
class DeviceMapFacts:
    columns: tuple[MapColumn, ...]
    rows: tuple[MapRow, ...]
    no_split: tuple[str, ...]


def _over(peak_bytes: Mapping[str, int], capacity: Mapping[str, int]) -> tuple[tuple[str, int],
                                                                                 ...]:
    return tuple((d, b - capacity[d]) for d, b in peak_bytes.items() if b > capacity[d])


def _device_of(mapping: Mapping[str, Any], module: str, names: Mapping[Any, str]) -> str | None:
    """The device ``mapping`` gives ``module``: its longest covering key's, by cluster name
    (``cpu``/``disk`` offloads as accelerate names them)."""
    key = covering_key(module, mapping)
    return None if key is None else names.get(mapping[key], str(mapping[key]))


def device_map_facts(plan: Plan) -> DeviceMapFacts | None:
    """The device_map section of ``plan``'s report; ``None`` for an op-granularity plan."""
    if plan.device_map is None:
        return None
    cluster = plan.problem.cluster
    capacity = {d.name: d.memory_bytes for d in cluster.devices}
    s = plan.schedule
    columns = [MapColumn(PLAN, s.makespan_s, dict(s.peak_bytes), _over(s.peak_bytes, capacity))]
    maps = {PLAN: plan.device_map.map}
    for name, found in plan.device_map.accelerate.items():
        maps[name] = found.map
        b = plan.baselines.get(name)
        if b is None or b.makespan_s is None:
            columns.append(MapColumn(name, None, {}, (), note=found.note or "absent"))
            continue
        columns.append(MapColumn(name, b.makespan_s, dict(b.peak_bytes),
                                 _over(b.peak_bytes, capacity)))
    names = device_keys(cluster)
    rows: list[MapRow] = []
    for module in plan.device_map.map:
        devices = tuple(_device_of(m, module, names) for m in maps.values())
        if rows and rows[-1].devices == devices:
            last = rows[-1]
            rows[-1] = MapRow(last.first, module, last.count + 1, devices)
        else:
            rows.append(MapRow(module, module, 1, devices))
    return DeviceMapFacts(columns=tuple(columns), rows=tuple(rows),
                          no_split=plan.device_map.no_split)

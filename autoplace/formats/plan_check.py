"""Checking a plan dictionary (the content of a ``plan.json``): the JSON Schema in
``plan.schema.json``, then the cross-references a schema cannot state (every device a node
names exists, ...). Each problem names its JSON path (``plan.nodes[2].device: ...``).

Read ``plan_problems`` first; ``validate_plan_dict`` raises on them. ``autoplace.formats.plan``
reads files with them.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from autoplace.formats import schema

__all__ = ["count_problems", "load_schema", "plan_problems", "validate_plan_dict"]


def load_schema() -> dict[str, Any]:
    """The plan.json JSON Schema (draft 2020-12) shipped as package data."""
    return schema.load_schema("plan.schema.json")


def plan_problems(plan: Mapping[str, Any]) -> list[str]:
    """Every problem with ``plan``, each naming its path; empty when the plan is valid. Schema
    problems come first; the cross-references are checked only once the schema holds, since
    they assume its shape."""
    problems = [f"{schema.json_path(e.absolute_path, root='plan')}: {e.message}"
                for e in schema.schema_errors(plan, "plan.schema.json")]
    return problems or _reference_problems(plan)


def validate_plan_dict(plan: Mapping[str, Any]) -> None:
    """Raise ``ValueError`` naming the path of each problem if ``plan`` is not a valid plan.

    Checks the JSON Schema first, then the cross-references a schema cannot state: nodes, links,
    transfers and memory entries name devices that exist; edges, transfers and colocation groups
    name nodes that exist; every node has a duration on its own device.
    """
    problems = plan_problems(plan)
    if problems:
        shown = problems[:8]
        more = (
            f"\n  ... and {len(problems) - len(shown)} more" if len(problems) > len(shown) else ""
        )
        raise ValueError(
            f"plan is invalid ({count_problems(problems)}):\n  " + "\n  ".join(shown) + more
        )


def count_problems(problems: list[str]) -> str:
    """``"1 problem"``, ``"3 problems"``."""
    return f"{len(problems)} problem{'s' if len(problems) != 1 else ''}"



class _References:
    """Collects the problems of names that point nowhere, each with its path."""

    def __init__(self, plan: Mapping[str, Any]) -> None:
        self.devices = [d["name"] for d in plan["devices"]]
        self.known_devices = set(self.devices)
        self.nodes = {n["name"] for n in plan["nodes"]}
        self.problems: list[str] = []

    def device(self, where: str, name: str) -> None:
        if name not in self.known_devices:
            self.problems.append(
                f"{where}: {name!r} is not one of the devices ({', '.join(self.devices)})")

    def node(self, where: str, name: str) -> None:
        if name not in self.nodes:
            self.problems.append(f"{where}: {name!r} is not a node of the plan")


def _reference_problems(plan: Mapping[str, Any]) -> list[str]:
    refs = _References(plan)
    if len(refs.known_devices) != len(refs.devices):
        refs.problems.append(f"plan.devices: device names must be unique, got {refs.devices}")
    for i, n in enumerate(plan["nodes"]):
        refs.device(f"plan.nodes[{i}].device", n["device"])
        if n["device"] not in n["compute_s"]:
            refs.problems.append(
                f"plan.nodes[{i}].compute_s: no duration for its device {n['device']!r}")
    for i, link in enumerate(plan["links"]):
        refs.device(f"plan.links[{i}].src", link["src"])
        refs.device(f"plan.links[{i}].dst", link["dst"])
    for i, e in enumerate(plan["edges"]):
        refs.node(f"plan.edges[{i}].src", e["src"])
        refs.node(f"plan.edges[{i}].dst", e["dst"])
    for i, t in enumerate(plan["transfers"]):
        refs.node(f"plan.transfers[{i}].src", t["src"])
        refs.device(f"plan.transfers[{i}].src_device", t["src_device"])
        refs.device(f"plan.transfers[{i}].dst_device", t["dst_device"])
    _group_and_row_references(plan, refs)
    return refs.problems


def _group_and_row_references(plan: Mapping[str, Any], refs: _References) -> None:
    for i, group in enumerate(plan["colocate"]):
        for j, name in enumerate(group):
            refs.node(f"plan.colocate[{i}][{j}]", name)
    for name in plan["memory"]:
        refs.device(f"plan.memory.{name}", name)
    if "launch_order" in plan and sorted(plan["launch_order"]) != sorted(refs.nodes):
        refs.problems.append("plan.launch_order: must list every node of the plan once")
    for part in ("call_s", "handover_s", "own_thread", "switch_s"):
        for name in plan.get("host", {}).get(part, {}):
            refs.device(f"plan.host.{part}.{name}", name)
    for i, row in enumerate(plan.get("whatif", ())):
        for j, name in enumerate(row["devices"]):
            refs.device(f"plan.whatif[{i}].devices[{j}]", name)

"""Checking a plan dictionary: the JSON Schema in ``schema/plan.schema.json`` plus the
cross-references a schema cannot express (every device a node names exists, ...), and reading a
``plan.json`` for ``autoplace report`` with errors a user can act on.

Read ``validate_plan_dict`` first; ``read_plan_file`` wraps it for the command line.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from importlib import resources
from pathlib import Path
from typing import Any

from autoplace.errors import OutputError

__all__ = ["load_schema", "read_plan_file", "validate_plan_dict"]

_PACKAGE_DIR = Path(__file__).resolve().parents[1]


def load_schema() -> dict[str, Any]:
    """The plan.json JSON Schema (draft 2020-12) shipped as package data."""
    try:
        # One joinpath per component: a namespace package's MultiplexedPath takes only one.
        path: Any = resources.files("autoplace").joinpath("schema").joinpath("plan.schema.json")
        text = path.read_text(encoding="utf-8")
    except (OSError, TypeError):
        # Python 3.11's namespace-package reader rejects the placeholder path entry that an
        # editable install adds (NotADirectoryError); the file sits in the package anyway.
        text = (_PACKAGE_DIR / "schema" / "plan.schema.json").read_text(encoding="utf-8")
    return json.loads(text)


def plan_problems(plan: Mapping[str, Any]) -> list[str]:
    """Every problem with ``plan``, each naming its path (``plan.nodes[2].device: ...``); empty
    when the plan is valid. Schema problems come first; the cross-references are checked only
    once the schema holds, since they assume its shape."""
    import jsonschema

    validator = jsonschema.Draft202012Validator(load_schema())
    errors = sorted(validator.iter_errors(plan), key=lambda e: [str(p) for p in e.absolute_path])
    problems = [f"{_json_path(e.absolute_path)}: {e.message}" for e in errors]
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
            f"plan is invalid ({_count(problems)}):\n  " + "\n  ".join(shown) + more
        )


def read_plan_file(path: str | os.PathLike[str]) -> tuple[Path, dict[str, Any]]:
    """Read and check ``path`` (a ``plan.json``, or the directory holding one).

    Returns the file's path and its content. A missing file, a file that is not JSON and a plan
    the schema rejects each raise ``OutputError`` with a one-paragraph message.
    """
    given = Path(path)
    plan_path = given / "plan.json" if given.is_dir() else given
    try:
        text = plan_path.read_text(encoding="utf-8")
    except FileNotFoundError as exc:
        raise OutputError(f"no plan file at {str(plan_path)!r}: pass a plan.json written by "
                          "`autoplace plan`, or the directory that holds it") from exc
    except (OSError, UnicodeDecodeError) as exc:
        raise OutputError(f"cannot read the plan file {str(plan_path)!r}: {exc}") from exc
    try:
        data = json.loads(text)
    except json.JSONDecodeError as exc:
        raise OutputError(f"{str(plan_path)!r} is not JSON ({exc}); pass a plan.json written by "
                          "`autoplace plan`, or run `autoplace plan` again to rewrite it") from exc
    if not isinstance(data, dict):
        raise OutputError(f"{str(plan_path)!r} holds a JSON {type(data).__name__}, not a plan "
                          "object; pass a plan.json written by `autoplace plan`")
    problems = plan_problems(data)
    if problems:
        shown = "; ".join(problems[:3]) + ("; ..." if len(problems) > 3 else "")
        raise OutputError(f"{str(plan_path)!r} is not a valid plan ({_count(problems)}: {shown}); "
                          "run `autoplace plan` again to rewrite it")
    return plan_path, data


def _count(problems: list[str]) -> str:
    return f"{len(problems)} problem{'s' if len(problems) != 1 else ''}"


def _json_path(path: Iterable[Any]) -> str:
    out = "plan"
    for part in path:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def _reference_problems(plan: Mapping[str, Any]) -> list[str]:
    devices = [d["name"] for d in plan["devices"]]
    known_devices = set(devices)
    nodes = {n["name"] for n in plan["nodes"]}
    listed = ", ".join(devices)
    problems: list[str] = []

    def device(where: str, name: str) -> None:
        if name not in known_devices:
            problems.append(f"{where}: {name!r} is not one of the devices ({listed})")

    def node(where: str, name: str) -> None:
        if name not in nodes:
            problems.append(f"{where}: {name!r} is not a node of the plan")

    if len(known_devices) != len(devices):
        problems.append(f"plan.devices: device names must be unique, got {devices}")
    for i, n in enumerate(plan["nodes"]):
        device(f"plan.nodes[{i}].device", n["device"])
        if n["device"] not in n["compute_s"]:
            problems.append(
                f"plan.nodes[{i}].compute_s: no duration for its device {n['device']!r}"
            )
    for i, link in enumerate(plan["links"]):
        device(f"plan.links[{i}].src", link["src"])
        device(f"plan.links[{i}].dst", link["dst"])
    for i, e in enumerate(plan["edges"]):
        node(f"plan.edges[{i}].src", e["src"])
        node(f"plan.edges[{i}].dst", e["dst"])
    for i, t in enumerate(plan["transfers"]):
        node(f"plan.transfers[{i}].src", t["src"])
        device(f"plan.transfers[{i}].src_device", t["src_device"])
        device(f"plan.transfers[{i}].dst_device", t["dst_device"])
    for i, group in enumerate(plan["colocate"]):
        for j, name in enumerate(group):
            node(f"plan.colocate[{i}][{j}]", name)
    for name in plan["memory"]:
        device(f"plan.memory.{name}", name)
    for i, row in enumerate(plan.get("whatif", ())):
        for j, name in enumerate(row["devices"]):
            device(f"plan.whatif[{i}].devices[{j}]", name)
    return problems

"""Golden plans: ``plan.json`` of every example and of six benchmark graphs, planned with
``--deterministic``, must stay what it was when the files in ``tests/golden/`` were recorded.

A restructure that "changes no result" is checked here: the recorded files come from the code
before it. What may differ is listed in ``_VOLATILE`` (timestamps, wall-clock times, the
version, the verification's float rounding) and fields added since (a key absent from the
recorded file is not compared). Notes may gain entries, never lose one. Floats compare to a
relative 1e-9: a sum taken in another order is not a different plan.

Re-record, after a change that is meant to change plans, with
``AUTOPLACE_UPDATE_GOLDEN=1 python -m pytest tests/test_golden.py`` and say why in the commit.
"""

from __future__ import annotations

import json
import math
import os
import sys
from pathlib import Path
from typing import Any

import pytest

from autoplace.cli import main
from autoplace.config import Solve

ROOT = Path(__file__).resolve().parents[1]
GOLDEN = Path(__file__).resolve().parent / "golden"
sys.path.insert(0, str(ROOT / "benchmarks"))
import benchdata  # noqa: E402
import scaling  # noqa: E402

DATA = benchdata.benchdata_dir()
UPDATE = os.environ.get("AUTOPLACE_UPDATE_GOLDEN") == "1"
# Keys whose values depend on the clock or the install, wherever they appear; and the emitted
# model's float rounding against the original's (``max_abs_diff``, and ``detail``, which quotes
# it), which depends on torch's intra-op thread count (a test that ran before may have changed
# it), not on the plan: ``verification.status`` is still compared.
_VOLATILE = {"created", "autoplace_version", "wall_s", "t_s", "max_abs_diff", "detail"}

EXAMPLES = {
    "mlp": "2xA100-40GB",
    "lenet": "2xA100-40GB,2xT4-16GB",
    "gpt2": "2xA100-40GB",
    "inception": "2xA100-40GB",
}
# Benchmark graphs: (kind, input, device count or objective). Chosen to cover the exact model,
# the throughput objective with contiguity, and a graph large enough to be coarsened.
GRAPHS = {
    "stg-rand0000-p4": ("stg", "rand0000", 4),
    "stg-rand0118-p8": ("stg", "rand0118", 8),
    "tarnawski-bert3-latency": ("tarnawski",
                                "latency-inputs/OperatorGraphs/bert_l-3_inference.json",
                                "latency"),
    "tarnawski-bert24-throughput": ("tarnawski",
                                    "throughput-inputs/LayerGraphs/bert24_inference.json",
                                   "throughput"),
    "tarnawski-gnmt-training-contiguous": ("tarnawski",
                                           "throughput-inputs/LayerGraphs/gnmt_training.json",
                                      "contiguous"),
    "scaling-1000": ("scaling", "1000", 0),
}


def _compare(golden: Any, got: Any, path: str = "plan") -> list[str]:
    """Differences between ``golden`` and ``got``, each naming its path."""
    if isinstance(golden, dict):
        if not isinstance(got, dict):
            return [f"{path}: expected an object, got {got!r}"]
        out = []
        for key, value in golden.items():
            if key in _VOLATILE:
                continue
            if key not in got:
                out.append(f"{path}.{key}: missing")
            else:
                out += _compare(value, got[key], f"{path}.{key}")
        return out
    if isinstance(golden, list):
        if path.endswith(".notes"):
            return [f"{path}: lost note {note!r}" for note in golden if note not in got]
        if not isinstance(got, list) or len(got) != len(golden):
            return [f"{path}: expected {len(golden)} items, got "
                    f"{len(got) if isinstance(got, list) else got!r}"]
        return [d for i, (a, b) in enumerate(zip(golden, got))
                for d in _compare(a, b, f"{path}[{i}]")]
    if isinstance(golden, float) and isinstance(got, int | float) and not isinstance(got, bool):
        return [] if math.isclose(golden, got, rel_tol=1e-9, abs_tol=1e-15) else [
            f"{path}: {golden!r} -> {got!r}"]
    return [] if golden == got else [f"{path}: {golden!r} -> {got!r}"]


def _check(name: str, data: dict) -> None:
    path = GOLDEN / f"{name}.json"
    if UPDATE:
        path.parent.mkdir(exist_ok=True)
        path.write_text(json.dumps(data, indent=1, sort_keys=True) + "\n")
        return
    golden = json.loads(path.read_text())
    differences = _compare(golden, data)
    assert not differences, f"{name}: plan.json differs from {path.name}:\n" + "\n".join(
        differences[:20])


def test_compare_catches_a_changed_plan() -> None:
    golden = {"makespan_s": 1.0, "created": "x", "nodes": [{"device": "a"}], "notes": ["n"]}
    assert _compare(golden, {"makespan_s": 1.0 + 1e-12, "created": "y",
                             "nodes": [{"device": "a", "new": 1}], "notes": ["n", "m"]}) == []
    assert _compare(golden, {"makespan_s": 1.01, "nodes": [{"device": "b"}], "notes": []}) == [
        "plan.makespan_s: 1.0 -> 1.01", "plan.nodes[0].device: 'a' -> 'b'",
        "plan.notes: lost note 'n'"]


@pytest.mark.parametrize("example", sorted(EXAMPLES))
def test_example_plan_unchanged(example: str, tmp_path: Path) -> None:
    out = tmp_path / "out"
    assert main(["plan", str(ROOT / "examples" / f"{example}.py"), "--devices",
                 EXAMPLES[example], "--out", str(out), "--deterministic", "--no-profile",
                 "--time-limit", "4"]) == 0
    _check(f"example-{example}", json.loads((out / "plan.json").read_text()))


def _graph_problem(kind: str, source: str):
    if kind == "stg":
        return benchdata.stg_problem(DATA / "stg50" / f"{source}.stg", 0)
    if kind == "tarnawski":
        return benchdata.tarnawski_problem(benchdata.load_tarnawski(
            DATA / "tarnawski2020" / source))
    return scaling.random_problem(int(source))


@pytest.mark.parametrize("name", sorted(GRAPHS))
def test_benchmark_graph_plan_unchanged(name: str) -> None:
    if not DATA.is_dir():
        if os.environ.get("CI") == "true":
            pytest.fail(f"no benchmark data at {DATA}: CI must have ../shared/benchdata")
        pytest.skip(f"no benchmark data at {DATA}")
    from autoplace.pipeline import solve_graph

    kind, source, option = GRAPHS[name]
    if kind == "stg":
        problem = benchdata.stg_problem(DATA / "stg50" / f"{source}.stg", option)
    else:
        problem = _graph_problem(kind, source)
    objective = "throughput" if option in ("throughput", "contiguous") else "latency"
    planned = solve_graph(problem, Solve(objective=objective, contiguous=option == "contiguous",
                                         time_limit_s=4.0, deterministic=True))
    _check(f"graph-{name}", planned.to_dict())

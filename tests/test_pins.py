"""Manual pins mixed with automatic placement (``autoplace.solve.pins``, ``--pin``, ``--pin-map``):
the tutorial's MLP (784-256-128-10, ``examples/mlp.py``) with its first layer pinned to one
device and its last to the other, as the TensorFlow tutorial splits it by hand."""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

import pytest
import torch
from torch import nn

import autoplace
from autoplace.cli import main
from autoplace.config import Config, Emit, Solve
from autoplace.errors import InfeasibleError, PinError
from autoplace.fold import coarsen, fold
from autoplace.formats.plan import read_plan
from autoplace.ir import Cluster, Device, Link, Problem
from autoplace.profile.cost import costs as cost_nodes
from autoplace.solve.pins import merge_pins, parse_pins, pin_costs, resolve_pins
from autoplace.trace import trace_model

MLP = str(Path(__file__).resolve().parents[1] / "examples" / "mlp.py")


def _mlp() -> tuple[nn.Module, torch.Tensor]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(784, 256), nn.ReLU(), nn.Linear(256, 128), nn.ReLU(),
                          nn.Linear(128, 10))
    return model, torch.randn(64, 784)


def _segment_device(emitted: object, op: str) -> str:
    return next(device for device, nodes in emitted.segments if op in nodes)


def test_pinned_first_and_last_layers_are_emitted_there_and_verify():
    model, x = _mlp()
    # On identical devices the chain is best on one device (a split only adds copies), so
    # pinning its two ends apart costs the plan something.
    planned, emitted = autoplace.plan(
        model,
        (x,),
        Config(
            devices="2xA100-40GB",
            pins={"0": "cuda:0", "4": 1},
            solve=Solve(time_limit_s=2, whatif=False),
        ),
    )
    assert planned.verification.status == "passed"
    device_of_op = planned.device_of_op
    assert device_of_op["linear"] == "cuda:0" and device_of_op["linear_2"] == "cuda:1"
    assert _segment_device(emitted, "linear") == "cuda:0"
    assert _segment_device(emitted, "linear_2") == "cuda:1"
    pins = planned.pins
    assert pins.modules == {"0": "cuda:0", "4": "cuda:1"}
    unpinned = pins.unpinned_objective_s
    assert unpinned < planned.makespan_s and planned.pins_cost_s == pytest.approx(
        planned.makespan_s - unpinned)
    assert any("pinned by hand: 0 -> cuda:0, 4 -> cuda:1" in n for n in planned.notes)
    # plan.json keeps the pins and both makespans, and reads back.
    data = planned.to_dict()
    assert data["pins"]["cost_s"] == pytest.approx(planned.pins_cost_s)
    assert autoplace.Plan.from_dict(data).pins == planned.pins


def test_cli_pins_and_pin_map_report_what_they_cost(tmp_path: Path):
    pin_map = tmp_path / "map.json"
    pin_map.write_text(json.dumps({"4": "cuda:1"}))
    out = tmp_path / "out"
    assert main(["plan", MLP, "--devices", "2xA100-40GB", "--pin", "0=cuda:0", "--pin-map",
                 str(pin_map), "--time-limit", "2", "--out", str(out)]) == 0
    data = json.loads((out / "plan.json").read_text())
    placed = {op: n["device"] for n in data["nodes"] for op in n["ops"]}
    assert placed["linear"] == "cuda:0" and placed["linear_2"] == "cuda:1"
    assert data["pins"]["unpinned_makespan_s"] < data["makespan_s"]
    assert data["verification"]["status"] == "passed"
    for name in ("summary.txt", "summary.md", "report.html"):
        text = (out / name).read_text()
        assert "pins cost" in text and "against the unpinned plan" in text, name
    for name in ("summary.txt", "report.html"):
        assert "the pins span several devices" in (out / name).read_text(), name
    # plan.json passes its schema and reads back with the pins.
    assert read_plan(out / "plan.json").pins.modules == {"0": "cuda:0", "4": "cuda:1"}


@pytest.mark.parametrize(("argv", "pattern"), [
    (["--pin", "5=cuda:0"], r"unknown module '5'.*modules include '0', '1'"),
    (["--pin", "0=cuda:7"], r"unknown device 'cuda:7'.*cuda:0, cuda:1"),
    (["--pin", "0=cuda:0", "--pin", "0=cuda:1"], r"'0' is pinned twice"),
    (["--pin", "0"], r"write MODULE=DEVICE"),
    (["--pin", "0=cuda:0", "--mode", "training"], r"inference plans"),
])
def test_bad_pins_exit_2_with_the_reason(tmp_path: Path, capsys, argv, pattern):
    code = main(["plan", MLP, "--devices", "2xA100-40GB", "--time-limit", "1", "--no-emit",
                 "--out", str(tmp_path / "out"), *argv])
    assert code == 2
    assert re.search(pattern, capsys.readouterr().err.replace("\n", " "))
    assert not (tmp_path / "out").exists()


def test_unknown_nested_module_suggests_close_names():
    model = nn.Sequential()
    model.add_module("encoder", nn.Sequential(nn.Linear(4, 4), nn.Linear(4, 4)))
    traced = trace_model(model, (torch.randn(2, 4),))
    cluster = _two_devices(2**30)
    with pytest.raises(PinError, match=r"did you mean 'encoder\.1'"):
        resolve_pins(model, traced.graph, cluster, {"encoder.l": "cuda:0"})


def test_pins_merge_and_conflict():
    assert merge_pins(parse_pins(["a=cuda:0", "b=1"]), {"c": "cpu"}) == {
        "a": "cuda:0", "b": 1, "c": "cpu"}
    with pytest.raises(PinError, match=r"'a' is pinned twice, to 'cuda:0' and to 1"):
        merge_pins({"a": "cuda:0"}, {"a": 1})


def _two_devices(small_bytes: int) -> Cluster:
    devices = (Device("cuda:0", "A100-40GB", small_bytes), Device("cuda:1", "A100-40GB", 2**34))
    links = tuple(Link(a.name, b.name, 1e11, 1e-6) for a in devices for b in devices
                  if a is not b)
    return Cluster(devices=devices, links=links)


def test_pins_that_overflow_a_device_name_it_and_the_bytes_short():
    model, x = _mlp()
    # Layers 0 and 2 hold 803,840 and 131,584 bytes of parameters: each fits cuda:0's 900,000
    # bytes, both pinned there do not (35,424 bytes short).
    with pytest.raises(InfeasibleError,
                       match=r"only on cuda:0 .* need 0\.00 GiB \(935424 bytes\).*"
                             r"\(35424 bytes\) short"):
        autoplace.plan(
            model,
            (x,),
            Config(
                devices=_two_devices(900_000),
                pins={"0": "cuda:0", "2": "cuda:0"},
                solve=Solve(time_limit_s=1, whatif=False),
                emit=Emit(model=False),
            ),
        )
    # One pinned node larger than its device: the existing diagnosis, naming it.
    with pytest.raises(InfeasibleError, match=r"node 'linear' .* cuda:0 .*\(303840 bytes\) "
                                              "short"):
        autoplace.plan(
            model,
            (x,),
            Config(
                devices=_two_devices(500_000),
                pins={"0": "cuda:0"},
                solve=Solve(time_limit_s=1, whatif=False),
                emit=Emit(model=False),
            ),
        )


def test_coarsening_keeps_pins_apart():
    model, x = _mlp()
    traced = trace_model(model.eval(), (x,))
    cluster = _two_devices(2**34)
    pins = resolve_pins(model, traced.graph, cluster, {"0": "cuda:0", "2": 1, "4": "cuda:0"})
    costs = pin_costs(cost_nodes(traced.graph, cluster), pins.device_of_op)
    folded = fold(traced.graph, costs)
    # Coarsened as far as it goes, no group mixes ops pinned to different devices, and the
    # pinned ops keep their one device.
    small = coarsen(folded.graph, folded.costs, max_nodes=1)
    problem = Problem(graph=small.graph, cluster=cluster, costs=small.costs)
    device_of_op = pins.device_of_op
    for node in small.graph.nodes:
        pinned = {device_of_op[op] for op in node.ops if op in device_of_op}
        assert len(pinned) <= 1
        if pinned:
            assert problem.allowed[node.name] == tuple(pinned)
    assert len(small.graph.nodes) >= 3
    assert all(math.isinf(small.costs.compute_s[n.name]["cuda:1"])
               for n in small.graph.nodes if "linear" in n.ops)


def test_every_baseline_and_the_plan_respect_the_pins():
    from autoplace.solve import solve

    model, x = _mlp()
    traced = trace_model(model.eval(), (x,))
    cluster = _two_devices(2**34)
    pins = resolve_pins(model, traced.graph, cluster, {"0": "cuda:1", "4": "cuda:0"})
    folded = fold(traced.graph, pin_costs(cost_nodes(traced.graph, cluster), pins.device_of_op))
    problem = Problem(graph=folded.graph, cluster=cluster, costs=folded.costs)
    result = solve(problem, time_limit_s=2)
    schedules = {"plan": result.schedule,
                 **{k: v for k, v in result.baselines.items() if v is not None}}
    assert len(schedules) > 3
    for name, schedule in schedules.items():
        for node in problem.graph.nodes:
            pinned = {pins.device_of_op[op] for op in node.ops if op in pins.device_of_op}
            if pinned:
                assert {schedule.placement.device_of[node.name]} == pinned, (name, node.name)


def test_the_unpinned_solve_starts_from_the_pinned_plan():
    # A pinned plan is a plan without pins too: carried onto the unpinned graph it simulates the
    # same, so the unpinned solve, which starts from it, can never make pins look like a gain.
    from autoplace.cluster import resolve_cluster
    from autoplace.pipeline.forward import Tracing, traced_problem
    from autoplace.pipeline.inference import _carried
    from autoplace.simulate import simulate
    from autoplace.solve import solve

    model, x = _mlp()
    cluster, _ = resolve_cluster(spec="2xA100-40GB")
    how = Tracing(name="mlp", profile=False, cache=None, progress=False,
                  pins={"0": "cuda:0", "4": 1})
    forward = traced_problem(model.eval(), (x,), {}, cluster, how)
    pinned = solve(forward.problem, time_limit_s=1)
    start = _carried(forward.unpinned, forward.problem, pinned)["the pinned plan"]
    assert start.device_of != {n: "cuda:0" for n in start.device_of}  # the pins' split
    assert simulate(forward.unpinned, start).makespan_s == pytest.approx(pinned.objective_s)

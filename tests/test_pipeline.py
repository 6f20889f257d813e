"""The Python API: plan(), save() and Plan.load, and a real model split because it does not fit."""

from __future__ import annotations

import json

import pytest
import torch
import zoo

import autoplace
from autoplace.config import Config, Emit, Solve
from autoplace.emit import load_model
from autoplace.ir import Cluster, Device, Link


def _tiny_cluster(memory_bytes: int) -> Cluster:
    devices = tuple(Device(name=f"cuda:{i}", type="A100-40GB", memory_bytes=memory_bytes)
                    for i in range(2))
    links = tuple(Link(src=a.name, dst=b.name, bandwidth_bytes_per_s=300e9, latency_s=5e-6)
                  for a in devices for b in devices if a is not b)
    return Cluster(devices=devices, links=links)


def test_model_too_big_for_one_device_is_split_and_still_equal(tmp_path):
    # TwoLayer has 848 bytes of parameters; devices of 800 bytes cannot hold it alone.
    torch.manual_seed(0)
    model = zoo.TwoLayer()
    x = torch.randn(1, 8)
    plan, emitted = autoplace.plan(
        model, (x,), Config(devices=_tiny_cluster(800), solve=Solve(time_limit_s=5))
    )
    assert plan.baselines["single-device"].makespan_s is None
    assert set(plan.schedule.placement.device_of.values()) == {"cuda:0", "cuda:1"}
    assert all(p <= 800 for p in plan.schedule.peak_bytes.values())
    assert plan.verification.status == "passed"
    assert len(emitted.segments) == 2

    autoplace.save(plan, tmp_path / "out", emitted)
    again = autoplace.Plan.load(tmp_path / "out")
    assert again.to_dict()["nodes"] == plan.to_dict()["nodes"]
    assert again.makespan_s == plan.makespan_s and again.lower_bound_s == plan.lower_bound_s
    assert autoplace.validate(again.problem, again.schedule) == []
    # Re-simulating the loaded placement reproduces the saved schedule.
    resimulated = autoplace.simulate(again.problem, again.schedule.placement)
    assert resimulated.makespan_s == pytest.approx(plan.makespan_s)
    emitted = load_model(tmp_path / "out" / "model", device_map={"cuda:*": "cpu"})
    with torch.no_grad():
        torch.testing.assert_close(emitted(x), model(x))


def test_device_of_op_covers_every_traced_op():
    model = zoo.TiedLM()
    plan, emitted = autoplace.plan(
        model,
        (torch.randint(0, 50, (2, 5)),),
        Config(devices="2xA100-40GB", solve=Solve(time_limit_s=5)),
    )
    ops = plan.device_of_op
    assert sum(len(n.ops) for n in plan.problem.graph.nodes) == len(ops)
    # The tied embedding and output projection are on one device.
    group = plan.problem.graph.colocate
    for members in group:
        assert len({plan.schedule.placement.device_of[m] for m in members}) == 1


def test_saving_over_an_existing_plan_replaces_it(tmp_path):
    model = zoo.TwoLayer()
    plan, emitted = autoplace.plan(
        model,
        (torch.randn(1, 8),),
        Config(devices="2xA100-40GB", solve=Solve(time_limit_s=2), emit=Emit(verify=False)),
    )
    out = tmp_path / "out"
    out.mkdir()
    (out / "stale.txt").write_text("old")
    autoplace.save(plan, out, emitted)
    assert not (out / "stale.txt").exists()
    assert json.loads((out / "plan.json").read_text())["verification"]["status"] == "skipped"


def test_broken_plan_file_is_a_clear_error(tmp_path):
    (tmp_path / "plan.json").write_text("{not json")
    with pytest.raises(autoplace.OutputError, match="not valid JSON"):
        autoplace.Plan.load(tmp_path)
    with pytest.raises(autoplace.OutputError, match="no plan file"):
        autoplace.Plan.load(tmp_path / "elsewhere")


def test_plan_is_on_the_folded_graph_whatever_max_nodes(tmp_path):
    # The case: Inception-like branches at --max-nodes 2 once reported the coarse plan
    # "optimal". Now the plan, its bound and every baseline are of the folded graph, and the
    # plan is no worse than any baseline there.
    class Branches(torch.nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.a = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                         torch.nn.Linear(256, 256))
            self.b = torch.nn.Sequential(torch.nn.Linear(256, 256), torch.nn.ReLU(),
                                         torch.nn.Linear(256, 256))

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return self.a(x).view(-1) + self.b(x).view(-1)

    torch.manual_seed(0)
    plan, emitted = autoplace.plan(
        Branches(),
        (torch.randn(512, 256),),
        Config(devices="2xA100-40GB", solve=Solve(time_limit_s=3, max_nodes=2, whatif=False)),
    )
    graph = plan.problem.graph
    assert plan.coarsening.plan_nodes == len(graph.nodes)
    assert plan.solver.scope["folded_nodes"] == len(graph.nodes)
    assert all(n.name in plan.schedule.placement.device_of for n in graph.nodes)
    for baseline in plan.baselines.values():
        if baseline.feasible:
            assert plan.makespan_s <= baseline.makespan_s + 1e-12
    assert plan.verification.status == "passed"
    autoplace.save(plan, tmp_path / "out", emitted)
    data = json.loads((tmp_path / "out" / "plan.json").read_text())
    assert data["solver"]["scope"] == dict(plan.solver.scope)
    assert autoplace.Plan.load(tmp_path / "out").solver.scope == plan.solver.scope


def test_a_trace_asked_for_again_within_a_plan_is_reused_with_its_notes(monkeypatch):
    """``reusing_traces`` keeps the last forward problem: the same model, inputs (a view of
    the same rows too), cluster and tracing give it back, its notes made again; other
    inputs, another cluster object, or a call outside the block trace anew."""
    import autoplace.pipeline.forward as forward
    from autoplace.cluster import resolve_cluster
    from autoplace.progress.notes import collecting

    traced = []
    real = forward._traced_problem

    def counted(*args):
        traced.append(args[1])
        forward.note("traced")
        return real(*args)

    monkeypatch.setattr(forward, "_traced_problem", counted)
    model, batch = zoo.TwoLayer(), torch.randn(4, 8)
    cluster, _ = resolve_cluster(spec="2xA100-40GB")
    how = forward.Tracing(name="m", profile=False, cache=None, progress=False)
    with forward.reusing_traces():
        with collecting() as notes:
            first = forward.traced_problem(model, (batch[:2],), {}, cluster, how)
            again = forward.traced_problem(model, (batch.split(2)[0],), {}, cluster, how)
        assert again is first and notes.count("traced") == 2 and len(traced) == 1
        other = forward.traced_problem(model, (batch[2:],), {}, cluster, how)  # other rows
        assert other is not first and len(traced) == 2
        forward.traced_problem(model, (batch[2:],), {}, resolve_cluster(spec="2xA100-40GB")[0],
                               how)
        assert len(traced) == 3
    forward.traced_problem(model, (batch[2:],), {}, cluster, how)
    assert len(traced) == 4

"""The what-if table: the same problem re-solved on the first 1, 2, ... devices.

fork_join (zoo): a -> {b, c} -> d, b and c 10 s, a and d 1 s, every edge 1 s between devices.
One device: 22 s; two: 13 s (the branches side by side); a third device cannot help: 13 s.
chain with 600-byte parameters per node on 1000-byte devices: one or two devices cannot hold the
1800 bytes (two nodes on one device are 1200), three can (one node each).
"""

from __future__ import annotations

import json

import pytest
import torch
import zoo

import autoplace
from autoplace.config import Config, Emit, Solve
from autoplace.formats.plan_check import validate_plan_dict
from autoplace.solve import SolveOptions, solve
from autoplace.solve.whatif import (
    fewer_devices,
    restrict,
    solve_after_whatif,
    whatif_options,
    whatif_table,
)


def test_restrict_keeps_the_first_devices_and_their_links() -> None:
    problem = zoo.fork_join(zoo.cluster(3))
    sub = restrict(problem, ("d0", "d1"))
    assert sub.cluster.names == ("d0", "d1")
    assert {(lk.src, lk.dst) for lk in sub.cluster.links} == {("d0", "d1"), ("d1", "d0")}
    assert set(sub.costs.compute_s["a"]) == {"d0", "d1"}
    assert sub.graph is problem.graph


def test_makespan_for_one_two_and_three_devices() -> None:
    problem = zoo.fork_join(zoo.cluster(3))
    full = solve(problem, time_limit_s=5)
    rows = whatif_table(problem, full=full, time_limit_s=2)
    assert [r.devices for r in rows] == [("d0",), ("d0", "d1"), ("d0", "d1", "d2")]
    assert [r.makespan_s for r in rows] == pytest.approx([22, 13, 13])
    assert rows[-1].detail == "the plan" and rows[-1].makespan_s == full.schedule.makespan_s
    assert all(r.status in ("OPTIMAL", "FEASIBLE") for r in rows)


def test_devices_the_model_does_not_fit_give_no_makespan_and_the_reason() -> None:
    problem = zoo.chain(zoo.cluster(3), params=600)
    rows = whatif_table(problem, time_limit_s=2)
    assert [r.makespan_s is None for r in rows] == [True, True, False]
    assert rows[0].status == "INFEASIBLE" and "byte" in rows[0].detail
    assert rows[2].makespan_s == pytest.approx(5)  # 3 x 1 s of work, 2 x 1 s of transfers


def test_plan_records_the_whatif_rows(tmp_path) -> None:
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.ReLU(), torch.nn.Linear(8, 4))
    plan, emitted = autoplace.plan(
        model,
        (torch.randn(2, 8),),
        Config(devices="2xA100-40GB,1xT4", solve=Solve(time_limit_s=2), emit=Emit(model=False)),
    )
    assert [len(r.devices) for r in plan.whatif] == [1, 2, 3]
    autoplace.save(plan, tmp_path / "out", emitted)
    data = json.loads((tmp_path / "out" / "plan.json").read_text())
    validate_plan_dict(data)
    assert data["whatif"][-1]["makespan_s"] == data["makespan_s"]
    assert data["makespan_s"] <= min(r["makespan_s"] for r in data["whatif"])
    assert (tmp_path / "out" / "summary.md").read_text().count("| 3: cuda:0, cuda:1, cuda:2") == 1
    assert not autoplace.plan(
        model,
        (torch.randn(2, 8),),
        Config(
            devices="2xA100-40GB", solve=Solve(time_limit_s=1, whatif=False), emit=Emit(model=False)
        ),
    ).plan.whatif


def test_rows_follow_the_plans_objective() -> None:
    # Pipelined, one device carries all 22 s of work; two devices split it (no better than
    # 11 s each, plus the copies each device sends and receives).
    problem = zoo.fork_join(zoo.cluster(2))
    rows = whatif_table(problem, time_limit_s=2, objective="throughput")
    assert rows[0].objective_s == pytest.approx(22)
    assert 11 <= rows[1].objective_s < 22
    assert rows[1].makespan_s >= rows[1].objective_s


def test_a_start_is_the_plan_to_beat_without_being_a_baseline(monkeypatch) -> None:
    # With the heuristics gone, the baselines are one device (22 s); the start puts the branches
    # side by side. Stopped before CP-SAT, the solve keeps the start, and lists no start among
    # its baselines.
    from autoplace.ir import Placement
    from autoplace.simulate import simulate
    from autoplace.solve import registry

    for name in list(registry.HEURISTICS):
        monkeypatch.delitem(registry.HEURISTICS, name)
    problem = zoo.fork_join(zoo.cluster(2))
    start = Placement(device_of={"a": "d0", "b": "d0", "c": "d1", "d": "d0"})
    stopped = {"time_limit_s": 2, "stop": lambda stage: stage == "cpsat"}
    assert solve(problem, **stopped).objective_s == 22  # CP-SAT hinted with one device
    result = solve(problem, starts={"what-if on 2 devices": start}, **stopped)
    assert result.objective_s == simulate(problem, start).makespan_s < 22
    assert result.solver.status == "INTERRUPTED"
    assert set(result.baselines) == {"single-device"}


def test_rows_start_from_the_rows_before_and_keep_within_their_share() -> None:
    # Deterministic: the rows' limits add up to at most the share given, and each row starts
    # from the best before it, so adding a device never makes a row worse.
    problem = zoo.fork_join(zoo.cluster(4))
    options = whatif_options(SolveOptions(time_limit_s=2, deterministic=True))
    fewer = fewer_devices(problem, options, within_s=0.3)
    assert [len(r.devices) for r in fewer.rows] == [1, 2, 3]
    assert fewer.spent_s == pytest.approx(0.3)
    spans = [r.makespan_s for r in fewer.rows]
    assert spans == sorted(spans, reverse=True) and spans[1:] == pytest.approx([13, 13])
    assert fewer.best is not None and fewer.best[0] == "what-if on 2 devices"


def test_the_plan_is_never_worse_than_a_row_and_says_what_the_rows_took() -> None:
    problem = zoo.fork_join(zoo.cluster(3))
    result, fewer = solve_after_whatif(problem, SolveOptions(time_limit_s=2, deterministic=True))
    assert result.objective_s <= min(r.objective_s for r in fewer.rows)
    assert result.solver.time_limit_s == pytest.approx(2 - fewer.spent_s)
    assert any(n.startswith("the what-if rows (the first 1 to 2 devices) took") for n in
               result.notes)


def test_ctrl_c_in_the_rows_stops_the_plans_solve_at_once(monkeypatch) -> None:
    import autoplace.solve.whatif as whatif

    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr(whatif, "solve", lambda problem, **kw: (
        interrupted() if len(problem.cluster.names) < 3 else solve(problem, **kw)))
    result, fewer = solve_after_whatif(zoo.fork_join(zoo.cluster(3)),
                                       SolveOptions(time_limit_s=5))
    assert fewer.interrupted and not fewer.rows
    assert result.solver.status == "INTERRUPTED" and result.solver.wall_s < 1

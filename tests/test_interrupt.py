"""Ctrl-C while solving returns the best plan found so far, marked ``INTERRUPTED``; baselines
past half the time limit are skipped and said so.

No test waits for real time to pass: Ctrl-C comes from the ``stop`` check ``solve`` takes, at a
named checkpoint (the n-th baseline, the n-th CP-SAT callback), and the time limit is counted on
an injected clock. One test sends a real SIGINT, from the same checkpoint, to show that Ctrl-C
itself still stops CP-SAT.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import zoo

import autoplace
from autoplace.ir import Problem
from autoplace.solve import HEURISTICS, solve

# The checkout under test, for the subprocess (which would otherwise import an installed copy).
_ROOT = str(Path(autoplace.__file__).resolve().parents[1])


def _random_dag(n: int = 40) -> Problem:
    """A random DAG on four devices of different speeds: no baseline meets the lower bound and
    CP-SAT reports several improvements before it proves anything, so an interruption at its
    second callback lands in the middle of the search."""
    rng = random.Random(7)
    nodes = [(f"n{i}", rng.uniform(1, 10), 0) for i in range(n)]
    edges = [(f"n{s}", f"n{d}", rng.randint(100, 2000)) for d in range(1, n)
             for s in rng.sample(range(max(0, d - 12), d), min(d, rng.randint(1, 3)))]
    return zoo.problem(nodes, edges, zoo.cluster(4, memory_bytes=10**9),
                       speed={"d0": 1.0, "d1": 1.5, "d2": 0.7, "d3": 1.2})


class StopAt:
    """Ctrl-C at the ``count``-th checkpoint of ``stage``; records every checkpoint asked."""

    def __init__(self, stage: str, count: int) -> None:
        self.stage, self.count = stage, count
        self.asked: list[str] = []

    def __call__(self, stage: str) -> bool:
        self.asked.append(stage)
        return stage == self.stage and self.asked.count(stage) == self.count


class FakeClock:
    """A clock that moves only when a test moves it."""

    def __init__(self) -> None:
        self.now_s = 0.0

    def __call__(self) -> float:
        return self.now_s


def _assert_best_so_far(result, problem: Problem) -> None:
    assert result.solver.status == "INTERRUPTED"
    assert any("interrupted (Ctrl-C)" in note for note in result.notes)
    feasible = [s.objective_s(result.objective) for s in result.baselines.values()
                if s is not None and s.feasible]
    assert result.objective_s <= min(feasible) * (1 + 1e-9)


def test_ctrl_c_at_the_second_cpsat_callback_returns_the_best_plan_so_far():
    problem = _random_dag()
    stop = StopAt("cpsat", 2)
    # 60 s that CP-SAT does not get to use: the search stops at its second report.
    result = solve(problem, time_limit_s=60, deterministic=True, stop=stop)
    _assert_best_so_far(result, problem)
    assert stop.asked.count("cpsat") == 2
    assert stop.asked.count("baseline") == len(HEURISTICS)  # every baseline ran first
    assert len(result.solver.progress) == 2


def test_a_real_sigint_still_stops_cpsat(tmp_path):
    # CP-SAT catches SIGINT itself; the signal is sent from the same checkpoint, so it lands in
    # the search at a known point. A subprocess, so that a SIGINT CP-SAT did not catch cannot
    # stop the test run.
    script = tmp_path / "interrupt.py"
    script.write_text(textwrap.dedent(f"""
        import json, os, signal, sys
        sys.path[:0] = [{_ROOT!r}, {str(Path(zoo.__file__).parent)!r}]
        from test_interrupt import _random_dag
        from autoplace.solve import solve

        seen = []

        def stop(stage):
            seen.append(stage)
            if seen.count("cpsat") == 2:
                os.kill(os.getpid(), signal.SIGINT)
            return False  # not the injected stop: the signal alone must do it

        result = solve(_random_dag(), time_limit_s=60, deterministic=True, stop=stop)
        feasible = [s.makespan_s for s in result.baselines.values()
                    if s is not None and s.feasible]
        print(json.dumps({{"status": result.solver.status, "notes": list(result.notes),
                          "plan_s": result.objective_s, "baselines_s": feasible}}))
    """))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["status"] == "INTERRUPTED"
    assert any("interrupted (Ctrl-C)" in note for note in out["notes"])
    assert out["plan_s"] <= min(out["baselines_s"]) * (1 + 1e-9)


def test_ctrl_c_during_the_baselines_keeps_those_already_run():
    names = list(HEURISTICS)
    stop = StopAt("baseline", 3)  # while the third heuristic runs
    result = solve(zoo.fork_join(zoo.cluster(2, memory_bytes=10**6)), time_limit_s=5, stop=stop)
    assert result.solver.status == "INTERRUPTED"
    assert set(result.baselines) == {"single-device", *names[:2]}
    assert any(f"baselines not run (Ctrl-C): {', '.join(names[2:])}" in n for n in result.notes)
    assert "cpsat" not in stop.asked  # no solving after Ctrl-C


def test_ctrl_c_before_any_baseline_fits_is_raised():
    # Nothing to return: Ctrl-C goes on to the caller (the CLI exits with 130).
    cramped = zoo.chain(zoo.cluster(2, memory_bytes=1000), params=600)  # no single device fits
    with pytest.raises(KeyboardInterrupt):
        solve(cramped, time_limit_s=5, stop=StopAt("baseline", 1))


@pytest.mark.parametrize("deterministic", [False, True])
def test_baselines_past_half_the_time_limit_are_skipped(monkeypatch, deterministic):
    clock = FakeClock()

    def slow(problem, objective):
        clock.now_s += 0.6  # past half of the 1 s limit
        return None

    names = list(HEURISTICS)
    monkeypatch.setitem(HEURISTICS, names[0], slow)
    result = solve(zoo.fork_join(zoo.cluster(2, memory_bytes=10**6)), time_limit_s=1.0,
                   deterministic=deterministic, clock=clock)
    if deterministic:
        # Deterministic runs skip nothing: which would depend on the machine's speed.
        assert set(result.baselines) == {"single-device", *names}
    else:
        assert set(result.baselines) == {"single-device", names[0]}
        assert any(f"baselines not run (past half the time limit): {', '.join(names[1:])}"
                   in n for n in result.notes)

"""Ctrl-C while solving returns the best plan found so far, marked ``INTERRUPTED``; baselines
past half the time limit are skipped and said so."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

import zoo

from autoplace.solve import HEURISTICS, solve

# A 120-node random DAG on four devices of different speeds: CP-SAT does not prove it optimal
# in seconds, so a SIGINT after 4 s lands in the middle of the search.
_SCRIPT = textwrap.dedent("""
    import json, os, random, signal, sys, threading, time
    sys.path.insert(0, {tests!r})
    import zoo
    from autoplace.solve import solve

    rng = random.Random(7)
    n = 120
    nodes = [(f"n{{i}}", rng.uniform(1, 10), 0) for i in range(n)]
    edges = [(f"n{{s}}", f"n{{d}}", rng.randint(100, 2000)) for d in range(1, n)
             for s in rng.sample(range(max(0, d - 12), d), min(d, rng.randint(1, 3)))]
    problem = zoo.problem(nodes, edges, zoo.cluster(4, memory_bytes=10**9),
                          speed={{"d0": 1.0, "d1": 1.5, "d2": 0.7, "d3": 1.2}})
    threading.Timer(4.0, lambda: os.kill(os.getpid(), signal.SIGINT)).start()
    began = time.perf_counter()
    result = solve(problem, time_limit_s=60)
    print(json.dumps({{
        "status": result.solver.status, "wall_s": time.perf_counter() - began,
        "notes": list(result.notes), "plan_s": result.objective_s,
        "baselines_s": [s.makespan_s for s in result.baselines.values()
                        if s is not None and s.feasible]}}))
""")


def test_ctrl_c_during_cpsat_returns_the_best_plan_so_far(tmp_path):
    script = tmp_path / "interrupt.py"
    script.write_text(_SCRIPT.format(tests=str(zoo.__file__).rsplit("/", 1)[0]))
    done = subprocess.run([sys.executable, str(script)], capture_output=True, text=True,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out["status"] == "INTERRUPTED"
    assert out["wall_s"] < 30  # not the 60 s limit
    assert any("interrupted (Ctrl-C)" in note for note in out["notes"])
    assert out["plan_s"] <= min(out["baselines_s"]) * (1 + 1e-9)


def test_ctrl_c_during_the_baselines_keeps_those_already_run(monkeypatch):
    def pressed(problem, objective):
        raise KeyboardInterrupt

    names = list(HEURISTICS)
    monkeypatch.setitem(HEURISTICS, names[2], pressed)
    result = solve(zoo.fork_join(zoo.cluster(2, memory_bytes=10**6)), time_limit_s=5)
    assert result.solver.status == "INTERRUPTED"
    assert set(result.baselines) == {"single-device", *names[:2]}
    assert any(f"baselines not run (Ctrl-C): {', '.join(names[2:])}" in n for n in result.notes)


def test_baselines_past_half_the_time_limit_are_skipped(monkeypatch):
    import time

    def slow(problem, objective):
        time.sleep(0.6)
        return None

    names = list(HEURISTICS)
    monkeypatch.setitem(HEURISTICS, names[0], slow)
    result = solve(zoo.fork_join(zoo.cluster(2, memory_bytes=10**6)), time_limit_s=1.0)
    assert set(result.baselines) == {"single-device", names[0]}
    assert any("past half the time limit" in n for n in result.notes)
    # Deterministic runs skip nothing: which would depend on the machine's speed.
    result = solve(zoo.fork_join(zoo.cluster(2, memory_bytes=10**6)), time_limit_s=1.0,
                   deterministic=True)
    assert set(result.baselines) == {"single-device", *names}

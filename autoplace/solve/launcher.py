"""Solve: CP-SAT's constraints for the launcher threads (``ir.HostCosts``,
``simulate.launch.launched``), added to the latency model by ``cpsat._add_schedule``.

Each launcher launches the nodes placed on its devices one after another, and a node starts no
earlier than its launch begins: one optional interval per (node, launched device) on one
no-overlap resource per launcher. The launcher's total work bounds the makespan. (Where one
thread launches everything, ``bounds.launch_release_s`` bounds each node's start further; the
solve takes that bound, not CP-SAT: given to CP-SAT as release times, it steered the search to
worse plans, T5 on 2xA100-40GB at 70% caps 2.237 against 2.007 ms.) CP-SAT does not schedule
the segment calls and handovers, only bounds them, so its plans are refined by local moves
scored by the simulator (``solve._launcher_moves``).
"""

from __future__ import annotations

from collections.abc import Mapping

from ortools.sat.python import cp_model

from autoplace.ir import Problem

__all__ = ["add_launchers"]

Vars = Mapping[tuple[str, str], cp_model.IntVar]


def add_launchers(model: cp_model.CpModel, problem: Problem, x: Vars,
                  makespan: cp_model.IntVar, start: Mapping[str, cp_model.IntVar],
                  horizon: int, quantum: float) -> None:
    """The launch intervals, and the bound: every launch, one segment call if the launcher
    launches anything and, where it is the only launcher, one handover per copy and a call per
    node whose value leaves its device, are all issued before the last node starts, which then
    runs at least its launches. Ticks are rounded down, so a bound stays one."""
    host, launchers = problem.costs.host, problem.launchers
    if host is None or not launchers:
        return
    graph, allowed = problem.graph, problem.allowed
    for launcher in dict.fromkeys(launchers.values()):  # in order: the same model every run
        devices = [d for d, h in launchers.items() if h == launcher]
        terms = [int(host.launch_of(n.name, d) / quantum) * x[n.name, d]
                 for n in graph.nodes for d in devices if d in allowed[n.name]]
        # No launch before the first segment call: paid once the launcher launches anything.
        calls = min(int(host.call_s[d] / quantum) for d in devices)
        used = model.new_bool_var(f"launches[{launcher}]")
        issuing = []
        for n in graph.nodes:
            for d in devices:
                if d not in allowed[n.name]:
                    continue
                if not graph.node(n.name).is_input:
                    model.add_implication(x[n.name, d], used)
                ticks = int(host.launch_of(n.name, d) / quantum)
                if not ticks:
                    continue
                issued = model.new_int_var(0, horizon, f"issue[{n.name},{d}]")
                model.add(issued >= min(calls, horizon)).only_enforce_if(x[n.name, d])
                model.add(issued <= start[n.name]).only_enforce_if(x[n.name, d])
                issuing.append(model.new_optional_fixed_size_interval_var(
                    issued, ticks, x[n.name, d], f"launch[{n.name},{d}]"))
        model.add_no_overlap(issuing)
        if problem.sole_launcher is not None:
            terms += _handover_terms(model, problem, x, devices, calls, quantum)
        model.add(makespan >= calls * used + sum(terms))


def _handover_terms(model: cp_model.CpModel, problem: Problem, x: Vars, devices: list[str],
                    calls: int, quantum: float) -> list[cp_model.LinearExprT]:
    """Where every device is one launcher's: each copy between two of them is a handover, and
    each node whose value leaves its device ends a segment (``simulate.memory.Cuts``), so it
    costs a segment call besides the last segment's (the last node launched sends nothing)."""
    graph, allowed, host = problem.graph, problem.allowed, problem.costs.host
    assert host is not None
    handover = min(int(host.handover_s[d] / quantum) for d in devices)
    terms: list[cp_model.LinearExprT] = []
    for n in graph.nodes:
        readers = list(dict.fromkeys(e.dst for e in graph.out_edges(n.name)))
        if not readers or graph.node(n.name).is_input:
            continue  # a model input is moved by its reader's segment, not handed over
        sent_any = model.new_bool_var(f"sends[{n.name}]")
        for d in problem.cluster.names:
            if d not in allowed[n.name] and not any(d in allowed[r] for r in readers):
                continue
            sent = model.new_bool_var(f"copy[{n.name},{d}]")
            own = x[n.name, d] if d in allowed[n.name] else 0
            for r in readers:
                if d in allowed[r]:
                    model.add(sent >= x[r, d] - own)
            model.add(sent_any >= sent)
            terms.append(handover * sent)
        terms.append(calls * sent_any)
    return terms

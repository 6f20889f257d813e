"""CP-SAT: the shared links (``Cluster.shared``: NICs, PCIe switches) in the exact model.

The simulator shares a resource's bandwidth max-min fair among the copies on it at once
(``simulate.contention``). The model keeps a **relaxation** of that rule, so that its optimum, and
so its bound, stays a lower bound on every schedule the simulator can produce:

* a copy alone moves at most its link's bandwidth and each resource's it crosses: the delays the
  model charges are ``Cluster.transfer_s``, which takes the smaller;
* a resource moves at most its bandwidth: the bytes of copies crossing ``r`` inside a time window,
  over ``r``'s bandwidth, fit in that window (``add_shared_volume``: all copies within the
  makespan, one node's copies out, one node's inputs in), whatever the sharing and latencies.

Serialising each resource's copies (a ``NoOverlap`` of ``bytes / bandwidth`` intervals, the classic
model of a shared link) is no relaxation of fair sharing once copies start at different times: it
can prove a "bound" above a schedule the simulator achieves (``docs/design-notes.md``, "solve").
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

from ortools.sat.python import cp_model

from autoplace.ir import Problem

__all__ = ["add_shared_volume"]

Vars = dict[tuple[str, str], cp_model.IntVar]


def add_shared_volume(model: cp_model.CpModel, problem: Problem, x: Vars,
                      makespan: cp_model.IntVar, quantum: float, start: Mapping[str, Any],
                      end: Mapping[str, Any], horizon: int) -> None:
    """For each shared resource ``r``, three relaxations of fair sharing, each in whole
    ``quantum`` ticks rounded down (so that they stay relaxations):

    * all of it: the time ``r`` needs for every copy crossing it is at most the makespan;
    * fan-out: ``u``'s copies all start once ``u`` ends, so the last of ``u``'s readers starts
      no earlier than ``u``'s end plus the time ``r`` needs for ``u``'s copies crossing it;
    * fan-in: the inputs of ``v`` crossing ``r`` are all sent after the first of them ends,
      so ``v`` starts no earlier than that plus the time ``r`` needs for them all.

    ``moved[u, r, b]`` is at least the ticks of ``u``'s copy to device ``b`` when ``u`` sits on
    a device ``a`` with ``(a, b)`` crossing ``r`` and a reader of ``u`` on ``b`` (a copy carries
    the largest edge read there, ``simulate.copies``); it only ever tightens a constraint, so
    the optimum keeps it exact. Edges with a fixed ``transfer_s`` share nothing."""
    graph = problem.graph
    for res in problem.cluster.shared:
        senders: dict[str, list[str]] = {}  # receiving device -> the devices sending over res
        for a, b in res.pairs:
            senders.setdefault(b, []).append(a)
        total = []
        for u in graph.nodes:
            moved = _moved(model, problem, x, u.name, res.name, senders,
                           res.bandwidth_bytes_per_s * quantum)
            total += moved
            readers = list(dict.fromkeys(e.dst for e in graph.out_edges(u.name)))
            if len(moved) > 1:
                last = model.new_int_var(0, horizon, f"last[{u.name},{res.name}]")
                model.add_max_equality(last, [start[v] for v in readers])
                model.add(last >= end[u.name] + sum(moved))
        if total:
            model.add(sum(total) <= makespan)
        for v in graph.nodes:
            _add_fan_in(model, problem, x, v.name, res.name, senders,
                        res.bandwidth_bytes_per_s * quantum, start, end, horizon)


def _ticks_down(nbytes: int, bytes_per_tick: float) -> int:
    return math.floor(nbytes / bytes_per_tick)


def _moved(model: cp_model.CpModel, problem: Problem, x: Vars, u: str, res: str,
           senders: Mapping[str, list[str]], bytes_per_tick: float) -> list[cp_model.IntVar]:
    """``moved[u, res, b]`` for each device ``b`` that ``u``'s copy may reach over ``res``."""
    allowed = problem.allowed
    out = [e for e in problem.graph.out_edges(u) if e.transfer_s is None]
    moved = []
    for b, sources in senders.items():
        usable = [a for a in sources if a in allowed[u]]
        if not usable:
            continue
        ticks = {e.dst: _ticks_down(e.bytes, bytes_per_tick) for e in out
                 if b in allowed[e.dst]}
        top = max(ticks.values(), default=0)
        if top <= 0:
            continue
        var = model.new_int_var(0, top, f"moved[{u},{res},{b}]")
        # u sits on one device (add_exactly_one): whether it sits on a sender is their sum
        sending = sum(x[u, a] for a in usable)
        for dst, t in ticks.items():
            if t:
                model.add(var >= t * (sending + x[dst, b] - 1))
        moved.append(var)
    return moved


def _add_fan_in(model: cp_model.CpModel, problem: Problem, x: Vars, v: str, res: str,
                senders: Mapping[str, list[str]], bytes_per_tick: float,
                start: Mapping[str, Any], end: Mapping[str, Any], horizon: int) -> None:
    """``start[v] >= first + sum of crossing[u] * ticks(u -> v)``, where ``crossing[u]`` is
    exactly whether edge ``u -> v`` crosses ``res`` and ``first`` is the earliest end among the
    crossing inputs. Both must be exact (a free ``crossing`` could lower ``first``)."""
    allowed = problem.allowed
    inputs = []
    for e in problem.graph.in_edges(v):
        ticks = _ticks_down(e.bytes, bytes_per_tick) if e.transfer_s is None else 0
        if ticks and any(a in allowed[e.src] for b in allowed[v] for a in senders.get(b, ())):
            inputs.append((e.src, ticks))
    if len(inputs) < 2:
        return
    crossing = {}
    for u, _ in inputs:
        c = model.new_bool_var(f"crossing[{u},{v},{res}]")
        for b in allowed[v]:
            sources = [a for a in senders.get(b, ()) if a in allowed[u]]
            sending = sum(x[u, a] for a in sources)  # 0 or 1: u sits on one device
            model.add(sending >= c).only_enforce_if(x[v, b])
            if sources:
                model.add(c >= sending + x[v, b] - 1)
        crossing[u] = c
    first = model.new_int_var(0, 2 * horizon, f"first[{v},{res}]")
    model.add_min_equality(first, [end[u] + horizon * (1 - crossing[u]) for u, _ in inputs])
    some = model.new_bool_var(f"crosses[{v},{res}]")
    model.add_max_equality(some, list(crossing.values()))
    model.add(start[v] >= first + sum(t * crossing[u] for u, t in inputs)).only_enforce_if(some)

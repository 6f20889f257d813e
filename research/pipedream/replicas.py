"""Data-parallel replicas of pipeline stages, the rule that times them, and the planner.

A replicated plan puts every node of a training step (``step_graph.profile_step_problem``'s, of
PipeDream's profiles) in a *group* of ``r`` identical devices that each run every ``r``-th sample:
pipeline parallelism between groups, data parallelism inside one (PipeDream's hybrid, Narayanan et
al., SOSP 2019). Rule and search in full: ``benchmarks/results/pipedream.md``. Read in this order:

1. ``time_per_sample``: **the rule**, PipeDream's cost model (section 3.1) for any placement:
   ``max(compute, ring all-reduce of the weights) / r`` per group (the paper's T,
   ``cost_models.ring_allreduce_s``), messages between groups (2 C); the slowest sets the time (on
   a chain of stages, ``partitioner.evaluate``'s);
2. ``allocate_replicas``: the replicas per group minimising the slowest (exact, threshold search);
3. ``replica_problem``: a *shape* (replicas per group) as the solver's ``Problem``;
4. ``plan_replicas``: data parallelism, else CP-SAT per uniform shape, polished under the rule
   (``_polish``) and re-solved while that improves; the best, on the fewest devices.
"""

from __future__ import annotations

import math
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace

from autoplace.ir import Costs, Placement, Problem
from autoplace.solve import SolveOptions, solve
from autoplace.train.graph import BACKWARD, STEP
from cost_models.roofline import ring_allreduce_s, transfer_time_s
from research.pipedream.partitioner import TrainingCluster
from research.pipedream.step_graph import training_devices

__all__ = ["MAX_ROUNDS", "MOVES_PER_UNIT", "Attempt", "ReplicaPlanning", "ReplicatedPlan",
           "allocate_replicas", "plan_replicas", "replica_problem", "time_per_sample"]

# Solves per uniform start: the rounds stop as soon as the polished plan stops improving, which
# on PipeDream's profiles takes two at most (benchmarks/results/pipedream.md).
MAX_ROUNDS = 3
# Moves per polish, per unit of the graph: a bound on the work for a large graph. On the
# profiles the polish ends at a local optimum long before (``Attempt.moves``). Unless the
# solve is deterministic, a polish also ends after the solve's time limit.
MOVES_PER_UNIT = 20


@dataclass(frozen=True)
class ReplicatedPlan:
    """Groups of a step's nodes (``device_of``: node -> group), ``replicas`` per group that holds
    nodes, each group's time per sample and each link's (``link_s``: a pair of groups in name
    order), and the time per sample, the slowest of them all."""

    device_of: Mapping[str, str]
    replicas: Mapping[str, int]
    group_s: Mapping[str, float]
    link_s: Mapping[tuple[str, str], float]
    time_per_sample_s: float

    @property
    def devices_used(self) -> int:
        return sum(self.replicas.values())

    @property
    def bottleneck(self) -> str:
        """What sets the time per sample: a group's name, or ``a-b`` for a link."""
        terms = {**self.group_s, **{f"{a}-{b}": t for (a, b), t in self.link_s.items()}}
        return max(terms, key=terms.__getitem__)


def time_per_sample(problem: Problem, device_of: Mapping[str, str], replicas: Mapping[str, int],
                    cluster: TrainingCluster) -> ReplicatedPlan:
    """The rule (the module docstring, item 1) applied to groups ``device_of`` (node -> any
    group name) with ``replicas[group]`` devices each; colocated nodes must share a group."""
    rule = _Rule(problem, cluster)
    groups = sorted(set(device_of.values()))
    index = {g: i for i, g in enumerate(groups)}
    assign = []
    for unit in rule.units:
        where = {device_of[name] for name in unit}
        if len(where) != 1:
            raise ValueError(f"colocated nodes {list(unit)} are in groups {sorted(where)}")
        assign.append(index[where.pop()])
    missing = [g for g in groups if replicas.get(g, 0) < 1]
    if missing:
        raise ValueError(f"groups {missing} hold nodes but have no replicas")
    state = _State(rule, assign, [replicas[g] for g in groups])
    # Summed afresh in seconds: the state's integer nanoseconds are for the search.
    group_s, link_s = state.terms(_group_sums(rule, assign, len(groups))[0])
    return ReplicatedPlan(
        device_of=dict(device_of), replicas={g: replicas[g] for g in groups},
        group_s={groups[g]: t for g, t in group_s.items()},
        link_s={(groups[a], groups[b]): t for (a, b), t in link_s.items()},
        time_per_sample_s=max([*group_s.values(), *link_s.values()]))


def _group_sums(rule: _Rule, assign: Sequence[int], groups: int
                ) -> tuple[list[float], list[int]]:
    """Each group's compute, in seconds, and weights: the one summation (unit by unit, in unit
    order), so that a plan's time and its re-allocation compare equal numbers."""
    compute: list[list[float]] = [[] for _ in range(groups)]
    weights = [0] * groups
    for u, g in enumerate(assign):
        compute[g].append(rule.compute_s[u])
        weights[g] += rule.weight_bytes[u]
    return [math.fsum(c) for c in compute], weights


def _stage_s(compute_s: float, weight_bytes: float, replicas: int,
             cluster: TrainingCluster) -> float:
    """A group's time per sample, the paper's T: ``partitioner.stage_s`` written again for
    plain numbers, because the search asks it for every group of every candidate move and the
    numpy call costs several times the arithmetic (the test of the rule against ``evaluate``
    compares the two, group by group)."""
    sync = ring_allreduce_s(weight_bytes, replicas, latency_s=cluster.latency_s,
                            bandwidth_bytes_per_s=cluster.bandwidth_bytes_per_s)
    return max(compute_s, sync) / replicas


def allocate_replicas(compute_s: Sequence[float], weight_bytes: Sequence[float], devices: int,
                      cluster: TrainingCluster, *,
                      within_s: float | None = None) -> tuple[int, ...] | None:
    """Replicas for groups computing ``compute_s`` and holding ``weight_bytes``, at least one
    each and ``devices`` in all, that minimise the slowest group's time (T); the fewest devices
    that reach it. With ``within_s``: the fewest that keep every group within ``within_s``
    instead. ``None`` when there are more groups than devices, or ``within_s`` is out of reach.

    Exact: the best time is one of the groups' times at some replica count, and a time T is
    reachable when the fewest replicas that bring each group to T or below sum to at most
    ``devices``; reachability only grows with T, so the smallest reachable T is searched by
    bisection over the sorted candidates."""
    if len(compute_s) > devices:
        return None
    times = [[_stage_s(c, w, r, cluster) for r in range(1, devices + 1)]
             for c, w in zip(compute_s, weight_bytes)]

    def fewest(limit: float) -> tuple[int, ...] | None:
        counts = []
        for row in times:
            r = next((r for r, t in enumerate(row, start=1) if t <= limit), None)
            if r is None:
                return None
            counts.append(r)
        return tuple(counts) if sum(counts) <= devices else None

    if within_s is not None:
        return fewest(within_s)
    candidates = sorted({t for row in times for t in row})
    low, high = 0, len(candidates) - 1  # the largest candidate is reached with one replica each
    while low < high:
        middle = (low + high) // 2
        if fewest(candidates[middle]) is None:
            low = middle + 1
        else:
            high = middle
    return fewest(candidates[low])


def replica_problem(problem: Problem, replicas: Sequence[int],
                    cluster: TrainingCluster) -> Problem:
    """The shape ``replicas`` as a problem for the solver: devices ``g0``, ``g1``, ... (one per
    group, of type ``<type> xR``, so that only groups of equal replicas are interchangeable),
    joined by the cluster's network, on which a node takes its time over ``R``. A unit that
    holds weights takes at least their all-reduce over ``R`` (its excess charged to the node
    that holds them): per unit, the rule's ``max(compute, all-reduce)``, which summed over a
    group bounds the group's from above, up to the all-reduce's latency term, which is per group.
    """
    rule = _Rule(problem, cluster)
    base = problem.cluster.devices[0].type
    devices = training_devices(cluster, prefix="g", types=tuple(f"{base} x{r}" for r in replicas))
    compute: dict[str, dict[str, float]] = {}
    for unit, unit_s, weights in zip(rule.units, rule.compute_s, rule.weight_bytes):
        holder = next((n for n in unit if problem.graph.node(n).trainable_bytes), unit[0])
        for name in unit:
            compute[name] = {}
            for device, r in zip(devices.names, replicas):
                sync = ring_allreduce_s(weights, r, latency_s=0.0,
                                        bandwidth_bytes_per_s=cluster.bandwidth_bytes_per_s)
                excess = max(0.0, sync - unit_s) if name == holder else 0.0
                compute[name][device] = (rule.node_s[name] + excess) / r
    return Problem(graph=problem.graph, cluster=devices,
                   costs=Costs(compute_s=compute, source=dict(problem.costs.source)))


# --- the rule's terms, kept up to date under moves -----------------------------------------


class _Rule:
    """What the rule reads of a step problem, once: the colocated units in order of their first
    node, each unit's compute (on any of the identical devices) and weights, and the forward
    copies: for each node that is neither a backward nor an optimizer step, its out-edges by
    the unit they enter, and whether a gradient comes back (it has a backward node)."""

    def __init__(self, problem: Problem, cluster: TrainingCluster) -> None:
        graph, costs = problem.graph, problem.costs
        self.cluster = cluster
        self.node_s: dict[str, float] = {}
        for node in graph.nodes:
            times = sorted({costs.compute_s[node.name][d] for d in problem.cluster.names})
            if len(times) != 1 or not math.isfinite(times[0]):
                raise ValueError(f"node {node.name!r} takes {times} s on the devices: the "
                                 "replica rule needs identical devices")
            self.node_s[node.name] = times[0]
        self.units = sorted(set(graph.colocation_of.values()),
                            key=lambda unit: min(graph.index[n] for n in unit))
        unit_of = {n: u for u, unit in enumerate(self.units) for n in unit}
        self.compute_s = [math.fsum(self.node_s[n] for n in unit) for unit in self.units]
        self.weight_bytes = [sum(graph.node(n).trainable_bytes for n in unit)
                             for unit in self.units]
        # sources[s] = (its unit, whether its gradient comes back, ((reader unit, bytes), ...))
        self.sources: list[tuple[int, bool, tuple[tuple[int, int], ...]]] = []
        touching: list[set[int]] = [set() for _ in self.units]
        names = {n.name for n in graph.nodes}
        for node in graph.nodes:
            if node.name.endswith((BACKWARD, STEP)) or not graph.out_edges(node.name):
                continue
            reads = tuple((unit_of[e.dst], e.bytes) for e in graph.out_edges(node.name))
            s = len(self.sources)
            self.sources.append((unit_of[node.name], node.name + BACKWARD in names, reads))
            for u in {unit_of[node.name], *(u for u, _ in reads)}:
                touching[u].add(s)
        self.touching = [tuple(sorted(t)) for t in touching]  # the sources a unit's move changes


class _State:
    """Units assigned to groups (``assign[u]``), replicas per group, and the rule's sums kept
    exact under moves: compute in integer nanoseconds, weights and copied bytes in integers
    (so that the same assignment always has the same terms, and a search that only takes
    strict improvements ends)."""

    QUANTUM_S = 1e-9

    def __init__(self, rule: _Rule, assign: Sequence[int], replicas: Sequence[int]) -> None:
        self.rule, self.assign, self.replicas = rule, list(assign), list(replicas)
        k = len(self.replicas)
        self.ticks = [round(t / self.QUANTUM_S) for t in rule.compute_s]
        self.compute, self.weights, self.members = [0] * k, [0] * k, [0] * k
        for u, g in enumerate(self.assign):
            self._place(u, g, +1)
        # (from group, to group) -> [activation bytes, copies, gradient bytes, copies]: the
        # copies are counted so that a direction only zero-byte values cross still pays its
        # messages' latency, as the simulator's copies and PipeDream's boundaries do.
        self.flows: dict[tuple[int, int], list[int]] = {}
        for s in range(len(rule.sources)):
            self._copies(s, +1)

    def _place(self, u: int, g: int, sign: int) -> None:
        self.compute[g] += sign * self.ticks[u]
        self.weights[g] += sign * self.rule.weight_bytes[u]
        self.members[g] += sign

    def _copies(self, s: int, sign: int) -> None:
        unit, gradient, reads = self.rule.sources[s]
        home = self.assign[unit]
        copies: dict[int, int] = {}
        for u, nbytes in reads:
            to = self.assign[u]
            if to != home:
                copies[to] = max(copies.get(to, 0), nbytes)
        for to, nbytes in copies.items():
            flow = self.flows.setdefault((home, to), [0, 0, 0, 0])
            flow[0] += sign * nbytes
            flow[1] += sign
            if gradient:
                flow[2] += sign * nbytes
                flow[3] += sign

    def move(self, u: int, g: int) -> None:
        touched = self.rule.touching[u]
        for s in touched:
            self._copies(s, -1)
        self._place(u, self.assign[u], -1)
        self.assign[u] = g
        self._place(u, g, +1)
        for s in touched:
            self._copies(s, +1)

    def terms(self, compute_s: Sequence[float] | None = None
              ) -> tuple[dict[int, float], dict[tuple[int, int], float]]:
        """Each group's time per sample (groups with members) and each link's; ``compute_s``
        per group, when given, instead of the state's nanoseconds."""
        cluster = self.rule.cluster
        if compute_s is None:
            compute_s = [ticks * self.QUANTUM_S for ticks in self.compute]
        group_s = {g: _stage_s(compute_s[g], self.weights[g], self.replicas[g], cluster)
                   for g in range(len(self.replicas)) if self.members[g]}
        link_s: dict[tuple[int, int], float] = {}
        for (a, b), (sent, copies, returned, gradients) in self.flows.items():
            if copies:
                t = _message_s(sent, cluster) + (_message_s(returned, cluster) if gradients
                                                 else 0.0)
                key = (min(a, b), max(a, b))
                link_s[key] = link_s.get(key, 0.0) + t
        return group_s, link_s

    def vector(self) -> list[float]:
        """All terms, largest first: the search minimises it lexicographically (the slowest
        term, then the next, ...), so moves that relieve a tie for the slowest still count."""
        group_s, link_s = self.terms()
        return sorted([*group_s.values(), *link_s.values()], reverse=True)


def _message_s(nbytes: int, cluster: TrainingCluster) -> float:
    return transfer_time_s(nbytes, bandwidth_bytes_per_s=cluster.bandwidth_bytes_per_s,
                           latency_s=cluster.latency_s)


# --- the search under the rule ----------------------------------------------------------------


def _polish(rule: _Rule, assign: Sequence[int], replicas: Sequence[int], devices: int,
            deadline: float | None) -> tuple[_State, int]:
    """Local search from ``assign`` under the rule, lexicographically on ``_State.vector``: the
    best single move of a unit to another group that has devices, else the best replicas for
    the groups as they are (``allocate_replicas``; a group left empty gives its devices back),
    else the best merge of two groups (their units in one group, replicas allocated anew);
    until none improves, ``MOVES_PER_UNIT`` steps per unit, or the ``deadline`` (a
    ``time.perf_counter`` value). Returns the state and the steps taken.

    Moves come first: they refine the groups the solver made, and a merge taken while those
    are still rough locks in a worse shape (taking the best of the three kinds at every step
    instead left GNMT-large on 16 devices at 55.2 ms rather than 42.0)."""
    state = _State(rule, assign, replicas)
    value = state.vector()
    steps = 0
    while steps < MOVES_PER_UNIT * len(rule.units) and (deadline is None
                                                        or time.perf_counter() < deadline):
        move = _best_move(state, value)
        if move is not None:
            state.move(move[1], move[2])
            value = move[0]
        else:
            step = (_reallocated(rule, state.assign, value, devices)
                    or _best_merge(rule, state, value, devices))
            if step is None:
                break
            state, value = step
        steps += 1
    return state, steps


def _best_move(state: _State, value: list[float]) -> tuple[list[float], int, int] | None:
    """The best single move of a unit to another group with devices that improves on
    ``value``: its vector, the unit and the group (``state`` is left as it was)."""
    best: tuple[list[float], int, int] | None = None
    targets = [g for g, r in enumerate(state.replicas) if r]
    for u, home in enumerate(list(state.assign)):
        for g in targets:
            if g == home:
                continue
            state.move(u, g)
            moved = state.vector()
            state.move(u, home)
            if moved < (value if best is None else best[0]):
                best = (moved, u, g)
    return best


def _reallocated(rule: _Rule, assign: Sequence[int], value: list[float],
                 devices: int) -> tuple[_State, list[float]] | None:
    """``assign`` with the best replicas for its groups, if that improves on ``value``."""
    groups = sorted(set(assign))
    compute, weights = _group_sums(rule, assign, max(assign) + 1)
    counts = allocate_replicas([compute[g] for g in groups], [weights[g] for g in groups],
                               devices, rule.cluster)
    if counts is None:
        return None
    replicas = [0] * (max(assign) + 1)
    for g, r in zip(groups, counts):
        replicas[g] = r
    state = _State(rule, assign, replicas)
    found = state.vector()
    return (state, found) if found < value else None


def _best_merge(rule: _Rule, state: _State, value: list[float],
                devices: int) -> tuple[_State, list[float]] | None:
    best: tuple[_State, list[float]] | None = None
    groups = sorted(set(state.assign))
    for i, a in enumerate(groups):
        for b in groups[i + 1:]:
            merged = [a if g == b else g for g in state.assign]
            found = _reallocated(rule, merged, value if best is None else best[1], devices)
            if found is not None:
                best = found
    return best


# --- the planner ------------------------------------------------------------------------------


@dataclass(frozen=True)
class Attempt:
    """One start of the polish: the uniform shape it came from (``start`` replicas per group)
    and the round; ``seed``, where its placement came from (``solver``: a solve of ``shape``,
    replicas per group; ``one group``: every layer in the first group of the uniform shape, no
    solve); the solver's name for its plan, status and time (for ``one group``, empty and the
    polish's time); the rule's time per sample of the seed and of the polished plan; the
    polish's steps."""

    start: int
    round: int
    seed: str
    shape: tuple[int, ...]
    solver: str
    status: str
    wall_s: float
    solved_s: float
    polished_s: float
    moves: int


@dataclass(frozen=True)
class ReplicaPlanning:
    """The best plan found and the attempt it came from (``found_by``, an index into
    ``attempts``; ``None``: data parallelism), data parallelism (one group on every device, or
    as many as help), the work bound (one device's time over the devices: no plan is faster),
    every attempt, and the planner's wall time."""

    plan: ReplicatedPlan
    found_by: int | None
    data_parallel: ReplicatedPlan
    work_bound_s: float
    devices: int
    attempts: tuple[Attempt, ...]
    wall_s: float

    @property
    def at_bound(self) -> bool:
        return self.plan.time_per_sample_s <= self.work_bound_s * (1 + 1e-9)

    def uniform_s(self) -> dict[int, float]:
        """Replicas R -> the rule's time of the solver's own plan for N/R groups of R (the first
        round of that start, not polished); R = N is data parallelism."""
        found = {a.start: a.solved_s for a in self.attempts
                 if a.seed == "solver" and a.round == 0}
        return {**found, self.devices: self.data_parallel.time_per_sample_s}


@dataclass
class _Best:
    """The best plan so far and the index of the attempt that found it."""

    plan: ReplicatedPlan
    attempt: int | None = None

    def offer(self, plan: ReplicatedPlan, attempt: int) -> None:
        if _better(plan, self.plan):
            self.plan, self.attempt = plan, attempt


def plan_replicas(problem: Problem, cluster: TrainingCluster, *,
                  options: SolveOptions | None = None, rounds: int = MAX_ROUNDS) -> ReplicaPlanning:
    """The replicated plan of ``problem``'s step on ``cluster`` with the smallest time per
    sample under the rule (the module docstring, item 4). ``options`` configure every solve
    (``time_limit_s`` is per solve, and per polish unless ``deterministic``; the objective is
    always ``throughput``)."""
    began = time.perf_counter()
    options = replace(options or SolveOptions(), objective="throughput")
    rule = _Rule(problem, cluster)
    devices = cluster.devices
    whole = [0] * len(rule.units)
    counts = allocate_replicas([math.fsum(rule.compute_s)], [sum(rule.weight_bytes)], devices,
                               cluster)
    assert counts is not None
    data_parallel = _plan(problem, rule, _State(rule, whole, counts), names=("g0",))
    bound = math.fsum(rule.compute_s) / devices
    best, attempts = _Best(data_parallel), []
    starts = [r for r in range(1, devices) if devices % r == 0]
    for start in starts if data_parallel.time_per_sample_s > bound * (1 + 1e-9) else ():
        _one_group(problem, rule, start, options, best, attempts)
        _rounds(problem, rule, start, options, rounds, best, attempts)
        if best.plan.time_per_sample_s <= bound * (1 + 1e-9):
            break
    return ReplicaPlanning(plan=_fewest_devices(problem, rule, best.plan), found_by=best.attempt,
                           data_parallel=data_parallel, work_bound_s=bound, devices=devices,
                           attempts=tuple(attempts), wall_s=time.perf_counter() - began)


def _deadline(options: SolveOptions) -> float | None:
    """When a polish stops: after the solve's time limit, unless the solve is deterministic."""
    return None if options.deterministic else time.perf_counter() + options.time_limit_s


def _one_group(problem: Problem, rule: _Rule, start: int, options: SolveOptions, best: _Best,
               attempts: list[Attempt]) -> None:
    """Polish every layer in one group of N/start groups of ``start`` replicas: the search
    alone, from data parallelism, with no solve (where the solver's placements lead the search
    to a worse local optimum, this one may not: GNMT-large on 4 devices)."""
    shape = (start,) * (rule.cluster.devices // start)
    names = tuple(f"g{g}" for g in range(len(shape)))
    began = time.perf_counter()
    whole = [0] * len(rule.units)
    polished, moves = _polish(rule, whole, shape, rule.cluster.devices, _deadline(options))
    plan = _plan(problem, rule, polished, names=names)
    attempts.append(Attempt(start=start, round=0, seed="one group", shape=shape, solver="",
                            status="", wall_s=time.perf_counter() - began,
                            solved_s=_State(rule, whole, shape).vector()[0],
                            polished_s=plan.time_per_sample_s, moves=moves))
    best.offer(plan, len(attempts) - 1)


def _rounds(problem: Problem, rule: _Rule, start: int, options: SolveOptions, rounds: int,
            best: _Best, attempts: list[Attempt]) -> None:
    """Solve N/start groups of ``start`` replicas, polish, and solve the polished shape again
    with the polished plan as the hint, while the polished plan improves."""
    devices = rule.cluster.devices
    shape = (start,) * (devices // start)
    hint: Placement | None = None
    previous = math.inf
    for number in range(rounds):
        shaped = replica_problem(problem, shape, rule.cluster)
        began = time.perf_counter()
        result = solve(shaped, options=options,
                       extra_baselines={"previous round": hint} if hint is not None else None)
        wall = time.perf_counter() - began
        index = {d: g for g, d in enumerate(shaped.cluster.names)}
        assign = [index[result.schedule.placement.device_of[unit[0]]] for unit in rule.units]
        polished, moves = _polish(rule, assign, shape, devices, _deadline(options))
        plan = _plan(problem, rule, polished, names=shaped.cluster.names)
        attempts.append(Attempt(start=start, round=number, seed="solver", shape=shape,
                                solver=result.solver.name, status=result.solver.status,
                                wall_s=wall, solved_s=_State(rule, assign, shape).vector()[0],
                                polished_s=plan.time_per_sample_s, moves=moves))
        best.offer(plan, len(attempts) - 1)
        used = [g for g, r in enumerate(polished.replicas) if r and polished.members[g]]
        if plan.time_per_sample_s >= previous or tuple(polished.replicas[g] for g in used) == shape:
            break
        previous = plan.time_per_sample_s
        shape = tuple(polished.replicas[g] for g in used)
        renamed = {g: f"g{i}" for i, g in enumerate(used)}
        hint = Placement(device_of={n: renamed[polished.assign[u]]
                                    for u, unit in enumerate(rule.units) for n in unit})


def _fewest_devices(problem: Problem, rule: _Rule, plan: ReplicatedPlan) -> ReplicatedPlan:
    """``plan``'s groups on the fewest devices that keep its time per sample: the search ranks
    every term, so it spends spare devices on groups that are not the slowest, and a plan whose
    slowest term is a link needs fewer replicas than the fastest groups would."""
    groups = sorted(plan.replicas)
    index = {g: i for i, g in enumerate(groups)}
    compute, weights = _group_sums(rule, [index[plan.device_of[unit[0]]] for unit in rule.units],
                                   len(groups))
    counts = allocate_replicas(compute, weights, sum(plan.replicas.values()), rule.cluster,
                               within_s=plan.time_per_sample_s)
    assert counts is not None  # the plan's own replicas keep it
    fewer = time_per_sample(problem, plan.device_of, dict(zip(groups, counts)), rule.cluster)
    return fewer if _better(fewer, plan) else plan


def _better(plan: ReplicatedPlan, than: ReplicatedPlan) -> bool:
    """Faster (beyond rounding), or as fast on fewer devices."""
    if plan.time_per_sample_s < than.time_per_sample_s * (1 - 1e-12):
        return True
    return (plan.time_per_sample_s <= than.time_per_sample_s * (1 + 1e-12)
            and plan.devices_used < than.devices_used)


def _plan(problem: Problem, rule: _Rule, state: _State,
          names: Sequence[str]) -> ReplicatedPlan:
    """``state`` as a ``ReplicatedPlan`` whose groups are ``names[g]``, timed by the rule."""
    device_of = {n: names[state.assign[u]] for u, unit in enumerate(rule.units) for n in unit}
    replicas = {names[g]: r for g, r in enumerate(state.replicas) if r and state.members[g]}
    return time_per_sample(problem, device_of, replicas, rule.cluster)

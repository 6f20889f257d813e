"""The stages of a generation plan (``--generate N``, ``GenerationStages``): the causal LM
wrapped with a static key-value cache (``trace.generate.CachedLM``), traced, costed and folded
twice, on the prompt (prefill) and on one token (decode), into graphs of the same ops; solved
as one problem whose costs are the prefill's plus N - 1 steps' (``summed_problem``); then each
pass simulated on its own graph under the plan's placement (``GenerationRecord``: prefill, time
per token, total, cache per device), the baselines scored the same way and the fastest kept.
The emitted model generates (``emit.generate``) and is checked against the original's
``generate(do_sample=False)``, token for token.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch

from autoplace.config import Config, Objective
from autoplace.emit import PartitionedModel
from autoplace.emit.generate import check_generation, emit_decode
from autoplace.errors import ConfigError, TraceError
from autoplace.formats.plan import Plan
from autoplace.formats.records import GenerationRecord
from autoplace.ir import Cluster, Costs, HostCosts, OpGraph, Placement, Problem, Schedule
from autoplace.pipeline.emitting import Emitting
from autoplace.pipeline.forward import Forward, Loaded, Tracing, traced_problem
from autoplace.pipeline.inference import InferenceStages, Solved
from autoplace.pipeline.record import min_gain
from autoplace.progress import stage
from autoplace.progress.notes import collecting, note
from autoplace.simulate import simulate
from autoplace.solve import SolveResult, solve
from autoplace.solve.baselines.accelerate import accelerate_baselines, covering_key
from autoplace.trace.generate import (
    CACHE_BUFFER_PREFIXES,
    CachedLM,
    check_same_ops,
    generation_inputs,
    layer_cache_bytes,
    prompt_of,
)

__all__ = ["GenerationSolved", "GenerationStages", "cache_bytes", "cache_on_modules",
           "cache_overflow", "summed_problem"]


@dataclass(frozen=True)
class GenerationSolved(Solved):
    """A generation solved: ``forward`` is the prefill's, its problem the summed one;
    ``decode`` the one-token pass's; ``record`` the plan's generation figures."""

    decode: Forward | None = None
    prefill_problem: Problem | None = None
    prefill_schedule: Schedule | None = None  # the plan's placement of the prompt's pass
    wrapper: CachedLM | None = None
    prompt: torch.Tensor | None = None
    record: GenerationRecord | None = None


def summed_problem(prefill: Problem, decode: Problem, *, steps: int) -> Problem:
    """One problem for the solver: ``prefill``'s graph (its sizes, for memory: the prompt's
    activations are the larger) with each node's time the prefill's plus ``steps`` decode
    steps', and each edge's bytes too, up to the value's size (an edge carries at most its
    source's output). It guides the solver only, and under a placement takes at most the
    prefill and the steps one after another: the passes' critical paths merge, and each
    copy's latency and segment call is paid once. The plan's figures come from each pass's
    own simulation (``_scored``)."""
    names = [n.name for n in prefill.graph.nodes]
    if names != [n.name for n in decode.graph.nodes]:
        raise TraceError("the prompt's pass and one token's folded into different graphs, so "
                         "one placement cannot place both: plan it without --generate")
    step_bytes = {(e.src, e.dst): e.bytes for e in decode.graph.edges}
    size = {n.name: n.output_bytes for n in prefill.graph.nodes}
    edges = tuple(replace(e, bytes=min(size[e.src], e.bytes + steps * step_bytes[(e.src, e.dst)]))
                  for e in prefill.graph.edges)
    compute = {name: {device: secs + steps * decode.costs.of(name, device)
                      for device, secs in per_device.items()}
               for name, per_device in prefill.costs.compute_s.items()}
    host = None
    if prefill.costs.host is not None and decode.costs.host is not None:
        launch = {name: {device: secs + steps * decode.costs.host.launch_of(name, device)
                         for device, secs in per_device.items()}
                  for name, per_device in prefill.costs.host.launch_s.items()}
        host = HostCosts(launch_s=launch, call_s=prefill.costs.host.call_s,
                         handover_s=prefill.costs.host.handover_s)
    costs = Costs(compute_s=compute, source=prefill.costs.source,
                  device_source=prefill.costs.device_source, host=host)
    return replace(prefill, graph=replace(prefill.graph, edges=edges), costs=costs)


def cache_bytes(problem: Problem, placement: Placement, module: torch.fx.GraphModule,
                wrapper: CachedLM) -> dict[str, int]:
    """The key-value cache each device of ``problem`` holds under ``placement``: each layer's
    keys and values live with the first op that reads them (``trace``'s rule for buffers)."""
    sizes = {name: t.numel() * t.element_size() for name, t in wrapper.named_buffers()
             if name.startswith(CACHE_BUFFER_PREFIXES)}
    node_of = {op: node.name for node in problem.graph.nodes for op in node.ops}
    position = {n: i for i, n in enumerate(module.graph.nodes)}
    held = dict.fromkeys(problem.cluster.names, 0)
    for attr in module.graph.nodes:
        if attr.op != "get_attr" or attr.target not in sizes or not attr.users:
            continue
        first = min(attr.users, key=position.__getitem__)
        held[placement.device_of[node_of[first.name]]] += sizes[str(attr.target)]
    return held


@dataclass(frozen=True)
class GenerationStages:
    """A generation plan's stages, for ``config`` (``config.generate`` new tokens)."""

    config: Config

    def solve(self, loaded: Loaded, cluster: Cluster) -> GenerationSolved:
        """Stages trace, cost and fold (each pass), then solve the summed problem and score
        its plan and the baselines by each pass's own simulation."""
        new_tokens = self.config.generate
        prompt = prompt_of(loaded.model, loaded.args, loaded.kwargs, new_tokens=new_tokens)
        wrapper = CachedLM(loaded.model, batch=prompt.shape[0],
                           max_len=prompt.shape[1] + new_tokens)
        prefill_inputs, decode_inputs = generation_inputs(prompt)
        how = Tracing.of(self.config)
        # Without autograd: a cache written by ops on weights that need gradients would hold
        # their graph (and could not be copied to be profiled).
        with torch.no_grad():
            prefill = traced_problem(wrapper, prefill_inputs, {}, cluster, how)
            with collecting() as said:  # what the prefill's tracing said, it says again
                decode = traced_problem(wrapper, decode_inputs, {}, cluster, how)
        for text in said:
            note(text, once=True)
        check_same_ops(prefill.traced, decode.traced)
        problem = summed_problem(prefill.problem, decode.problem, steps=new_tokens - 1)
        stage("solve")
        extra, _ = accelerate_baselines(wrapper, prefill.graph, problem)
        solved = solve(problem, options=self.config.solving.options(), extra_baselines=extra)
        passes = _Passes(prefill=prefill.problem, decode=decode.problem, new_tokens=new_tokens)
        totals = passes.totals(solved.baselines)
        result, gain = min_gain(passes.fastest(solved, problem, totals),
                                self.config.solving.min_gain)
        first = simulate(prefill.problem, result.schedule.placement)  # emitted as it runs
        record = passes.record(result, first, totals=totals, prompt=prompt,
                               module=prefill.traced.module, wrapper=wrapper)
        return GenerationSolved(forward=replace(prefill, problem=problem), result=result,
                                gain=gain, decode=decode, prefill_problem=prefill.problem,
                                prefill_schedule=first, wrapper=wrapper, prompt=prompt,
                                record=record)

    def record(self, solved: GenerationSolved) -> Plan:
        """The inference plan's record, with its generation figures."""
        planned = InferenceStages(self.config).record(solved)
        return replace(planned, generation=solved.record)

    def emitting(self, planned: Plan, solved: GenerationSolved, loaded: Loaded) -> Emitting:
        """The prefill's graph placed as planned, checked on the prompt (its logits)."""
        return Emitting(problem=solved.prefill_problem, schedule=solved.prefill_schedule,
                        device_of_op=planned.device_of_op,
                        args=generation_inputs(solved.prompt)[0], kwargs={},
                        model=solved.wrapper, meta_weights=loaded.checkpoint is not None)

    def check(self, planned: Plan, emitted: PartitionedModel, solved: GenerationSolved) -> Plan:
        """The decode step emitted beside the prefill (sharing its weights and cache), and the
        pair checked: greedy generation gives the original's tokens, the cache per device is
        within the plan's."""
        decode = emit_decode(emitted, solved.decode.traced.module,
                             problem=solved.prefill_problem, schedule=solved.prefill_schedule,
                             device_of_op=planned.device_of_op)
        emitted.decode = decode
        record = planned.generation
        if any(p.is_meta for p in emitted.parameters()):  # weights from --checkpoint, later
            note("generation not checked: the emitted model reads its weights from the "
                 "checkpoint when it is loaded")
            return planned
        if not self.config.emit.verify:
            return planned
        stage("verify")
        checked = check_generation(solved.wrapper.model, emitted, decode, solved.prompt,
                                   new_tokens=record.new_tokens, planned=record.cache_bytes,
                                   cluster=planned.problem.cluster)
        return replace(planned, generation=replace(
            record, check="passed", measured_cache_bytes=checked.cache_bytes,
            measured_step_s=checked.step_s))


@dataclass(frozen=True)
class _Passes:
    """The two passes' problems, to score a placement of the summed one as generation runs it:
    the prefill, then ``new_tokens - 1`` decode steps, each simulated on its own graph."""

    prefill: Problem
    decode: Problem
    new_tokens: int

    def times(self, placement: Placement) -> tuple[float, float]:
        return (simulate(self.prefill, placement).makespan_s,
                simulate(self.decode, placement).makespan_s)

    def total(self, placement: Placement) -> float:
        first, step = self.times(placement)
        return first + (self.new_tokens - 1) * step

    def score(self, placement: Placement, objective: str) -> float:
        """What the plan minimises: the generation's time (latency), or with ``throughput``
        the busiest device's share of a decode step (decode steps of several batches in
        flight go as fast as it)."""
        if objective == Objective.THROUGHPUT:
            return simulate(self.decode, placement).objective_s(objective)
        return self.total(placement)

    def totals(self, baselines: Mapping[str, Schedule | None]) -> dict[str, float]:
        """Each baseline's generation time (``total``)."""
        return {name: self.total(s.placement) for name, s in baselines.items() if s is not None}

    def fastest(self, result: SolveResult, problem: Problem, totals: Mapping[str, float]
                ) -> SolveResult:
        """``result`` with the placement that scores best, of its own and its baselines'
        (``totals``: theirs, for latency; a note says where a baseline's is)."""
        scores = dict(totals) if result.objective != Objective.THROUGHPUT else {
            name: self.score(s.placement, result.objective)
            for name, s in result.baselines.items() if s is not None}
        own = self.score(result.schedule.placement, result.objective)
        best = min(scores, key=scores.__getitem__, default=None)
        if best is None or scores[best] >= own * (1 - 1e-9):
            return result
        note(f"generation: the {best} baseline's placement scores better than the solver's "
             f"when each pass is simulated on its own graph ({scores[best] * 1e3:.3f} ms "
             f"against {own * 1e3:.3f} ms, {result.objective}): it is the plan")
        return replace(result, schedule=simulate(problem, result.baselines[best].placement))

    def record(self, result: SolveResult, prefill: Schedule, *, totals: Mapping[str, float],
               prompt: torch.Tensor, module: torch.fx.GraphModule,
               wrapper: CachedLM) -> GenerationRecord:
        """The generation figures of ``result``'s placement, whose ``prefill`` is simulated
        already, as the baselines' ``totals`` are."""
        placement = result.schedule.placement
        return GenerationRecord(
            new_tokens=self.new_tokens, prompt_tokens=prompt.shape[1], batch=prompt.shape[0],
            prefill_s=prefill.makespan_s, step_s=simulate(self.decode, placement).makespan_s,
            cache_bytes=cache_bytes(self.prefill, placement, module, wrapper),
            lower_bound_s=(result.lower_bound_s if math.isfinite(result.lower_bound_s)
                           else 0.0),
            baselines=dict(totals))


def cache_on_modules(graph: OpGraph, model: torch.nn.Module, args: tuple[Any, ...],
                     kwargs: dict[str, Any], *, new_tokens: int) -> tuple[OpGraph, dict[str, int]]:
    """A module-level ``graph`` (``--granularity module``) with each layer's key-value cache,
    for the prompt in the example inputs and ``new_tokens``, held by the node of the module
    that writes it (its ``param_bytes``: resident as weights are); and the cache each node
    holds."""
    prompt = prompt_of(model, args, kwargs, new_tokens=new_tokens)
    writers = layer_cache_bytes(model, batch=prompt.shape[0],
                                max_len=prompt.shape[1] + new_tokens)
    names = {n.name for n in graph.nodes if not n.is_input}
    held: dict[str, int] = {}
    for path, size in writers.items():
        node = covering_key(path, names)
        if node is None:
            raise ConfigError(f"{{generate}}: no module of the device_map holds {path}, "
                              "which writes a cache layer: plan it at op granularity")
        held[node] = held.get(node, 0) + size
    nodes = tuple(replace(n, param_bytes=n.param_bytes + held.get(n.name, 0))
                  for n in graph.nodes)
    return replace(graph, nodes=nodes), held


def cache_overflow(problem: Problem, placement: Placement) -> dict[str, int]:
    """The bytes by which the weights and cache ``placement`` puts on each device exceed what
    it holds (its memory less its reserve), where they do: before any activation."""
    resident: dict[str, int] = {}
    for node in problem.graph.nodes:
        device = placement.device_of[node.name]
        resident[device] = resident.get(device, 0) + node.param_bytes
    room = {d.name: d.memory_bytes - d.reserved_bytes for d in problem.cluster.devices}
    return {d: size - room[d] for d, size in resident.items() if size > room[d]}

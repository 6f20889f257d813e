"""The pp x tp candidate of a plan (``--pp P --tp T``, ``Config.parallel.pp``): the first
P x T devices as a mesh, the model cut into P pipeline stages, each run by a group of T
tensor-parallel ranks (Megatron-LM's layout). The model is observed under DTensor on T fake
ranks as ``pipeline.tensor``'s candidate is; each group prices its share
(``solve.tensor.tensor_problem``, its rings over that group), and the problem on the groups'
first ranks is cut by ``contiguous_dp`` (the throughput objective: stages balanced, each within
its memory) and simulated: a pass through the stages, or a training step
(``tensor_step_problem`` per group, copied for the micro-batches in GPipe's or 1F1B's order).
A tensor two stages read (a tied embedding) is copied into the later one (``_with_copies``;
in training their gradients summed). The one-device model is emitted with each stage on a
device of its own (``cpu:<s>``), run by ``emit.distributed.tensor_stages`` (a pass) and
``tensor_stages_train`` (a step) on a ``("pp", "tp")`` mesh of gloo ranks and checked.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch

from autoplace.config import Config
from autoplace.emit import PartitionedModel, emit_model
from autoplace.emit.codegen.lower import fetch
from autoplace.emit.distributed.tensor import column_row, divisible, matmuls
from autoplace.emit.distributed.tensor_stages import stage_devices
from autoplace.errors import ConfigError, InfeasibleError
from autoplace.formats.plan import Plan
from autoplace.formats.records import TensorParallelRecord
from autoplace.ir import Cluster, Costs, Device, Placement, Problem, Schedule
from autoplace.pipeline.mesh import dp_shard, renamed, stretch, stretched
from autoplace.pipeline.tensor import (
    Priced,
    Unplaced,
    Weighed,
    bytes_over,
    keep_fastest,
    measured_collectives_s,
    observe_split,
    on_workers_here,
    one_device_copy,
)
from autoplace.progress import stage
from autoplace.progress.notes import collecting, note
from autoplace.simulate import simulate
from autoplace.simulate.schedules import STEP, phase_of
from autoplace.solve.baselines.partition import contiguous_dp
from autoplace.solve.tensor import Observed, ring_pricer, tensor_problem
from autoplace.solve.tensor_train import tensor_step_problem
from autoplace.solve.whatif import restrict
from autoplace.trace import TracedModel
from autoplace.train.graph import microbatch_copies

__all__ = ["WORTH", "pp_values", "staged_devices", "staged_pass_candidate",
           "staged_step_candidate"]

WORTH = 0.05  # the least share of a pass's compute that makes a stage worth its ranks


def staged_pass_candidate(planned: Plan | None, loaded: Any, cluster: Cluster, config: Config,
                          *, forward: Any = None, failure: str | None = None
                          ) -> tuple[Plan, PartitionedModel | None]:
    """The pp x tp candidate of an inference plan's pass of ``loaded`` beside ``planned``
    (``None``: no placement fits, ``failure`` says why, and the plan is the mesh), weighed,
    checked on its gloo ranks and kept as ``pipeline.tensor``'s candidates are."""
    from autoplace.pipeline.forward import Tracing, traced_problem

    traced = forward
    if traced is None:
        with collecting():  # the plan's pass said what tracing finds
            traced = traced_problem(loaded.model, loaded.args, loaded.kwargs, cluster,
                                    Tracing.of(config, checked=True))
    prepared = _observed(traced.problem, traced.traced, config.parallel.tp,
                         (loaded.args, loaded.kwargs))
    weighed = [_staged(traced.problem, traced.traced, loaded.args, loaded.kwargs, pp=pp,
                       tp=config.parallel.tp, cache=config.cost.cache, prepared=prepared,
                       asked=config.parallel.pp)
               for pp in pp_values(cluster, config.parallel.pp, config.parallel.tp)]
    if not any(weighed):
        return _none_cut(planned, failure)
    return keep_fastest(planned, weighed, loaded.model, loaded.args, loaded.kwargs,
                        verify=config.emit.verify,
                        unplaced=Unplaced(failure, config.name, config.dtype))


def staged_step_candidate(planned: Plan | None, model: torch.nn.Module,
                          whole: tuple[tuple[Any, ...], dict[str, Any]], cluster: Cluster,
                          config: Config, *, forward: Any = None, failure: str | None = None
                          ) -> tuple[Plan, PartitionedModel | None]:
    """The pp x tp candidate of a training plan's step: ``model`` (the model and its loss) on
    the ``whole`` batch cut into ``training.microbatches``, traced and observed on one of them
    (``forward``, the plan's trace, serves where it is the whole batch's and there is one
    micro-batch), each stage group's step priced with the plan's optimizer, its micro-batches
    scheduled as ``training.schedule`` says (``auto``: GPipe and 1F1B weighed), checked by 3
    steps on its gloo ranks and kept as ``pipeline.tensor``'s candidates are."""
    from autoplace.pipeline.forward import Tracing, traced_problem
    from autoplace.pipeline.measured import backward_factors
    from autoplace.train.layers import kept_state

    args, kwargs = whole
    count = config.training.microbatches
    chosen = str(config.training.schedule)
    schedules = (chosen,) if chosen != "auto" else ("gpipe", "1f1b") if count > 1 else ("gpipe",)
    with kept_state(model):  # tracing, observing and checking run it in train()
        shard = dp_shard(args, kwargs, count)  # one micro-batch
        traced = forward if count == 1 else None
        if traced is None:
            with collecting():  # the plan's step said what tracing finds
                traced = traced_problem(model, *shard, cluster, Tracing.of(config, checked=True))
        with collecting():
            factors, _ = backward_factors(traced.profiled, model, *shard, cluster)
        tp, optimizer = config.parallel.tp, config.training.optimizer
        prepared = _observed(traced.problem, traced.traced, tp, shard, optimizer=optimizer)
        step = _Step(optimizer, factors, config.dtype, count, schedules)
        weighed = [_staged(traced.problem, traced.traced, args, kwargs, pp=pp, tp=tp,
                           cache=config.cost.cache, step=step, prepared=prepared,
                           asked=config.parallel.pp)
                   for pp in pp_values(cluster, config.parallel.pp, tp)]
        if not any(weighed):
            return _none_cut(planned, failure)
        return keep_fastest(planned, weighed, model, args, kwargs, verify=config.emit.verify,
                            optimizer=optimizer,
                            unplaced=Unplaced(failure, config.name, config.dtype))


def _none_cut(planned: Plan | None, failure: str | None) -> tuple[Plan, None]:
    """``--pp auto`` where the model cut into no degree (each noted): the placement, or where
    none fits, ``InfeasibleError`` saying both."""
    if planned is None:
        raise InfeasibleError(f"{failure.rstrip('. ')}. The pp x tp candidate (--pp auto) was "
                              "not weighed either: the model cut into none of its degrees (the "
                              "notes say why)")
    return planned, None


def pp_values(cluster: Cluster, pp: int | str, tp: int) -> list[int]:
    """The pipeline degrees to weigh with ``tp``: ``[pp]`` (its devices checked by
    ``staged_devices``), or for ``"auto"`` every pp of 2 or more whose pp x ``tp`` leading
    devices are there and alike; ``ConfigError`` where there is none."""
    if pp != "auto":
        staged_devices(cluster, int(pp), tp)
        return [int(pp)]
    devices = cluster.devices
    found = [p for p in range(2, len(devices) // tp + 1)
             if len({(d.type, d.memory_bytes) for d in devices[:p * tp]}) == 1]
    if not found:
        raise ConfigError(f"{{parallel.pp=auto}} with {{parallel.tp={tp}}}: a mesh of 2 "
                          f"stages needs {2 * tp} alike devices, and the cluster's leading "
                          f"ones are fewer ({len(devices)} devices): lower {{parallel.tp}}")
    return found


def staged_devices(cluster: Cluster, pp: int, tp: int) -> tuple[Device, ...]:
    """The first ``pp`` x ``tp`` devices of ``cluster``, in rank order (stage s on the s-th
    ``tp`` of them), which must be there and alike; else ``ConfigError``."""
    devices = cluster.devices
    if pp * tp > len(devices):
        fits = [f"--pp {p} --tp {tp}" for p in range(2, len(devices) // tp + 1)]
        raise ConfigError(f"{{parallel.pp={pp}}} x {{parallel.tp={tp}}} make a mesh of "
                          f"{pp * tp} ranks, and the cluster has {len(devices)} devices: "
                          "choose degrees whose product is at most the devices' count"
                          + (f" ({', '.join(fits)})" if fits else ""))
    chosen = devices[:pp * tp]
    if len({(d.type, d.memory_bytes) for d in chosen}) > 1:
        raise ConfigError(f"{{parallel.pp={pp}}} x {{parallel.tp={tp}}} split every stage's "
                          f"ops evenly, and {', '.join(d.name for d in chosen)} are not alike: "
                          "plan it on devices of one type")
    return chosen


@dataclass(frozen=True)
class _Step:
    """A training candidate's step: the optimizer, the backward factors per device
    (``train.step_problem``'s), the dtype, the micro-batches and the schedules to weigh."""

    optimizer: str
    factors: Mapping[str, float]
    dtype: str
    microbatches: int
    schedules: tuple[str, ...]


def _observed(problem: Problem, traced: TracedModel, tp: int, on: tuple[Any, Any], *,
              optimizer: str | None = None) -> tuple[dict[str, tuple[str, int]], Observed]:
    """The split of ``traced`` over ``tp`` ranks and what DTensor does on it, observed on
    ``on`` (one micro-batch of a training step, with its ``optimizer``): the same for every
    pp (``_staged``)."""
    stage("tensor parallel")
    one = one_device_copy(traced)
    split, whole = divisible(one, column_row(one), tp)
    if whole:
        note(f"tensor parallel over {tp} ranks: {', '.join(whole)} kept whole, their split "
             f"dimension not a multiple of {tp}")
    return split, observe_split(problem, traced, split, tp, *on, optimizer=optimizer)


def _staged(problem: Problem, traced: TracedModel, args: tuple[Any, ...],
            kwargs: dict[str, Any], *, pp: int, tp: int, cache: Any,
            prepared: tuple[dict[str, tuple[str, int]], Observed], step: _Step | None = None,
            asked: int | str | None = None) -> Weighed | None:
    """The pp x tp candidate, unchecked: the ``prepared`` split and observation (``_observed``)
    priced per stage group, cut into stages, simulated (a ``step``: each of its schedules, the
    one that fits fastest kept), and the one-device model emitted as its stages, to run on
    ``args``/``kwargs``. ``asked`` ``"auto"``: a pp the model does not cut into is noted and
    ``None``."""
    chosen = staged_devices(problem.cluster, pp, tp)
    split, observed = prepared
    if asked == "auto":
        try:
            return _staged(problem, traced, args, kwargs, pp=pp, tp=tp, cache=cache,
                           prepared=prepared, step=step)
        except ConfigError as refused:
            note(f"pp {pp} x tp {tp} not weighed (--pp auto): {refused}")
            return None
    everyone = tuple(d.name for d in chosen)
    groups = [everyone[s * tp:(s + 1) * tp] for s in range(pp)]
    here = on_workers_here(chosen)
    measured_s = (measured_collectives_s(observed, tp, chosen[0].torch_device, cache)
                  if here else None)
    factor = stretch(len(everyone)) if here else 1.0
    staged = stretched(_stage_problem(problem, observed, groups, here=here,
                                      collectives_s=measured_s), factor)
    staged = replace(staged, graph=replace(staged.graph, colocate=()))  # copies: _copied
    leaders = [g[0] for g in groups]
    stages = _cut(staged, leaders)  # each forward node's stage
    shared = _shared(traced.module, {op: stages.device_of[n.name] for n in problem.graph.nodes
                                     for op in n.ops})
    staged = _copied(staged, traced.module, shared)
    module = _with_copies(traced.module, shared)
    kept = None
    if step is None:
        schedule = simulate(staged, stages)
    else:
        tied = _tied_seconds(problem, traced.module, shared, stages)
        staged, kept, schedule = _stepped(_copied(problem, traced.module, shared), observed,
                                          groups, stages, step, here=here,
                                          collectives_s=measured_s, factor=factor, tied=tied)
    stage_of = {d: s for s, d in enumerate(leaders)}
    cut = emit_model(
        module, {op: f"cpu:{stage_of[stages.device_of[n.name]]}"
                 for n in problem.graph.nodes for op in n.ops},
        order=[op for n in problem.graph.nodes for op in n.ops], device_map={"cpu:*": "cpu"},
        runtime="sequential", meta_weights=traced.has_meta_params)
    if len(stage_devices(cut)) != pp:  # the emitter keeps each stage's ops in one run
        raise ConfigError(f"{{parallel.pp={pp}}}: the emitted model holds "
                          f"{len(stage_devices(cut))} stages; plan with fewer")
    cut.example_inputs = (tuple(args), dict(kwargs))  # saved with it: what its ranks run
    cut.tied = _tied_names(module, shared)  # stages.json: their gradients summed
    split = renamed(split, cut)
    columns, rows = matmuls(split)
    moved = [c for table in (observed.collectives, observed.backward_collectives)
             for per in table.values() for c in per]
    peaks = tuple(schedule.peak_bytes[d] for d in leaders)
    record = TensorParallelRecord(
        ranks=tp, devices=everyone, makespan_s=schedule.makespan_s, peak_bytes=max(peaks),
        columns=columns, rows=rows, collectives=len(moved),
        collective_bytes=sum(b for _, b in moved), split=split,
        optimizer=step.optimizer if step else None,
        torch_devices=tuple(d.torch_device for d in chosen), over_bytes=bytes_over(schedule),
        pp=pp, stage_peak_bytes=peaks, microbatches=step.microbatches if step else 1,
        schedule=kept)
    return Weighed(priced=Priced(record=record, observed=observed, rank0=staged,
                                 schedule=schedule),
                   one=cut, cluster=problem.cluster, tracer=traced.tracer,
                   traced_ops=len(traced.graph.nodes))


def _stepped(problem: Problem, observed: Observed, groups: list[tuple[str, ...]],
             cut: Placement, step: _Step, *, here: bool, collectives_s: float | None,
             factor: float, tied: Mapping[str, float]) -> tuple[Problem, str, Schedule]:
    """The training step on the stages ``cut`` (each forward node's stage): each group's
    step (``tensor_step_problem``) on its first device, copied for the micro-batches in each
    of ``step.schedules`` (``train.graph.microbatch_copies``), every backward and update on
    its forward node's stage, each update of a tied weight's copy grown by ``tied`` (its
    gradients summed across the stages); the schedule kept (the one that fits, the fastest):
    its problem, name and simulation."""
    per_group = [tensor_step_problem(problem, observed, g, optimizer=step.optimizer,
                                     factors=step.factors, measured=here,
                                     collectives_s=collectives_s, dtype=step.dtype)
                 for g in groups]
    one = stretched(_merged(problem, per_group, groups), factor)
    one = replace(one, costs=replace(one.costs, compute_s={
        n: {d: t + tied.get(n, 0.0) for d, t in per.items()}
        for n, per in one.costs.compute_s.items()}))
    last = groups[-1][0]
    found = {}
    for schedule in step.schedules:
        copies = (microbatch_copies(one, step.microbatches, schedule)
                  if step.microbatches > 1 else one)
        placement = Placement(device_of={
            n.name: cut.device_of.get(phase_of(n.name)[0], last) for n in copies.graph.nodes})
        found[schedule] = copies, simulate(copies, placement)
    kept = min(found, key=lambda k: (bytes_over(found[k][1]), found[k][1].makespan_s))
    return found[kept][0], kept, found[kept][1]


def _stage_problem(problem: Problem, observed: Observed, groups: list[tuple[str, ...]], *,
                   here: bool, collectives_s: float | None) -> Problem:
    """``problem`` on the first device of each of ``groups``: every node as that device's tp
    group runs its share (``tensor_problem``, the collectives a ring over the group), the
    links between the groups' first devices the cluster's."""
    return _merged(problem, [tensor_problem(problem, observed, g, measured=here,
                                            collectives_s=collectives_s) for g in groups],
                   groups)


def _merged(problem: Problem, per_group: list[Problem], groups: list[tuple[str, ...]]
            ) -> Problem:
    """The problems ``per_group`` (each on its group's first device) as one on those devices,
    the links between them ``problem``'s cluster's."""
    first = per_group[0]
    leaders = tuple(g[0] for g in groups)
    compute = {n: {d: t for p in per_group for d, t in p.costs.compute_s[n].items()}
               for n in first.costs.compute_s}
    host = first.costs.host
    if host is not None:
        launch = {n: {d: t for p in per_group for d, t in p.costs.host.launch_s.get(n, {}).items()}
                  for n in host.launch_s}
        host = replace(problem.costs.host.restricted(leaders), launch_s=launch)
    return replace(restrict(problem, leaders), graph=first.graph,
                   costs=Costs(compute_s=compute, source=first.costs.source, host=host))


def _cut(staged: Problem, leaders: list[str]) -> Placement:
    """The stages: ``staged``'s topological order cut into one run of nodes a stage, the
    stages' loads balanced and each within its device's memory (``contiguous_dp``); a
    ``ConfigError`` where no cut fits or some stage would have under ``WORTH`` of the
    compute."""
    placement = contiguous_dp(staged, "throughput")
    pp = len(leaders)
    if placement is None:
        raise ConfigError(f"{{parallel.pp={pp}}}: no cut of the model into {pp} stages fits "
                          "each stage's devices: add devices, or raise {parallel.tp}")
    load = dict.fromkeys(leaders, 0.0)
    for node, device in placement.device_of.items():
        load[device] += staged.costs.of(node, device)
    used = sum(t >= WORTH * sum(load.values()) for t in load.values())
    if used < pp:
        fewer = (f"choose {{parallel.pp={used}}} or fewer" if used > 1
                 else "plan it without {parallel.pp}")
        raise ConfigError(f"{{parallel.pp={pp}}}: the model's graph cuts into at most {used} "
                          f"stages worth running (each with {WORTH:.0%} or more of a pass's "
                          f"compute): {fewer}")
    return placement


def _shared(module: torch.fx.GraphModule, stage_of: Mapping[str, str]
            ) -> dict[str, dict[str, list[str]]]:
    """Each tensor of ``module`` read in more than one stage (a tied weight; ``stage_of``: each
    op's stage), by its ``get_attr`` node: the ops that read it in each stage but the first
    that does."""
    found = {}
    position = {n: i for i, n in enumerate(module.graph.nodes)}
    for node in module.graph.nodes:
        if node.op != "get_attr" or not isinstance(fetch(module, node.target), torch.Tensor):
            continue
        by_stage: dict[str, list[str]] = {}
        for user in sorted(node.users, key=position.__getitem__):  # the first stage first
            if user.name in stage_of:
                by_stage.setdefault(stage_of[user.name], []).append(user.name)
        if len(by_stage) > 1:
            found[node.name] = dict(list(by_stage.items())[1:])
    return found


def _copied(staged: Problem, module: torch.fx.GraphModule,
            shared: Mapping[str, Mapping[str, list[str]]]) -> Problem:
    """``staged`` with each stage's copy of a ``shared`` tensor counted among its first
    reader's parameters there, trained where the tensor is (it is kept whole: tied weights
    are not split)."""
    if not shared:
        return staged
    node_of = {op: n.name for n in staged.graph.nodes for op in n.ops}
    attrs = {n.name: fetch(module, n.target) for n in module.graph.nodes if n.name in shared}
    extra: dict[str, int] = {}
    trained: dict[str, int] = {}
    for name, stages in shared.items():
        size = attrs[name].numel() * attrs[name].element_size()
        for ops in stages.values():
            reader = node_of[ops[0]]
            extra[reader] = extra.get(reader, 0) + size
            if attrs[name].requires_grad:
                trained[reader] = trained.get(reader, 0) + size
    nodes = tuple(replace(n, param_bytes=n.param_bytes + extra.get(n.name, 0),
                          trainable_bytes=n.trainable_bytes + trained.get(n.name, 0))
                  for n in staged.graph.nodes)
    return replace(staged, graph=replace(staged.graph, nodes=nodes))


def _with_copies(module: torch.fx.GraphModule,
                 shared: Mapping[str, Mapping[str, list[str]]]) -> torch.fx.GraphModule:
    """``module`` (a copy, where anything is ``shared``) in which each stage past the first
    that reads a shared tensor reads a copy of its own (``<name>_stage<k>``), so that no
    weight crosses stages: an inference pass's copies stay equal."""
    if not shared:
        return module
    import copy

    module = copy.deepcopy(module)
    nodes = {n.name: n for n in module.graph.nodes}
    for name, stages in shared.items():
        source = nodes[name]
        tensor = fetch(module, source.target)
        for k, ops in enumerate(stages.values(), start=1):
            attr = f"{name}_stage{k}"
            copied = tensor.detach().clone()
            if isinstance(tensor, torch.nn.Parameter):
                module.register_parameter(attr, torch.nn.Parameter(
                    copied, requires_grad=tensor.requires_grad))
            else:
                module.register_buffer(attr, copied)
            first = nodes[ops[0]]
            with module.graph.inserting_before(first):
                getter = module.graph.get_attr(attr)
            for op in ops:
                nodes[op].replace_input_with(source, getter)
    module.graph.lint()
    module.recompile()
    return module


def _tied_seconds(problem: Problem, module: torch.fx.GraphModule,
                  shared: Mapping[str, Mapping[str, list[str]]], cut: Placement
                  ) -> dict[str, float]:
    """Each update that waits for a trained ``shared`` tensor's gradients summed across the
    stages that hold it (an all-reduce, a ring over their first devices: Megatron-LM's
    embedding all-reduce), and how long: the update of the node that reads it first in each
    stage."""
    node_of = {op: n.name for n in problem.graph.nodes for op in n.ops}
    found: dict[str, float] = {}
    for node in module.graph.nodes:
        stages = shared.get(node.name)
        tensor = fetch(module, node.target) if stages else None
        if tensor is None or not tensor.requires_grad:
            continue
        first = next(u.name for u in sorted(node.users, key=list(module.graph.nodes).index)
                     if u.name in node_of)
        readers = [node_of[first]] + [node_of[ops[0]] for ops in stages.values()]
        devices = tuple(dict.fromkeys(cut.device_of[r] for r in readers))
        seconds = ring_pricer(problem, devices)("all_reduce",
                                                tensor.numel() * tensor.element_size())
        for reader in readers:
            found[reader + STEP] = found.get(reader + STEP, 0.0) + seconds
    return found


def _tied_names(module: torch.fx.GraphModule, shared: Mapping[str, Mapping[str, list[str]]]
                ) -> dict[str, str]:
    """Each copy ``_with_copies`` made in ``module``, by its name in the emitted model (less
    its segment), and the name there of the weight it copies: each tensor is emitted under the
    first ``get_attr`` target that reads it (``codegen.lower``), an alias's maybe."""
    first: dict[int, str] = {}
    for node in module.graph.nodes:
        if node.op == "get_attr":
            first.setdefault(id(fetch(module, node.target)), node.target)
    targets = {n.name: n.target for n in module.graph.nodes if n.name in shared}
    return {first[id(fetch(module, f"{name}_stage{k}"))]: first[id(fetch(module, targets[name]))]
            for name, stages in shared.items() for k in range(1, len(stages) + 1)}

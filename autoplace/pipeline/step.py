"""The pipeline for a training plan: one step of the model and its loss planned
(``plan_step``: replica counts, micro-batches, schedules, recomputation, each solved), then the
emitted model trained beside the original and its step's memory measured (``check_step``).
``autoplace.pipeline.plan`` calls both with ``mode="training"``."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import torch

from autoplace.emit import check_step_memory, train_emitted
from autoplace.emit.check.memory import comparable_peak_bytes
from autoplace.emit.check.outputs import ENFORCE_PEAK_DEFAULT, PeakCheck, check_peak
from autoplace.emit.distributed.ddp import REPLICA_SHARDS, SHARDINGS, microbatching
from autoplace.emit.distributed.replicas import verify_replicas
from autoplace.emit.train.microbatch import (
    action_order,
    batch_size,
    loss_rule,
    split_batch,
    stepper,
    train_step,
)
from autoplace.errors import ConfigError, InfeasibleError
from autoplace.formats.plan import Plan
from autoplace.formats.records import ReplicaOption, TrainingCheck, TrainingRecord
from autoplace.ir import Cluster, Problem, Schedule
from autoplace.pipeline.forward import Forward, Tracing, traced_problem
from autoplace.pipeline.measured import backward_factors, replica_averaging, update_rates
from autoplace.pipeline.replicas import replica_counts, replica_variants, time_share
from autoplace.progress import stage
from autoplace.progress.notes import collecting, note, note_all
from autoplace.simulate.schedules import SCHEDULES, schedule_run
from autoplace.solve import Outpaced, SolveOptions, SolveResult, solve
from autoplace.solve.bounds import lower_bound_s
from autoplace.solve.whatif import restrict
from autoplace.train import step_problem, training_memory
from autoplace.train.dataparallel import with_allreduce
from autoplace.train.graph import model_bytes, state_memory, step_state_bytes
from autoplace.train.layers import dropout_ops, updates_statistics
from autoplace.train.recompute import (
    Recomputed,
    recompute_all,
    recompute_units,
    with_recompute_where_needed,
)
from autoplace.train.sharded import with_fsdp
from autoplace.train.updates import (
    after_backward,
    with_measured_forward,
    with_measured_updates,
)

__all__ = ["Batch", "Step", "check_step", "plan_step"]

PLAN = "plan"  # the solver's placement among the candidates of ``_solve_recomputing``


Batch = tuple[tuple[Any, ...], dict[str, Any]]


@dataclass(frozen=True)
class Solved:
    """A training step solved: its problem (with recomputation, the chosen placement's graph,
    ``train.recompute``), the solve's result, the devices that recompute, and, where they
    do, the single-device baseline as recomputed (``--min-gain`` may choose it: its graph is
    another)."""

    problem: Problem
    result: SolveResult
    recompute: tuple[str, ...] = ()
    single: Recomputed | None = None


@dataclass(frozen=True)
class Step:
    """A training step as planned: ``replicas`` data-parallel replicas (each on its
    ``groups`` entry, ``groups[0]`` the planned one), each on its shard of the ``whole`` batch
    cut into ``microbatches`` (``batches``: replica 0's), the loss the ``rule`` of theirs;
    the forward, the step's problem and its solve; the devices that ``recompute``
    (``train.recompute``), and the single device's plan so (``single``, which ``--min-gain``
    may choose); ``options``, every replica count tried; ``sharding``, how the replicas hold
    the model (``ddp``, or ``fsdp``: ``train.sharded``)."""

    groups: tuple[tuple[str, ...], ...]
    torch_groups: tuple[tuple[str, ...], ...]
    whole: Batch
    batches: tuple[Batch, ...]
    rule: str | None
    forward: Forward
    problem: Problem
    solved: SolveResult
    recompute: tuple[str, ...] = ()
    single: Recomputed | None = None
    dtype: str = "float32"
    options: tuple[ReplicaOption, ...] = ()
    sharding: str = "ddp"
    layers: str = "eval"  # how the step runs the layers (``train.layers``)

    @property
    def replicas(self) -> int:
        return len(self.groups)

    @property
    def microbatches(self) -> int:
        return len(self.batches)

    def record(self, optimizer: str, schedule: Schedule) -> TrainingRecord:
        """The plan's ``training`` record (its check still to run) for the plan's
        ``schedule``: the order it runs, which is GPipe's where 1F1B was asked of devices that
        feed each other both ways (``simulate.schedules.schedule_run``)."""
        several = self.replicas > 1
        return TrainingRecord(
            optimizer=optimizer, dtype=self.dtype, layers_mode=self.layers,
            microbatches=self.microbatches,
            schedule=schedule_run(self.problem.graph, schedule.placement.device_of,
                                  self.problem.pipeline_schedule or "gpipe"),
            replicas=self.replicas, recompute=self.recompute,
            microbatch_loss=self.rule if self.microbatches > 1 else None,
            replica_groups=self.groups if several else None,
            replica_torch_devices=self.torch_groups if several else None,
            replica_options=self.options, sharding=self.sharding if several else None,
            check=TrainingCheck(status="skipped"))


def plan_step(model: torch.nn.Module, whole: Batch, cluster: Cluster, options: SolveOptions,
               how: Tracing, *, optimizer: str, microbatches: int, schedule: str,
               replicas: int | str, recompute: str, dtype: str = "float32",
               fsdp: str = "auto", layers: str = "eval", beat_s: float | None = None) -> Step:
    """The training step of ``model`` (a ``train.LossModel``) on the ``whole`` batch: for each
    replica count R (``replicas``, or ``auto``: every R that divides the devices into alike
    groups, ``train.dataparallel``), one replica's shard cut into micro-batches, one micro-batch
    traced on ``cluster``, the replica's step solved on its devices with the gradients'
    all-reduce (``_solve_step``, the time limit shared among the R) and, as ``fsdp`` says,
    sharded under FSDP2 (``replicas.replica_variants``; ``auto``: where that R's DDP step does
    not fit); the fastest step that fits kept, and why said. Each candidate's notes are
    collected apart, and only the kept one's are passed on. ``layers``: how the model runs its
    layers (``train.layers``; a step in ``train()`` recomputes nothing that updates statistics,
    nor, but in a sharded replica's checkpoints, that drops out: ``_recomputable``). ``beat_s``:
    the step of the tensor-parallel mesh weighed before: a count whose lower bound is no less is
    not solved (``Outpaced``, raised where every count is so or does not fit)."""
    counted = replica_counts(model, whole, cluster, replicas, microbatches, dtype)
    variants = replica_variants(counted, fsdp, microbatches)
    found: dict[tuple[int, str], tuple[Step, list[str]]] = {}
    failure: InfeasibleError | None = None
    outpaced: dict[tuple[int, str], Outpaced] = {}
    counts = []
    for r, groups, sharding in variants:
        unsharded = found.get((r, "ddp"))
        if sharding == "fsdp" and fsdp == "auto" and unsharded is not None and (
                unsharded[0].solved.schedule.feasible):
            continue  # auto shards for memory: R's replicas fit whole
        counts.append((r, groups, sharding))
        share = replace(options, time_limit_s=time_share(
            options.time_limit_s, variants, sharding, fsdp=fsdp, found=found))
        with collecting() as mine:
            try:
                found[r, sharding] = _replica_step(
                    model, whole, r, groups, cluster, share, how, optimizer=optimizer,
                    microbatches=microbatches, schedule=schedule, recompute=recompute,
                    dtype=dtype, sharding=sharding, layers=layers, beat_s=beat_s), mine
            except Outpaced as exc:
                outpaced[r, sharding] = exc
            except InfeasibleError as exc:
                if len(variants) == 1:
                    raise
                failure = failure or exc  # R=1's, over every device, says the most
    table = tuple(
        ReplicaOption(replicas=r, devices_per_replica=len(groups[0]),
                      step_s=found[r, sharding][0].solved.schedule.makespan_s
                      if (r, sharding) in found else None,
                      fits=(r, sharding) in found
                      and found[r, sharding][0].solved.schedule.feasible, sharding=sharding,
                      bound_s=outpaced[r, sharding].bound_s if (r, sharding) in outpaced else None)
        for r, groups, sharding in counts)
    if not found and outpaced:  # fitting none is not shown: say each count's bound
        first = next(iter(outpaced.values()))
        raise Outpaced(f"no placement can beat {first.beat_s:.6g} s: " + ", ".join(
            f"R={r}{' FSDP' if h == 'fsdp' else ''}'s step takes at least {e.bound_s:.6g} s"
            for (r, h), e in outpaced.items()) + " (lower bounds); none was solved",
            bound_s=min(e.bound_s for e in outpaced.values()), beat_s=first.beat_s,
            options=table)
    if not found:
        failure.options = table  # type: ignore[union-attr]
        raise failure  # type: ignore[misc]
    kept = min(found, key=lambda k: (not found[k][0].solved.schedule.feasible,
                                     found[k][0].solved.schedule.makespan_s))
    step, mine = found[kept]
    best = kept[0]  # the replica count
    note_all(mine)
    frozen = sum(n.param_bytes - n.trainable_bytes for n in step.forward.problem.graph.nodes)
    if frozen:
        note(f"{frozen} bytes of parameters and buffers are not trained (frozen parameters, "
             "or buffers): no gradient or optimizer state is planned for them")
    single = (found[1, "ddp"][0].solved.baselines.get("single-device")
              if (1, "ddp") in found else None)
    if best > 1 and single is not None and single.feasible:
        note(f"{best} data-parallel replicas: the plan's graph is one replica's, on "
             f"1/{best} of the batch with its all-reduce, and its makespan is the "
             "step's (the replicas run at once); its speed-up is over one device on "
             f"1/{best} of the batch. One device on the whole batch takes "
             f"{single.makespan_s * 1e3:.3f} ms, "
             f"{single.makespan_s / step.solved.schedule.makespan_s:.2f}x the step")
    if len(counts) > 1:
        note("data-parallel replicas: " + ", ".join(
            f"R={o.replicas}{' FSDP' if o.sharding == 'fsdp' else ''} (up to "
            f"{o.devices_per_replica} device{'s' if o.devices_per_replica > 1 else ''} each) "
            + (f"{o.step_s * 1e3:.3f} ms" if o.step_s is not None else "fits no device"
               if o.bound_s is None else f"at least {o.bound_s * 1e3:.3f} ms, not solved")
            + ("" if o.fits or o.step_s is None else " (over memory)")
            for o in table) + f" per step; R={best}"
            + (" FSDP" if step.sharding == "fsdp" else "") + " kept, the fastest step that fits")
    if step.sharding == "fsdp":
        note(f"{best} sharded data-parallel replicas (FSDP2 fully_shard per block, ZeRO-3): "
             f"each holds 1/{best} of the parameters, gradients and optimizer state between "
             "uses, a block's parameters gathered whole while it runs; the collectives are "
             "charged on the critical path (train.sharded)")
    note("accelerate's device maps are inference maps: not among a training plan's baselines")
    return replace(step, options=table)


def _replica_step(model: torch.nn.Module, whole: Batch, r: int, groups: list[tuple[str, ...]],
                  cluster: Cluster, share: SolveOptions, how: Tracing, *, optimizer: str,
                  microbatches: int, schedule: str, recompute: str, dtype: str,
                  sharding: str = "ddp", layers: str = "eval", beat_s: float | None = None
                  ) -> Step:
    """The step of ``r`` replicas on ``groups``: replica 0's shard cut into micro-batches, one
    traced, its step solved on ``groups[0]`` within ``share`` (``InfeasibleError`` where none
    fits; ``Outpaced`` where none can beat ``beat_s``)."""
    shards = r if sharding == "fsdp" else 1
    weights, trained = model_bytes(model)
    held = step_state_bytes(weights, trained, optimizer, dtype)
    room = sum(cluster.device(d).memory_bytes for d in groups[0])
    if held // shards > room:  # no step fits: not traced (80 layers of a 70B Llama: 30 s)
        raise InfeasibleError(
            f"no placement fits: a replica of R={r} holds {room} bytes on its "
            f"{len(groups[0])} device(s), {held // shards - room} bytes short of its "
            "parameters, buffers, gradients and optimizer state before any activation. "
            + state_memory(weights, trained, optimizer, room, microbatches, recompute, dtype,
                           shards))
    shard = split_batch(*whole, r, what=REPLICA_SHARDS)[0]
    batches, rule = split_batch(*shard, microbatches), None
    if microbatches > 1:
        rule = loss_rule(model, *shard, batches)
        note(f"{microbatches} micro-batches of {batch_size(batches[0], parts=1)}: the batch's "
             f"loss is the {rule} of theirs")
    forward = traced_problem(model, *batches[0], cluster, how)
    if microbatches > 1 or sharding == "fsdp":
        recompute = _recomputable(forward.traced.module, recompute, layers,
                                  replays_rng=sharding == "fsdp")
    full = forward.problem.cluster
    if r > 1:
        forward = replace(forward, problem=restrict(forward.problem, groups[0]))
    factors, measured = backward_factors(forward.profiled, model, *batches[0], full)
    updates = update_rates(forward.profiled, model, *batches[0], full, optimizer=optimizer)
    averaging = (replica_averaging(forward.profiled, model, full, groups, how,
                                    microbatches=microbatches, sharding=sharding,
                                    optimizer=optimizer, forward=forward.problem)
                 if r > 1 else None)
    stage("solve")
    got = _solve_step(with_measured_forward(forward.problem, measured), share,
                      optimizer=optimizer, factors=factors, updates=updates,
                      microbatches=microbatches, schedule=schedule, recompute=recompute,
                      dtype=dtype, replicated=(full, groups), averaging_s=averaging,
                      sharding=sharding, beat_s=beat_s)
    torch_groups = tuple(tuple(full.device(d).torch_device for d in g) for g in groups)
    return Step(groups=tuple(groups), torch_groups=torch_groups, whole=whole,
                batches=tuple(batches), rule=rule, forward=forward, problem=got.problem,
                solved=got.result, recompute=got.recompute, single=got.single, dtype=dtype,
                sharding=sharding, layers=layers)


def _recomputable(module: torch.nn.Module, recompute: str, layers: str, *,
                  replays_rng: bool = False) -> str:
    """``recompute`` as a step in ``layers`` can take it: a recomputed forward in ``train()``
    would draw other dropout masks than the forward whose outputs it differentiates (unless it
    ``replays_rng``: ``torch.utils.checkpoint``, a sharded replica's, restores the generator's
    state), and update batch norm's running statistics twice, so a graph that drops out or
    updates statistics (``train.layers``) recomputes nothing (``auto``, with a note) or is
    refused (``all``)."""
    if layers != "train" or recompute == "off" or not (
            (dropout_ops(module) and not replays_rng) or updates_statistics(module)):
        return recompute
    why = ("recomputation in train(): the forward run again would update batch norm's "
           "running statistics a second time" if replays_rng else
           "recomputation in train(): the forward run again would draw other dropout masks "
           "and update batch norm's running statistics a second time")
    if recompute == "all":
        raise ConfigError(f"{{training.recompute=all}} is not built for {why}: set "
                          "{training.layers=eval}, or {training.recompute=off}")
    note(f"no {why}: the step is planned without recomputation (--layers eval allows it)",
         once=True)
    return "off"


def _solve_step(forward: Problem, options: SolveOptions, *, optimizer: str,
                factors: Mapping[str, float], updates: Mapping[str, float],
                microbatches: int, schedule: str, recompute: str, dtype: str,
                replicated: tuple[Cluster, Sequence[Sequence[str]]],
                averaging_s: float | None = None, sharding: str = "ddp",
                beat_s: float | None = None) -> Solved:
    """The training step's problem, its solve and the devices that recompute: with
    micro-batches under each schedule ``schedule`` names (``auto``: GPipe and 1F1B, each with
    half the time), the faster step that fits kept; with the updates measured (``updates``,
    seconds per trainable byte per device: ``train.updates.with_measured_updates``) and the
    all-reduce of the ``replicated`` groups of the whole cluster
    (``train.dataparallel.with_allreduce``; ``averaging_s``: measured,
    ``measured.replica_averaging``), or with ``sharding="fsdp"`` their FSDP2 collectives and
    shards (``train.sharded``), the updates after the whole backward where every device is a
    CPU's (``train.updates.after_backward``); with recomputation where ``recompute`` asks for
    it (``_solve_recomputing``). A step that fits nowhere says what it holds beyond inference.
    One whose lower bound is no less than ``beat_s`` is not solved, nor with recomputation
    (the same work and more): ``Outpaced``."""
    names = SCHEDULES if schedule == "auto" and microbatches > 1 else (
        (schedule if schedule != "auto" else "gpipe"),)
    share = replace(options, time_limit_s=options.time_limit_s / len(names))
    found: dict[str, Solved] = {}
    failure: InfeasibleError | None = None
    beaten: Outpaced | None = None
    for name in names:
        step = step_problem(forward, optimizer, backward_factor=factors,
                            microbatches=microbatches, schedule=name, dtype=dtype)
        problem = _replicated(step, updates, replicated, averaging_s, sharding=sharding,
                              microbatches=microbatches)
        solved = None
        if recompute != "all" or microbatches == 1:
            try:
                solved = solve(problem, options=share, beat_s=beat_s)
                found[name] = Solved(problem, solved)
            except Outpaced as exc:
                beaten = exc
                continue
            except InfeasibleError as exc:
                failure = exc
        if sharding == "fsdp" and recompute == "auto" and (
                solved is None or not solved.schedule.feasible):
            beaten = _fsdp_recomputing(
                _replicated(step, updates, replicated, averaging_s, sharding=sharding,
                            microbatches=microbatches, units=True),
                share, beat_s, into=found, name=name) or beaten
        if microbatches > 1 and (recompute == "all" or recompute == "auto" and (
                solved is None or not solved.schedule.feasible)):
            again = _solve_recomputing(problem, solved, share, every=recompute == "all")
            if again is not None:
                found[name] = again
            elif recompute == "all":
                failure = InfeasibleError("no placement within memory was found with "
                                          "recomputation on every device")
    if not found and beaten is not None:
        raise beaten
    if not found:
        capacity = sum(d.memory_bytes - d.reserved_bytes for d in forward.cluster.devices)
        raise InfeasibleError(
            f"{failure} "
            + training_memory(forward.graph, optimizer, capacity, microbatches, recompute,
                              dtype, sharded=len(replicated[1]) if sharding == "fsdp" else 1)
        ) from failure
    best = min(found, key=lambda n: (not found[n].result.schedule.feasible,
                                      found[n].result.schedule.makespan_s))
    if found[best].recompute and sharding != "fsdp":  # a sharded replica's: said apart
        note(f"recomputation on {', '.join(found[best].recompute)}: each micro-batch's "
             "forward there keeps only its inputs and runs again before its backward")
    if len(names) > 1:
        note("schedule: " + ", ".join(
            f"{n} {found[n].result.schedule.makespan_s * 1e3:.3f} ms"
            + ("" if found[n].result.schedule.feasible else " (over memory)")
            if n in found else f"{n} fits no device" for n in names)
            + f" per step; {best} kept")
    return found[best]


def _replicated(step: Problem, updates: Mapping[str, float],
                replicated: tuple[Cluster, Sequence[Sequence[str]]], averaging_s: float | None,
                *, sharding: str, microbatches: int, units: bool = False) -> Problem:
    """A replica's ``step`` with its updates measured (``updates``), each FSDP2 unit
    checkpointed with ``units`` (``train.recompute.recompute_units``), and the collectives of
    the ``replicated`` groups: FSDP2's (``sharding="fsdp"``) or the gradients' all-reduce."""
    problem = with_measured_updates(step, updates)
    if units:
        problem = recompute_units(problem)
    problem = (with_fsdp(problem, *replicated, measured_s=averaging_s)
               if sharding == "fsdp" else
               with_allreduce(problem, *replicated, measured_s=averaging_s))
    if microbatches == 1 and all(d.torch_device.startswith("cpu")
                                 for d in problem.cluster.devices):
        # The emitted step updates on the calling thread after the whole backward. With
        # micro-batches it does too, but there the ordering leads the solver's heuristics
        # astray (LeNet, M=2, 9 MB a device: no split found, where one device needs 10.4)
        problem = after_backward(problem)
    return problem


def _fsdp_recomputing(problem: Problem, options: SolveOptions, beat_s: float | None, *,
                      into: dict[str, Solved], name: str) -> Outpaced | None:
    """A sharded replica's step (one device, one batch; ``_replicated``) with each FSDP2 unit
    checkpointed, as torchtitan's per-block activation checkpointing runs it and the mesh's
    ranks are priced, solved and put ``into`` the found steps as ``name``'s where it fits;
    the ``Outpaced`` (its bound) where it cannot beat ``beat_s``."""
    try:
        solved = solve(problem, options=options, beat_s=beat_s)
    except Outpaced as beaten:
        return beaten
    except InfeasibleError:
        return None
    if solved.schedule.feasible:
        note("each FSDP2 unit of the sharded replica is checkpointed (torch.utils.checkpoint): "
             "its forward runs again before its backward, which the replica needs to fit")
        into[name] = Solved(problem, solved, recompute=tuple(problem.cluster.names))
    return None


def _solve_recomputing(problem: Problem, plain: SolveResult | None, options: SolveOptions, *,
                       every: bool) -> Solved | None:
    """The step ``problem`` placed with recomputation (``train.recompute``) on the devices
    that overflow without it (``every``: on every device it uses): the solver's placement and
    every baseline's, of ``plain`` (the solve without recomputation, ``None`` where nothing
    was found) and of a solve of ``recompute_all(problem)``, each simulated so; the fastest
    that fits is the plan, and each baseline its best (the single device's kept whole, for
    ``--min-gain``). The graph depends on the placement (an input from the same device is
    recomputed, one from another kept), so CP-SAT's bound is of another graph: the bound is
    the analytic one of ``problem`` (recomputing only adds work). ``None`` where nothing
    fits."""
    try:
        relaxed: SolveResult | None = solve(recompute_all(problem), options=options)
    except InfeasibleError:
        relaxed = None
    scored: dict[str, Recomputed] = {}

    def key(r: Recomputed) -> tuple[bool, float]:
        return not r.schedule.feasible, r.schedule.objective_s(options.objective)

    for result in (r for r in (plain, relaxed) if r is not None):
        for name, schedule in ((PLAN, result.schedule), *result.baselines.items()):
            if schedule is not None:
                candidate = with_recompute_where_needed(problem, schedule.placement,
                                                        every=every)
                if name not in scored or key(candidate) < key(scored[name]):
                    scored[name] = candidate
    if not scored or not (best := min(scored.values(), key=key)).schedule.feasible:
        return None
    base = relaxed if relaxed is not None else plain
    assert base is not None
    note("with recomputation the plan is the best of the solver's placements and the "
         "baselines', each simulated with recomputation on the devices it overflows; the "
         "lower bound is the analytic one (CP-SAT's is of another graph)", once=True)
    status = "INTERRUPTED" if "INTERRUPTED" in (
        r.solver.status for r in (plain, relaxed) if r is not None) else "FEASIBLE"
    result = replace(
        base, schedule=best.schedule, lower_bound_s=lower_bound_s(problem, options.objective),
        baselines={n: r.schedule for n, r in scored.items() if n != PLAN},
        solver=replace(base.solver, status=status, objective_s=best.schedule.objective_s(
            options.objective)), notes=())
    return Solved(best.problem, result, best.devices, scored.get("single-device"))


def check_step(planned: Plan, emitted: Any, model: torch.nn.Module, step: Step,
               check_memory: bool | None) -> Plan:
    """Train ``emitted`` (a training plan's model) beside the original ``model`` on the whole
    batch: its micro-batches in the plan's order, its replicas as processes (under
    DistributedDataParallel, or each running its micro-batches and then averaging the
    gradients, ``emit.distributed.ddp``); then measure its step's memory (``_step_memory``). The
    plan with ``training.check`` filled in."""
    training = planned.training
    assert training is not None  # a training plan's
    count = step.microbatches
    args, kwargs = step.whole
    inputs = {k: v for k, v in kwargs.items() if k != "targets"}
    optimizer = training.optimizer
    if step.replicas > 1:
        check = verify_replicas(emitted, model, args, inputs, kwargs["targets"],
                                optimizer=optimizer, replicas=step.replicas,
                                groups=step.torch_groups,
                                microbatches=microbatching(training, emitted,
                                                           planned.problem, planned.schedule),
                                sharding=step.sharding,
                                recompute=step.sharding == "fsdp" and bool(step.recompute))
        how = (f"steps of {step.replicas} data-parallel replicas (one process each, "
               + (f"{count} micro-batches ({training.schedule}) each, the gradients "
                  "all-reduced after them) " if count > 1 else f"{SHARDINGS[step.sharding]}) "))
    else:
        # micro-batches: segment by segment, in the plan's order
        run = stepper(emitted, planned.problem, planned.schedule, step.batches,
                      step.rule, recompute=step.recompute) if count > 1 else None
        check = train_emitted(emitted, model, args, inputs, kwargs["targets"],
                              optimizer=optimizer, emitted_step=run, dtype=step.dtype,
                              microbatches=count, rule=step.rule)
        how = (f"steps of {count} micro-batches ({training.schedule}) "
               if count > 1 else "steps ")
    precision = f"{step.dtype} mixed-precision " if step.dtype != "float32" else ""
    off = " with dropout's probabilities at zero" if step.layers == "train" else ""
    note(f"training check passed: {check['steps']} {precision}{optimizer} {how}of the "
         f"emitted model{off} give the original's losses "
         f"({', '.join(f'{v:.6g}' for v in check['losses'])}), gradients and parameters"
         + (f", and its {check['buffers_compared']} buffers (running statistics)"
            if check.get("buffers_compared") else ""))
    if check.get("dropout_ops"):
        note(f"dropout is active in the emitted step: its {check['dropout_ops']} dropout(s) on, "
             f"the first step's loss is {check['loss_with_dropout']:.6g} (off: "
             f"{check['losses'][0]:.6g})")
    if step.sharding == "fsdp":
        # Rank 0's step, measured there by torch's FSDPMemTracker: this process would hold
        # what FSDP2 shards over the ranks.
        device = step.groups[0][0]
        measured = check.pop("measured_peak_bytes")
        peak = check_peak({device: measured},
                          {device: comparable_peak_bytes(planned.problem,
                                                         planned.schedule)[device]},
                          method="FSDPMemTracker", enforce=ENFORCE_PEAK_DEFAULT
                          if check_memory is None else check_memory)
    else:
        peak = _step_memory(emitted, planned, step, check_memory, optimizer=optimizer)
    note(f"training step memory: {peak.detail}")
    measured = peak.method is not None  # else no peaks to keep
    checked = replace(TrainingCheck.from_dict(check), memory_status=peak.status,
                      peak_bytes=peak.peak_bytes if measured else None, peak_method=peak.method)
    return replace(planned, training=replace(training, check=checked))


def _step_memory(emitted: Any, planned: Plan, step: Step, check_memory: bool | None, *,
                 optimizer: str) -> PeakCheck:
    """The emitted step's peak per device, measured in this process on replica 0's batch
    (``emit.check_step_memory``) against the plan's: its micro-batches in the plan's order on
    this thread, or (one micro-batch) the loss's ``backward()``."""
    if step.microbatches > 1:
        order = action_order(emitted, planned.problem, planned.schedule, step.microbatches)

        def run(charge: Any) -> Any:
            return train_step(emitted, step.batches, order, step.rule or "mean",
                              threads=False, recompute=step.recompute, charge=charge)
    else:
        (args, kwargs), = step.batches

        def run(charge: Any) -> Any:
            loss = emitted(*args, **kwargs)
            loss.backward()
            return loss.detach()

    return check_step_memory(emitted, run, optimizer=optimizer,
                             dtype=step.dtype, problem=planned.problem,
                             schedule=planned.schedule, check_memory=check_memory)

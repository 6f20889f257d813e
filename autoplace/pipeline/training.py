"""The stages of a training plan, the same as an inference plan's with a step's graph: the model
and its loss traced, the step (replicas, micro-batches, schedules, recomputation) solved
(``TrainingStages.solve``, ``step.plan_step``), recorded with its ``training`` record, its
forward emitted (``emitting``) and then trained beside the original (``check``,
``step.check_step``)."""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from typing import Any

import torch

from autoplace.config import Config
from autoplace.formats.plan import Plan
from autoplace.formats.records import Coarsening, MinGain
from autoplace.ir import Cluster, Placement, Problem
from autoplace.pipeline.emitting import Emitting
from autoplace.pipeline.forward import Forward, Loaded, Tracing
from autoplace.pipeline.record import min_gain, plan_of
from autoplace.pipeline.step import Step, check_step, plan_step
from autoplace.progress.notes import note, note_all
from autoplace.simulate import simulate
from autoplace.simulate.schedules import microbatch_name
from autoplace.solve import SolveResult
from autoplace.solve.whatif import whatif_options, whatif_table
from autoplace.train import TRAINING_NOTES, loss_model, training_targets
from autoplace.train.layers import kept_state
from autoplace.train.sharded import fsdp_op_units

__all__ = ["Solved", "TrainingStages"]


@dataclass(frozen=True)
class Solved:
    """A training step solved: the ``step`` (with the single device's graph where
    ``--min-gain`` chose it) and its ``result`` after ``--min-gain`` (``gain``, its record)."""

    step: Step
    result: SolveResult
    gain: MinGain
    model: torch.nn.Module  # the model and its loss (``train.LossModel``)

    @property
    def forward(self) -> Forward:
        return self.step.forward

    @property
    def problem(self) -> Problem:
        return self.step.problem


@dataclass(frozen=True)
class TrainingStages:
    """A training plan's stages, for ``config``."""

    config: Config
    # ``step_model``'s, by the ``Loaded`` it was built for
    built: dict[int, tuple[Loaded, tuple[torch.nn.Module, Any]]] = field(
        default_factory=dict, compare=False, repr=False)

    def solve(self, loaded: Loaded, cluster: Cluster, *, beat_s: float | None = None
              ) -> Solved:
        """Stages trace, cost, fold and solve for the step of the model and its loss (which
        runs the model on its inputs: tracing need not run it again). The model's buffers
        and the random state are as they were afterwards (``train.layers.kept_state``): in
        ``train()`` every run while planning would update batch norm's statistics.
        ``beat_s``: the tensor-parallel mesh's step (``step.plan_step``)."""
        training, solving = self.config.training, self.config.solving
        note(TRAINING_NOTES[training.layers])
        fsdp = training.fsdp
        if self.config.parallel.dp is not None and fsdp != "auto":
            note(f"--fsdp {fsdp} with --dp: the tensor-parallel mesh's sharding over dp; the "
                 "plan's own replicas are weighed as with --fsdp auto")
            fsdp = "auto"
        with kept_state(loaded.model):
            model, whole = self.step_model(loaded)
            step = plan_step(model, whole, cluster, solving.options(),
                             Tracing.of(self.config, checked=True),
                             optimizer=training.optimizer, microbatches=training.microbatches,
                             schedule=training.schedule, replicas=training.replicas,
                             recompute=training.recompute, dtype=self.config.dtype,
                             fsdp=fsdp, layers=training.layers, beat_s=beat_s)
        result, gain = min_gain(step.solved, solving.min_gain)
        if result.schedule is not step.solved.schedule and step.single:
            # the single device chosen, with its own recomputing graph
            step = replace(step, problem=step.single.problem, recompute=step.single.devices)
        return Solved(step=step, result=result, gain=gain, model=model)

    def step_model(self, loaded: Loaded) -> tuple[torch.nn.Module, Any]:
        """The model and its loss (``train.LossModel``, which runs the model once to check
        the loss, in ``train.layers.kept_state``) and the whole batch it takes, the targets
        among its keywords; built once for ``loaded``, and the same again after."""
        built = self.built.get(id(loaded))
        if built is None or built[0] is not loaded:
            targets = training_targets(loaded.targets)
            with kept_state(loaded.model):
                model = loss_model(loaded.model, loaded.loss, loaded.args, loaded.kwargs,
                                   targets)
            built = self.built[id(loaded)] = (
                loaded, (model, (loaded.args, {**loaded.kwargs, "targets": targets})))
        return built[1]

    def record(self, solved: Solved) -> Plan:
        """The plan, with its ``training`` record (its check to come) and what-if table."""
        step, result, folded = solved.step, solved.result, solved.forward.folded
        solving = self.config.solving
        planned = plan_of(result, step.problem, name=self.config.name,
                          tracer=step.forward.traced.tracer,
                          coarsening=Coarsening(traced_ops=folded.traced_ops,
                                                plan_nodes=len(step.problem.graph.nodes),
                                                steps=(*folded.steps, *result.coarsening)),
                          budget_s=solving.time_limit_s)
        note_all(result.notes)
        scaling = None
        if solving.whatif and step.recompute:
            note("no what-if table: the recomputing step's graph is its placement's")
        elif solving.whatif and result.solver.status != "INTERRUPTED":
            scaling = whatif_table(step.problem, full=result,
                                   options=whatif_options(solving.options()))
        planned = replace(planned, training=step.record(self.config.training.optimizer,
                                                        result.schedule),
                          whatif=scaling, min_gain=solved.gain)
        if step.problem.pipeline_schedule != planned.training.schedule and (
                step.microbatches > 1):
            note("1F1B's order needs the devices to form stages, and these feed each other "
                 "both ways (a tied weight read at both ends, say): the step runs GPipe's order")
        return planned

    def emitting(self, planned: Plan, solved: Solved, loaded: Loaded) -> Emitting:
        """The step's forward nodes (of micro-batch 0, of replica 0) as placed: backward and
        optimizer steps follow them (autograd and ``torch.optim`` run where the forward ran
        and the weights live). Its outputs and memory are checked on one micro-batch of one
        replica's shard. Sharded replicas (FSDP2) cut each unit's ops into segments of their
        own (``train.sharded``)."""
        step = solved.step
        forward = step.forward.problem
        many = step.microbatches > 1
        device_of = {n.name: planned.schedule.placement.device_of[
            microbatch_name(n.name, 0) if many else n.name] for n in forward.graph.nodes}
        args, kwargs = step.batches[0]
        units = None
        if step.sharding == "fsdp":
            units = fsdp_op_units(forward.graph)
        return Emitting(problem=forward,
                        schedule=simulate(forward, Placement(device_of=device_of)),
                        device_of_op={op: device_of[n.name] for n in forward.graph.nodes
                                      for op in n.ops},
                        args=args, kwargs=kwargs, model=solved.model, units=units)

    def check(self, planned: Plan, emitted: Any, solved: Solved) -> Plan:
        """The emitted model trained beside the original on the whole batch: its
        micro-batches in the plan's order, its replicas as processes (``step.check_step``)."""
        emitted.example_inputs = solved.step.whole  # `autoplace run --train` cuts it again
        if not self.config.emit.verify:
            return planned
        return check_step(planned, emitted, solved.model, solved.step,
                          self.config.emit.check_memory)

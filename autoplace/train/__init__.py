"""Training: what one training step costs, as a graph the solver and the simulator already take.

``step_problem`` turns a forward problem (a traced model whose only output is its scalar loss,
costed and folded) into the step's: each forward node gets a backward node and, where it holds
parameters, an optimizer-step node, all three colocated (as in Tarnawski et al.'s training graphs,
NeurIPS 2020). ``graph.py`` has the rules and every formula's source; ``OPTIMIZERS``, the
optimizers and their state bytes. ``autoplace.plan(mode="training")`` traces ``LossModel`` (model
and loss, ``wrap.py``), plans the step and trains the emitted model beside the original
(``autoplace.emit.check.training``); ``autoplace run --train`` trains it. With micro-batches the
step holds a forward and backward per micro-batch, in GPipe's or 1F1B's order
(``simulate.schedules``); ``dataparallel.py`` weighs data-parallel replicas (micro-batched too) and
charges their all-reduce; ``recompute.py`` builds the step where devices recompute activations in
the backward; ``precision.py`` is ``--dtype``: the model cast to bfloat16 or float16 before
tracing, trained in mixed precision (float32 masters, ``emit.train.optimizer.MasterWeights``). Not
yet here: replicas of a mixed-precision step. Users: ``docs/training.md``.
"""

from autoplace.errors import AutoplaceError
from autoplace.simulate.schedules import SCHEDULES
from autoplace.train.graph import OPTIMIZERS, Optimizer, step_problem, training_memory
from autoplace.train.precision import DTYPES, check_dtype
from autoplace.train.recompute import RECOMPUTE_CHOICES
from autoplace.train.wrap import LossModel, loss_model, training_targets

__all__ = ["DTYPES", "MODES", "OPTIMIZERS", "TRAINING_NOTE", "LossModel", "Optimizer",
           "check_dtype", "check_training", "loss_model", "step_problem", "training_memory",
           "training_targets"]

MODES = ("inference", "training")
TRAINING_NOTE = ("training plan: one step of one batch, planned and checked with the layers "
                 "in eval() behaviour (dropout off, batch norm on running statistics), so "
                 "that the emitted model's losses can be compared with the original's")


def check_training(mode: str, optimizer: str, microbatches: int = 1,
                   schedule: str = "auto", replicas: int | str = "auto",
                   recompute: str = "auto") -> None:
    """A clear error for a mode, optimizer, micro-batch count, schedule, replica count or
    recomputation autoplace does not know, or micro-batches asked of an inference plan."""
    if mode not in MODES:
        raise AutoplaceError(f"--mode must be one of {', '.join(MODES)}, got {mode!r}")
    if optimizer not in OPTIMIZERS:
        raise AutoplaceError(f"--optimizer must be one of {', '.join(OPTIMIZERS)}, got "
                             f"{optimizer!r}")
    if not isinstance(microbatches, int) or microbatches < 1:
        raise AutoplaceError(f"--microbatches must be a whole number, 1 or more, got "
                             f"{microbatches!r}")
    if microbatches > 1 and mode != "training":
        raise AutoplaceError("--microbatches is for training plans: add --mode training")
    if replicas != "auto" and (isinstance(replicas, bool) or not isinstance(replicas, int)
                               or replicas < 1):
        raise AutoplaceError(f"--replicas must be auto or a whole number, 1 or more, got "
                             f"{replicas!r}")
    if mode != "training" and replicas != "auto":
        raise AutoplaceError("--replicas is for training plans: add --mode training")
    if schedule != "auto" and microbatches == 1:
        raise AutoplaceError(f"--schedule {schedule} orders micro-batches: add --microbatches "
                             "M (M > 1), or leave --schedule out")
    if recompute not in RECOMPUTE_CHOICES:
        raise AutoplaceError(f"--recompute must be one of {', '.join(RECOMPUTE_CHOICES)}, got "
                             f"{recompute!r}")
    if recompute != "auto" and mode != "training":
        raise AutoplaceError("--recompute is for training plans: add --mode training")
    if recompute == "all" and microbatches == 1:
        raise AutoplaceError("--recompute all recomputes each micro-batch's forward in its "
                             "backward, which saves memory only with several in flight: add "
                             "--microbatches M (M > 1)")
    if schedule not in ("auto", *SCHEDULES):
        raise AutoplaceError(f"--schedule must be one of auto, {', '.join(SCHEDULES)}, got "
                             f"{schedule!r}")

"""Training: what one training step costs, as a graph the solver and the simulator already take.

``step_problem`` turns a forward problem (a traced model whose only output is its scalar loss,
costed and folded) into the step's: each forward node gets a backward node and, where it holds
parameters, an optimizer-step node, all three colocated (as in Tarnawski et al.'s training graphs,
NeurIPS 2020). ``graph.py`` has the rules and every formula's source; ``OPTIMIZERS``, the optimizers
and their state bytes. A training plan traces ``LossModel`` (model and loss, ``wrap.py``), plans the
step and trains the emitted model beside the original (``emit.check.training``); ``autoplace run
--train`` trains it. With micro-batches the step holds a forward and backward per micro-batch, in
GPipe's or 1F1B's order (``simulate.schedules``); ``dataparallel.py`` weighs data-parallel replicas
(micro-batched too) and charges their all-reduce; ``recompute.py`` builds the step where devices
recompute activations in the backward; ``precision.py`` is ``--dtype``: the model cast to bfloat16
or float16, trained in mixed precision (float32 masters, ``emit.train.optimizer.MasterWeights``);
``layers.py``, ``--layers``: ``train()`` or ``eval()``. Not yet here: replicas of mixed precision.
Users: ``docs/training.md``.
"""

from autoplace.train.graph import OPTIMIZERS, Optimizer, step_problem, training_memory
from autoplace.train.layers import TRAINING_NOTES
from autoplace.train.precision import check_dtype
from autoplace.train.wrap import LossModel, loss_model, training_targets

__all__ = ["OPTIMIZERS", "TRAINING_NOTES", "LossModel", "Optimizer",
           "check_dtype", "loss_model", "step_problem", "training_memory",
           "training_targets"]

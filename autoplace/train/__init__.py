"""Training: what one training step of a model costs, as a graph the solver and the simulator
already take.

``step_problem`` turns a forward problem (a traced model whose only output is its scalar loss,
costed and folded) into the step's problem: each forward node gets a backward node and, where it
holds parameters, an optimizer-step node, all three colocated (as in the training graphs of
Tarnawski et al., NeurIPS 2020); see ``graph.py`` for the rules and the sources of every
formula. The optimizers and their state bytes are in ``OPTIMIZERS``.

Not yet here (issue 14): micro-batches and their schedules (GPipe, 1F1B), data-parallel
replicas, measured backward times, the planner's ``--mode training`` and the emitted training
step.
"""

from autoplace.train.graph import OPTIMIZERS, Optimizer, step_problem

__all__ = ["OPTIMIZERS", "Optimizer", "step_problem"]

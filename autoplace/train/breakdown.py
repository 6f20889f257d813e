"""Train: what a planned training step is made of, read back from its graph and schedule.

``phase_of`` is the one parser of a step graph's node names (``graph.py`` makes them): a
forward node ``f``, its backward ``f@backward`` and its optimizer step ``f@step``; with M > 1
micro-batches the forward and backward nodes of micro-batch k are ``f#k`` and
``f@backward#k``, and there is still one ``f@step`` per parameter node. ``memory_breakdown``
splits each device's peak into the runtime's reserve, parameters, gradients, optimizer state
and activations, parts that add up to the simulator's peak exactly.
"""

from __future__ import annotations

import re
from collections import defaultdict

from autoplace.ir import Problem, Schedule
from autoplace.train.graph import BACKWARD, STEP

__all__ = ["BREAKDOWN_PARTS", "PHASES", "memory_breakdown", "phase_of"]

FORWARD = "forward"
PHASES = (FORWARD, "backward", "step")
MICROBATCH = "#"
# The suffixes are read from the right: a traced node's name is a Python identifier (torch.fx
# and torch.export make them so), but a graph file may name a node anything, and a '#' or '@'
# inside a name is kept in the forward name unless the name ends in a suffix.
_NAME = re.compile(rf"(?P<forward>.+?)(?P<phase>{re.escape(BACKWARD)}|{re.escape(STEP)})?"
                   rf"(?:{MICROBATCH}(?P<microbatch>\d+))?", re.DOTALL)
_PHASE = {None: FORWARD, BACKWARD: "backward", STEP: "step"}

# The parts of a device's peak, bottom to top as the report stacks them.
BREAKDOWN_PARTS = ("reserved_bytes", "parameter_bytes", "gradient_bytes",
                   "optimizer_state_bytes", "activation_bytes")


def phase_of(node_name: str) -> tuple[str, str, int | None]:
    """``(forward_name, phase, microbatch)`` of a step graph's node: ``phase`` is one of
    ``PHASES``; ``microbatch`` is k for ``#k``, 0 for a forward or backward node without one
    (M = 1), ``None`` for an optimizer step (it follows every micro-batch's backward).

    >>> phase_of("linear_1@backward#3")
    ('linear_1', 'backward', 3)
    >>> phase_of("linear_1@step")
    ('linear_1', 'step', None)
    """
    match = _NAME.fullmatch(node_name)
    if match is None:  # only the empty name
        return node_name, FORWARD, 0
    phase = _PHASE[match["phase"]]
    k = match["microbatch"]
    microbatch = int(k) if k is not None else (None if phase == "step" else 0)
    return match["forward"], phase, microbatch


def memory_breakdown(problem: Problem, schedule: Schedule) -> dict[str, dict[str, int]]:
    """Each device's peak in a training step, split into the parts of ``BREAKDOWN_PARTS``:

    * ``reserved_bytes``: the runtime's reserve (``Device.reserved_bytes``);
    * ``parameter_bytes``: parameters and buffers, the ``param_bytes`` of the forward nodes;
    * ``gradient_bytes``: the ``.grad`` of the trained parameters, held from the backward to
      the optimizer's step: the ``trainable_bytes`` of the forward nodes of each ``f@step``;
    * ``optimizer_state_bytes``: the rest of each ``f@step``'s ``param_bytes`` (``graph.py``
      makes it the gradients plus the optimizer's state);
    * ``activation_bytes``: the peak above the resident bytes (``schedule.peak_bytes -
      schedule.resident_bytes``): the values alive at the peak, what autograd saves for the
      backward among them, and the running node's workspace.

    The simulator's resident bytes are the reserve plus every node's ``param_bytes``, so the
    parts add up to ``schedule.peak_bytes[device]``."""
    graph, device_of = problem.graph, schedule.placement.device_of
    trained: dict[str, int] = defaultdict(int)  # forward name -> bytes its step updates
    for node in graph.nodes:
        forward, phase, _ = phase_of(node.name)
        if phase == FORWARD:
            trained[forward] += node.trainable_bytes
    out = {d.name: dict.fromkeys(BREAKDOWN_PARTS, 0) for d in problem.cluster.devices}
    for d in problem.cluster.devices:
        out[d.name]["reserved_bytes"] = d.reserved_bytes
        out[d.name]["activation_bytes"] = (schedule.peak_bytes[d.name]
                                           - schedule.resident_bytes[d.name])
    for node in graph.nodes:
        row = out[device_of[node.name]]
        forward, phase, _ = phase_of(node.name)
        if phase == "step":
            row["gradient_bytes"] += trained[forward]
            row["optimizer_state_bytes"] += node.param_bytes - trained[forward]
        else:
            row["parameter_bytes"] += node.param_bytes
    return out

"""Train: what a planned training step's memory is made of, read back from its graph and
schedule.

``memory_breakdown`` splits each device's peak into the runtime's reserve, parameters,
gradients, optimizer state and activations, parts that add up to the simulator's peak exactly.
It reads each node's phase from its name with ``simulate.schedules.phase_of``, the one parser
of the names ``graph.py`` gives a step's nodes: ``f``, ``f@backward`` and ``f@step``, and with
M > 1 micro-batches ``f#k`` and ``f@backward#k`` (parameters counted on ``f#0`` only).
"""

from __future__ import annotations

from autoplace.ir import Problem, Schedule
from autoplace.simulate.schedules import phase_of
from autoplace.train.graph import trained_bytes

__all__ = ["BREAKDOWN_PARTS", "memory_breakdown"]

# The parts of a device's peak, bottom to top as the report stacks them.
BREAKDOWN_PARTS = ("reserved_bytes", "parameter_bytes", "gradient_bytes",
                   "optimizer_state_bytes", "activation_bytes")


def memory_breakdown(problem: Problem, schedule: Schedule) -> dict[str, dict[str, int]]:
    """Each device's peak in a training step, split into the parts of ``BREAKDOWN_PARTS``:

    * ``reserved_bytes``: the runtime's reserve (``Device.reserved_bytes``);
    * ``parameter_bytes``: parameters and buffers, the ``param_bytes`` of the forward nodes
      (backward nodes hold none);
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
    trained = trained_bytes(graph)  # forward name -> bytes its step updates
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

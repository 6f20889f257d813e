"""Cost every node on every device with the analytic roofline of ``cost_models``.

A node's time on a device is ``max(flops / peak, bytes / bandwidth) + launches * overhead``
(``cost_models.roofline.op_time_s``), using the peak for the node's dtype. Input placeholders cost
nothing. Transfer times are not stored here: they follow from edge bytes and the cluster's links.
"""

from __future__ import annotations

from autoplace.ir import Cluster, Costs, OpGraph
from cost_models import get_device_type
from cost_models.roofline import op_time_s

__all__ = ["analytic_costs"]


def analytic_costs(graph: OpGraph, cluster: Cluster) -> Costs:
    """Roofline time of every node of ``graph`` on every device of ``cluster``."""
    device_types = {d.name: get_device_type(d.type) for d in cluster.devices}
    compute_s: dict[str, dict[str, float]] = {}
    for node in graph.nodes:
        if node.is_input:
            compute_s[node.name] = {name: 0.0 for name in device_types}
            continue
        compute_s[node.name] = {
            name: op_time_s(flops=node.flops, bytes_accessed=node.bytes_accessed,
                            dtype=node.dtype, device=device_type, launches=node.launches)
            for name, device_type in device_types.items()
        }
    return Costs(compute_s=compute_s,
                 source={node.name: "analytic" for node in graph.nodes})

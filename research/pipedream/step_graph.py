"""The training step of a profiled model (PipeDream's per-layer profiles) as a ``Problem``.

``profile_step_problem`` turns the layers PipeDream's optimizer partitions
(``partitioner.training_layers``) into one training step's graph, named and grouped as
``autoplace.train.graph.step_problem`` does a traced model's: a layer ``f`` is the node ``f``
(forward time; weights as ``param_bytes`` and, all trained, ``trainable_bytes``; its activation as
``output_bytes``) and ``f@backward`` (backward time; outputs its inputs' gradients), colocated. An
edge ``f -> g`` carries the activation forward, ``g@backward -> f@backward`` its gradient back (as
many bytes), ``f -> f@backward`` what autograd saves (colocated, so free; saved inputs ride on
``f``'s own copies). ``step_problem`` itself does not apply: it prices a backward as a factor of
its forward and adds optimizer-step nodes at catalog rooflines, where a profile measured every
backward and PipeDream's cost model has no optimizer step. The devices are a ``TrainingCluster``'s:
identical ``d0``, ``d1``, ... with no memory limit (PipeDream's optimizer checks none by default;
the profiles say nothing of activations kept for backward), every pair joined by its network.
"""

from __future__ import annotations

from autoplace.ir import Cluster, Costs, Device, Edge, Link, OpGraph, OpNode, Problem
from autoplace.train.graph import BACKWARD
from research.pipedream.partitioner import TrainingCluster, training_layers
from research.pipedream.profiles import Profile

__all__ = ["PROFILED_DEVICE_TYPE", "UNLIMITED_BYTES", "profile_step_problem", "training_devices"]

PROFILED_DEVICE_TYPE = "profiled"  # the device the profile was taken on, whatever it was
# "No memory limit" still needs a positive integer capacity; 1 PiB keeps sums of capacities
# and bytes far inside int64, which CP-SAT needs (as benchmarks/benchdata.py's).
UNLIMITED_BYTES = 1 << 50


def profile_step_problem(profile: Profile, cluster: TrainingCluster) -> Problem:
    """One training step of ``profile`` on ``cluster``'s devices (see the module docstring)."""
    layers, _ = training_layers(profile)
    kept = {layer.name for layer in layers}
    flows = [(src, dst) for src, dst in profile.edges if src in kept and dst in kept]
    activation = {layer.name: layer.activation_bytes for layer in layers}
    gradients = dict.fromkeys(kept, 0)
    for src, dst in flows:
        gradients[dst] += activation[src]
    forward = [OpNode(name=layer.name, module=layer.description,
                      output_bytes=layer.activation_bytes, param_bytes=layer.parameter_bytes,
                      trainable_bytes=layer.parameter_bytes) for layer in layers]
    backward = [OpNode(name=layer.name + BACKWARD, module=layer.description,
                       output_bytes=gradients[layer.name]) for layer in reversed(layers)]
    edges = [Edge(src=src, dst=dst, bytes=activation[src]) for src, dst in flows]
    edges += [Edge(src=layer.name, dst=layer.name + BACKWARD, bytes=layer.activation_bytes)
              for layer in layers]
    edges += [Edge(src=dst + BACKWARD, dst=src + BACKWARD, bytes=activation[src])
              for src, dst in flows]
    readers = {src for src, _ in flows}
    graph = OpGraph(nodes=(*forward, *backward), edges=tuple(edges),
                    colocate=tuple((layer.name, layer.name + BACKWARD) for layer in layers),
                    outputs=tuple(layer.name for layer in layers if layer.name not in readers),
                    name=profile.name)
    devices = training_devices(cluster)
    times = {**{layer.name: layer.forward_s for layer in layers},
             **{layer.name + BACKWARD: layer.backward_s for layer in layers}}
    costs = Costs(compute_s={node: dict.fromkeys(devices.names, t) for node, t in times.items()},
                  source=dict.fromkeys(times, "profiled"))
    return Problem(graph=graph, cluster=devices, costs=costs)


def training_devices(cluster: TrainingCluster, *, prefix: str = "d",
                     types: tuple[str, ...] | None = None) -> Cluster:
    """``cluster.devices`` devices ``d0``, ``d1``, ... (of ``types``, one each, when given),
    without a memory limit, every ordered pair joined by the cluster's network."""
    count = cluster.devices if types is None else len(types)
    devices = tuple(Device(name=f"{prefix}{i}",
                           type=PROFILED_DEVICE_TYPE if types is None else types[i],
                           memory_bytes=UNLIMITED_BYTES, torch_device="cpu")
                    for i in range(count))
    links = tuple(Link(src=a.name, dst=b.name, bandwidth_bytes_per_s=cluster.bandwidth_bytes_per_s,
                       latency_s=cluster.latency_s, kind="network")
                  for a in devices for b in devices if a is not b)
    return Cluster(devices=devices, links=links)

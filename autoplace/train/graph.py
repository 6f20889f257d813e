"""Train: the graph of one training step, built from the forward graph (``step_problem``).

From a forward problem (a traced model whose only output is its scalar loss), each forward node
``f`` keeps what autograd saves for it until its backward (its workspace added to its output, an
upper bound). Where its output needs a gradient (it holds ``OpNode.trainable_bytes`` or reads a
value that needs one, and the loss depends on it), ``f@backward`` reads ``f``'s inputs, output and
readers' gradients and takes twice ``f``'s time and launches, or the factor ``profile.backward``
measured (a backward does twice the forward's FLOPs: Kaplan et al., "Scaling Laws for Neural
Language Models", 2020, section 2.1). Where ``f`` holds trainable parameters, ``f@step`` is their
update: gradients and optimizer state (``Optimizer.state_bytes_per_param``) resident, after every
``f@backward``, priced at the roofline of its traffic (``Optimizer.traffic_bytes_per_param``) plus
one launch. The three are colocated (as in Tarnawski et al.'s training graphs, NeurIPS 2020), so an
update runs where its weight is. Parameters are of the plan's dtype (``precision.py``); under mixed
precision an update also holds a float32 master (``precision.update_of``). Each rule and figure
with its source: ``docs/training.md``.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any

import torch

from autoplace.errors import GraphError
from autoplace.ir import Costs, Edge, HostCosts, OpGraph, OpNode, Problem
from autoplace.profile.cost import costs as price
from autoplace.profile.cost import weakest_source
from autoplace.simulate.schedules import BACKWARD, SCHEDULES, STEP, microbatch_name, phase_of
from autoplace.train.precision import element_bytes, update_of

__all__ = ["OPTIMIZERS", "Optimizer", "make_optimizer", "microbatch_copies",
           "model_bytes", "state_memory", "step_problem", "step_state_bytes", "trained_bytes",
           "training_memory"]

# Backward against forward, in time and in launches (see the module's docstring).
BACKWARD_FACTOR = 2.0


@dataclass(frozen=True)
class Optimizer:
    """An optimizer's memory and traffic per float32 parameter. State: SGD none, momentum one
    buffer (4 bytes), Adam and AdamW two moments (8 bytes) (Rajbhandari et al., "ZeRO: Memory
    Optimizations Toward Training Trillion Parameter Models", SC 2020, section 3.1). Traffic of
    one update, as ``torch.optim``'s foreach kernels move it: SGD reads the parameter and its
    gradient and writes the parameter (12 bytes); momentum also reads and writes its buffer
    (20); Adam reads the parameter, gradient and both moments and writes the parameter and the
    moments (28). ``flops_per_param``: the update's arithmetic (Adam's two moment updates,
    square root, division and step: about 12). ``workspace_bytes_per_param``: temporaries while
    a tensor is updated: SGD and momentum update in place (none); ``torch.optim``'s
    single-tensor Adam computes ``exp_avg_sq.sqrt() / bias_correction2_sqrt``, two
    parameter-sized tensors at once (8; measured: a step of the 784-256-128-10 MLP peaks 2 x
    the largest weight above its parameters, gradients and moments). The foreach
    implementation, CUDA's default, makes them for all of a device's tensors at once: a step
    that is to stay within this figure uses ``foreach=False``. ``carried_bytes_per_param``:
    what one tensor's update leaves to the next: Adam's ``denom`` is freed only as the next
    tensor's replaces it, so 4 bytes per parameter of the tensor before (at most the largest
    other; measured: a Llama step updating its 31.25 MiB output weight just before its
    embedding of the same size held 3x that in temporaries)."""

    name: str
    state_bytes_per_param: int
    traffic_bytes_per_param: int
    flops_per_param: int
    workspace_bytes_per_param: int
    carried_bytes_per_param: int = 0


OPTIMIZERS: Mapping[str, Optimizer] = {
    o.name: o for o in (
        Optimizer("sgd", 0, 12, 2, 0),
        Optimizer("sgd-momentum", 4, 20, 4, 0),
        Optimizer("adam", 8, 28, 12, 8, 4),
        Optimizer("adamw", 8, 28, 14, 8, 4),
    )
}


def make_optimizer(name: str, params: Any, lr: float | None = None) -> torch.optim.Optimizer:
    """``name``'s ``torch.optim`` optimizer (a key of ``OPTIMIZERS``) with torch's defaults
    (``lr`` if given), one tensor at a time (``foreach=False``: the step graph's update
    temporaries are per tensor). The emitted model is stepped with it, and the profiler times
    it (``profile.update``)."""
    extra = {} if lr is None else {"lr": lr}
    if name == "sgd":
        return torch.optim.SGD(params, foreach=False, **extra)
    if name == "sgd-momentum":
        return torch.optim.SGD(params, momentum=0.9, foreach=False, **extra)
    if name == "adam":
        return torch.optim.Adam(params, foreach=False, **extra)
    if name == "adamw":
        return torch.optim.AdamW(params, foreach=False, **extra)
    raise ValueError(f"unknown optimizer {name!r}")


def step_problem(problem: Problem, optimizer: str = "adam",
                 backward_factor: Mapping[str, float] | None = None, *,
                 microbatches: int = 1, schedule: str = "gpipe",
                 dtype: str = "float32") -> Problem:
    """The problem of one training step of ``problem``'s forward graph, with ``optimizer``
    (a key of ``OPTIMIZERS``). The forward graph's only output must be the scalar loss.
    ``backward_factor[device]``: the backward's time over the forward's measured on that
    device (``profile.backward``), instead of ``BACKWARD_FACTOR``.

    With ``microbatches`` M > 1, ``problem`` is the forward of one micro-batch, and the step
    runs M of them (``microbatch_copies``) in ``schedule``'s order (``simulate.schedules``).
    ``dtype``: the precision the model was cast to before tracing (``config.DType``); a
    half one is trained in mixed precision, with float32 master weights."""
    opt = OPTIMIZERS.get(optimizer)
    if opt is None:
        raise GraphError(f"unknown optimizer {optimizer!r}; choose one of "
                         f"{', '.join(OPTIMIZERS)}")
    if schedule not in SCHEDULES:
        raise GraphError(f"unknown schedule {schedule!r}; choose one of {', '.join(SCHEDULES)}")
    graph = problem.graph
    loss = _loss_node(graph)
    grads = _needs_gradient(graph, loss)
    nodes, edges, colocate = _step_graph(graph, grads, opt, dtype)
    # No outputs: the simulator keeps a graph's outputs to the end, but a step's caller keeps
    # only the loss's detached scalar; what the loss node saves for its backward (its
    # workspace, added to its output) is freed once that backward has run.
    step_graph = OpGraph(nodes=tuple(nodes), edges=tuple(edges), colocate=tuple(colocate),
                         name=graph.name)
    step = replace(problem, graph=step_graph,
                   costs=_step_costs(problem, step_graph, grads, opt, backward_factor or {}))
    if microbatches == 1:
        return step
    return microbatch_copies(step, microbatches, schedule)


def microbatch_copies(step: Problem, count: int, schedule: str) -> Problem:
    """The step of ``count`` micro-batches from the step of one: every forward and backward
    node once per micro-batch ``k`` (``f#k``, ``f@backward#k``, micro-batch after micro-batch,
    which keeps the nodes in a topological order), each update once, after the backward of
    every micro-batch (gradients accumulate in ``.grad``: the update holds them already). A
    node's parameters are counted on its copy of micro-batch 0 only: the copies share them.
    All copies of a node share its colocation group, so a parameter stays on one device."""
    graph, costs = step.graph, step.costs
    steps = {n.name for n in graph.nodes if n.name.endswith(STEP)}
    nodes = [replace(n, name=microbatch_name(n.name, k),
                     **({} if k == 0 else {"param_bytes": 0, "trainable_bytes": 0}))
             for k in range(count) for n in graph.nodes if n.name not in steps]
    nodes += [n for n in graph.nodes if n.name in steps]
    edges = [Edge(src=e.src if e.src in steps else microbatch_name(e.src, k),
                  dst=e.dst if e.dst in steps else microbatch_name(e.dst, k), bytes=e.bytes,
                  transfer_s=e.transfer_s)
             for k in range(count) for e in graph.edges
             if e.src not in steps or e.dst not in steps]
    edges += [e for e in graph.edges if e.src in steps and e.dst in steps]  # updates' order

    def copies(name: str) -> list[str]:
        return [name] if name in steps else [microbatch_name(name, k) for k in range(count)]

    colocate = [tuple(m for name in group for m in copies(name)) for group in graph.colocate]
    grouped = {name for group in graph.colocate for name in group}
    colocate += [tuple(copies(n.name)) for n in graph.nodes
                 if n.name not in grouped and n.name not in steps]

    def per_copy(table: Mapping[str, Any]) -> dict[str, Any]:
        return {m: value for name, value in table.items() for m in copies(name)}

    host = costs.host
    return replace(
        step, pipeline_schedule=schedule,
        graph=OpGraph(nodes=tuple(nodes), edges=tuple(edges), colocate=tuple(colocate),
                      name=graph.name),
        costs=Costs(compute_s=per_copy(costs.compute_s), source=per_copy(costs.source),
                    device_source=per_copy(costs.device_source),
                    host=None if host is None else replace(
                        host, launch_s=per_copy(host.launch_s))))


def _loss_node(graph: OpGraph) -> str:
    if len(graph.outputs) != 1:
        raise GraphError(
            f"a training step needs the model's loss as its only output, but the traced graph "
            f"returns {len(graph.outputs)} values ({', '.join(graph.outputs[:4])}): return "
            "the loss, or define loss(outputs, *targets) in the model file")
    loss = graph.node(graph.outputs[0])
    if loss.output_shapes not in ((), ((),)):
        raise GraphError(f"the loss {loss.name!r} has shape {list(loss.output_shapes[0])}, not "
                         "a scalar: reduce it (mean or sum) before returning it")
    return loss.name


def _needs_gradient(graph: OpGraph, loss: str) -> set[str]:
    """The nodes whose output needs a gradient: on a path from a trainable parameter to the
    loss. A tensor's bytes count on its first reader only; its other readers (a tied
    embedding's second use) share a colocation group with it, and read it too."""
    colocation = graph.colocation_of
    trains = {m for n in graph.nodes if n.trainable_bytes for m in colocation[n.name]}
    requires: set[str] = set()
    for n in graph.nodes:
        if not n.is_input and (n.name in trains or any(
                e.src in requires for e in graph.in_edges(n.name))):
            requires.add(n.name)
    feeds_loss = {loss}
    for n in reversed(graph.nodes):
        if n.name in feeds_loss:
            feeds_loss.update(e.src for e in graph.in_edges(n.name))
    return requires & feeds_loss


def _step_graph(graph: OpGraph, grads: set[str], opt: Optimizer, dtype: str
                ) -> tuple[list[OpNode], list[Edge], list[tuple[str, ...]]]:
    """The step graph's nodes (forward, backward in reverse order, steps), edges and
    colocation groups (see the module's docstring)."""
    update, size = update_of(opt, dtype), element_bytes(dtype)
    nodes = [replace(n, output_bytes=n.output_bytes + n.workspace_bytes) if n.name in grads
             else n for n in graph.nodes]
    edges = list(graph.edges)
    backward: list[OpNode] = []
    steps: list[OpNode] = []
    tied = tied_gradients(graph, grads)
    sizes = sorted((n.trainable_bytes // size for n in graph.nodes if n.name in grads),
                   reverse=True)[:2] + [0, 0]
    for n in reversed(graph.nodes):
        if n.name not in grads:
            continue
        ins = [e for e in graph.in_edges(n.name) if e.src in grads]
        name = n.name + BACKWARD
        backward.append(OpNode(name=name, module=n.module, output_bytes=sum(e.bytes for e in ins),
                               workspace_bytes=(n.workspace_bytes + n.trainable_bytes
                                                + tied.get(n.name, 0)),
                               flops=BACKWARD_FACTOR * n.flops, dtype=n.dtype,
                               bytes_accessed=int(BACKWARD_FACTOR * n.bytes_accessed),
                               launches=int(BACKWARD_FACTOR * n.launches)))
        saved = {e.src: e.bytes for e in graph.in_edges(n.name)}
        if n.output_bytes + n.workspace_bytes:
            saved[n.name] = n.output_bytes + n.workspace_bytes
        edges += [Edge(src=src, dst=name, bytes=b) for src, b in saved.items()]
        edges += [Edge(src=name, dst=e.src + BACKWARD, bytes=e.bytes) for e in ins]
        if n.trainable_bytes:
            params = n.trainable_bytes / size
            steps.append(OpNode(
                name=n.name + STEP, module=n.module, dtype="float32", launches=1,
                param_bytes=n.trainable_bytes + int(params * update.held_bytes_per_param),
                workspace_bytes=int(params * update.workspace_bytes_per_param
                                    + opt.carried_bytes_per_param
                                    * sizes[1 if sizes[0] == params else 0]),
                flops=params * update.flops_per_param,
                bytes_accessed=int(params * update.traffic_bytes_per_param)))
            # The update waits for every gradient of its tensors: its own backward's and
            # those of the tensors' other readers (colocated with it, ``_needs_gradient``).
            # ``optimizer.step()`` runs only once the whole backward is done: the pipeline adds
            # that order for one micro-batch on CPU workers (``updates.after_backward``); here
            # an update may start earlier than it does when run.
            edges += [Edge(src=m + BACKWARD, dst=n.name + STEP, bytes=0)
                      for m in graph.colocation_of[n.name] if m in grads]
    colocate = []
    grouped: set[str] = set()
    for group in graph.colocate:
        members = [*group, *(m + BACKWARD for m in group if m in grads),
                   *(m + STEP for m in group if m in grads and graph.node(m).trainable_bytes)]
        colocate.append(tuple(members))
        grouped.update(group)
    for n in graph.nodes:
        if n.name in grads and n.name not in grouped:
            colocate.append((n.name, n.name + BACKWARD,
                             *((n.name + STEP,) if n.trainable_bytes else ())))
    return [*nodes, *backward, *steps], edges, colocate


def tied_gradients(graph: OpGraph, grads: set[str]) -> dict[str, int]:
    """What the backward of each reader of a tied weight (a colocation group, ``_needs_gradient``)
    holds beyond its own node's: every reader makes a gradient of the weight (the one that
    holds it counts that already), and autograd adds each to the sum of those made before it
    out of place, so each reader but the first to run (the last in the forward) holds the new
    sum too. The group's weight is bounded by its readers' trainable bytes."""
    extra: dict[str, int] = {}
    for group in graph.colocate:
        readers = [m for m in group if m in grads]
        weight = sum(graph.node(m).trainable_bytes for m in group)
        if len(readers) < 2 or not weight:
            continue
        first = max(readers, key=graph.index.__getitem__)
        for m in readers:
            extra[m] = (extra.get(m, 0) + (0 if graph.node(m).trainable_bytes else weight)
                        + (0 if m == first else weight))
    return extra


def _step_costs(problem: Problem, graph: OpGraph, grads: set[str], opt: Optimizer,
                factor: Mapping[str, float]) -> Costs:
    """Forward times as given; backward twice the forward's, or the measured ``factor`` times
    it (calibrated); the optimizer's steps priced as ``cost.costs`` prices any node (the
    roofline of their traffic, and their one launch on a GPU's launcher)."""
    costs, cluster = problem.costs, problem.cluster
    compute = {name: dict(per) for name, per in costs.compute_s.items()}
    source = dict(costs.source)
    device_source = {name: dict(per) for name, per in costs.device_source.items()}
    for name in grads:
        back = name + BACKWARD
        compute[back] = {d: factor.get(d, BACKWARD_FACTOR) * t
                         for d, t in costs.compute_s[name].items()}
        source[back] = costs.source.get(name, "analytic")
        if factor:
            device_source[back] = {d: "calibrated" if d in factor else "analytic"
                                   for d in cluster.names}
            source[back] = weakest_source(device_source[back].values())
    steps = OpGraph(nodes=tuple(n for n in graph.nodes if n.name.endswith(STEP)), edges=())
    priced = price(steps, cluster)
    for node in steps.nodes:
        allowed = problem.allowed[node.name.removesuffix(STEP)]
        compute[node.name] = {d: t if d in allowed else math.inf
                              for d, t in priced.compute_s[node.name].items()}
        source[node.name] = priced.source[node.name]
    return Costs(compute_s=compute, source=source, device_source=device_source,
                 host=_step_host(problem, grads, compute, priced.host))


def _step_host(problem: Problem, grads: set[str], compute: Mapping[str, Mapping[str, float]],
               steps: HostCosts | None) -> HostCosts | None:
    """The launcher's costs of the step: a backward node launches twice its forward's kernels
    (at most its time), a step node as ``cost.costs`` priced it (``steps``)."""
    host = problem.costs.host
    if host is None:
        return None
    launch_s = {name: dict(per) for name, per in host.launch_s.items()}
    for name in grads:
        back = name + BACKWARD
        launch_s[back] = {d: min(BACKWARD_FACTOR * t, compute[back][d])
                          for d, t in host.launch_s.get(name, {}).items()}
    if steps is not None:
        launch_s.update(steps.launch_s)
    return replace(host, launch_s=launch_s)


def trained_bytes(graph: OpGraph) -> dict[str, int]:
    """The trainable bytes of each forward node of a step graph, by the forward's name: what
    its ``f@step`` updates (a micro-batch's copies share the parameters, counted on copy 0)."""
    trained = {}
    for node in graph.nodes:
        base, phase, k = phase_of(node.name)
        if phase == "forward" and k in (None, 0):
            trained[base] = node.trainable_bytes
    return trained


def model_bytes(model: torch.nn.Module) -> tuple[int, int]:
    """The bytes of ``model``'s parameters and buffers, and of its trained parameters."""
    params = list(model.parameters())
    return (sum(t.numel() * t.element_size() for t in (*params, *model.buffers())),
            sum(p.numel() * p.element_size() for p in params if p.requires_grad))


def step_state_bytes(params: int, trained: int, optimizer: str, dtype: str = "float32") -> int:
    """What a training step holds before any activation, as ``step_problem`` charges it: the
    parameters and buffers (``params`` bytes), the trained ones' gradients (``trained``) and
    ``optimizer``'s state (under mixed precision with the float32 masters)."""
    held = update_of(OPTIMIZERS[optimizer], dtype).held_bytes_per_param
    return params + trained + int(trained / element_bytes(dtype) * held)


def training_memory(graph: OpGraph, optimizer: str, capacity: int | None = None,
                    microbatches: int = 1, recompute: str = "off",
                    dtype: str = "float32", sharded: int = 1) -> str:
    """What a training step holds beyond inference, for an error that says no placement fits:
    the bytes of gradients and optimizer state, how many bytes the devices' ``capacity``
    (together) lacks for them, and what would shrink them (``recompute``: what was asked):
    the numbers ``step_problem`` charges (under mixed precision the state holds the float32
    master weights too); ``sharded``: FSDP's R, each device holding 1/R of all three."""
    return state_memory(sum(n.param_bytes for n in graph.nodes),
                        sum(n.trainable_bytes for n in graph.nodes), optimizer, capacity,
                        microbatches, recompute, dtype, sharded)


def state_memory(params: int, trained: int, optimizer: str, capacity: int | None = None,
                 microbatches: int = 1, recompute: str = "off", dtype: str = "float32",
                 sharded: int = 1) -> str:
    """``training_memory``'s sentence from the bytes of the parameters and buffers
    (``params``) and of the trained parameters (``trained``), before any sharding."""
    opt = OPTIMIZERS[optimizer]
    params, trained = params // sharded, trained // sharded
    state = step_state_bytes(params, trained, optimizer, dtype) - params - trained
    lighter = [o.name for o in OPTIMIZERS.values()
               if o.state_bytes_per_param < opt.state_bytes_per_param]
    short = params + trained + state - (capacity or 0)
    return ((f"Each of {sharded} sharded replicas (FSDP) holds 1/{sharded} of the parameters, "
             "gradients and optimizer state. " if sharded > 1 else "")
            + f"A training step holds, beside the {params} bytes of parameters and buffers and "
            f"the activations kept for backward, {trained} bytes of gradients and {state} bytes "
            f"of {optimizer} state"
            + (f" (float32 master weights included: {dtype} mixed precision)"
               if dtype != "float32" else "")
            + (f", {short} bytes more than all the devices hold together before any activation"
               if capacity is not None and short > 0 else "")
            + ": add devices"
            + (f", use an optimizer with less state ({', '.join(lighter)})" if lighter else "")
            + (" (sharded replicas run one batch each: micro-batches and recomputation with "
               "them are not built yet)." if sharded > 1 else
               (", or cut the batch into more micro-batches" if microbatches > 1 else
                ", or cut the batch into micro-batches (--microbatches)")
               + ", which hold fewer activations at once"
               + (" (recomputation was tried too)." if microbatches > 1 and recompute != "off"
                  else ", and recompute them (--recompute all, with micro-batches).")))

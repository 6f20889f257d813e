"""Emit: each segment as an fx ``GraphModule`` that runs wherever it is loaded.

``build_segment`` copies one segment's nodes (from ``segment``) into a new graph
whose inputs are the values it receives, whose outputs are the values others read, and which
holds its own copy of the tensors it owns. Every device argument is rewritten to read the
segment's ``device`` attribute (``_device_rewrite`` says which arguments those are), so a segment
runs where it was loaded, after any ``device_map`` remap; factory ops get that device explicitly,
since their default is the CPU. ``_localize`` does the same for higher-order ops' subgraphs.
"""

from __future__ import annotations

import copy
from collections.abc import Mapping, Sequence
from typing import Any

import torch
import torch.fx

from autoplace.emit.codegen.lower import COMPUTE_OPS, fetch
from autoplace.errors import EmitError

__all__ = ["build_segment"]

# torch factory functions that place their result on the default device unless told otherwise.
_TORCH_FACTORIES = frozenset(
    [torch.arange, torch.empty, torch.eye, torch.full, torch.linspace, torch.ones, torch.rand]
    + [torch.randint, torch.randn, torch.scalar_tensor, torch.tensor, torch.zeros]
)



def build_segment(
    group: Sequence[torch.fx.Node],
    owned: Sequence[torch.fx.Node],
    *,
    attrs: Mapping[str, Any],
    crossing: set[torch.fx.Node],
    index: int,
    device: str,
) -> tuple[torch.fx.GraphModule, list[torch.fx.Node], list[torch.fx.Node]]:
    """One segment's GraphModule, with its inputs and outputs (nodes of the lowered graph).

    ``group`` are the segment's compute nodes in run order, ``owned`` the tensor attributes it
    holds (``attrs`` maps targets to objects), ``crossing`` the values read outside their
    segment. Tensors are copied onto ``device``; every device argument reads ``self.device``.
    """
    members = set(group) | set(owned)
    inputs: list[torch.fx.Node] = []
    subgraphs: list[torch.fx.Node] = []
    for n in group:
        for p in n.all_input_nodes:
            if p in members or p in inputs or p in subgraphs:
                continue
            if p.op == "get_attr" and isinstance(attrs[p.target], torch.fx.GraphModule):
                subgraphs.append(p)  # code, not data: every segment that calls it gets a copy
            else:
                inputs.append(p)
    graph = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {p: graph.placeholder(p.name) for p in inputs}
    values: dict[str, Any] = {"device": torch.device(device)}
    for n in [*owned, *subgraphs]:
        env[n] = graph.node_copy(n)
        value = attrs[n.target]
        values[n.target] = (
            _localize(value, device)
            if isinstance(value, torch.fx.GraphModule)
            else _materialize(value, device)
        )
    device_node = graph.get_attr("device") if any(_uses_device(n) for n in group) else None
    for n in group:
        env[n] = graph.node_copy(n, env.__getitem__)
        if device_node is not None:
            _rewrite_device(env[n], device_node)
    outputs = [n for n in [*group, *owned] if n in crossing]
    graph.output(tuple(env[n] for n in outputs))
    segment = torch.fx.GraphModule(values, graph, class_name=f"Segment{index}")
    segment.device = torch.device(device)
    return segment, inputs, outputs


def _localize(gm: torch.fx.GraphModule, device: str) -> torch.fx.GraphModule:
    """A copy of a higher-order op's subgraph whose device arguments read its own ``device``."""
    graph = copy.deepcopy(gm.graph)
    attrs: dict[str, Any] = {"device": torch.device(device)}
    for node in graph.nodes:
        if node.op == "get_attr":
            value = fetch(gm, node.target)
            if isinstance(value, torch.fx.GraphModule):
                attrs[node.target] = _localize(value, device)
            elif isinstance(value, torch.Tensor):
                attrs[node.target] = _materialize(value, device)
            else:
                raise EmitError(f"subgraph attribute {node.target!r} is {type(value).__name__}")
        if node.op == "call_module":
            raise EmitError(f"subgraph node {node.name!r} calls a module; cannot emit it")
    users = [n for n in graph.nodes if _uses_device(n)]
    if users:
        first = next(n for n in graph.nodes if n.op != "placeholder")
        with graph.inserting_before(first):
            device_node = graph.get_attr("device")
        for node in users:
            _rewrite_device(node, device_node)
    local = torch.fx.GraphModule(attrs, graph, class_name=type(gm).__name__)
    local.device = torch.device(device)
    return local


def _materialize(tensor: torch.Tensor, device: str) -> torch.Tensor:
    # No copy where the device does not change: the emitted model shares the original's
    # storage there, so planning does not hold every weight twice (issue 13). ``.to`` copies
    # only when the device differs.
    # A meta tensor (lower's ``meta_weights``) stays one: load_model reads its values.
    data = tensor.detach() if tensor.is_meta else tensor.detach().to(device)
    if isinstance(tensor, torch.nn.Parameter):
        return torch.nn.Parameter(data, requires_grad=tensor.requires_grad)
    return data


_SENTINEL = object()


def _uses_device(node: torch.fx.Node) -> bool:
    return _device_rewrite(node, _SENTINEL) is not None


def _rewrite_device(node: torch.fx.Node, device_node: torch.fx.Node) -> None:
    rewritten = _device_rewrite(node, device_node)
    if rewritten is not None:
        node.target, node.args, node.kwargs = rewritten


def _device_rewrite(node: torch.fx.Node, device: Any) -> tuple[Any, Any, Any] | None:
    """``(target, args, kwargs)`` with every device argument replaced by ``device``; None if the
    node has none. Also gives factory ops an explicit device, since their default is the CPU."""
    if node.op not in COMPUTE_OPS:
        return None
    changed = False

    def swap(value: Any) -> Any:
        nonlocal changed
        if isinstance(value, torch.device):
            changed = True
            return device
        return value

    target = node.target
    args = torch.fx.node.map_aggregate(node.args, swap)
    kwargs = dict(torch.fx.node.map_aggregate(node.kwargs, swap))
    if isinstance(kwargs.get("device"), str):
        kwargs["device"], changed = device, True
    if node.op == "call_method" and target == "to":
        args = tuple(device if _is_device_string(a) else a for a in args)
        changed = changed or any(a is device for a in args)
    if node.op == "call_method" and target in ("cuda", "cpu"):
        target, args, kwargs, changed = "to", (args[0], device), {}, True
    if "device" not in kwargs and _is_factory(node):
        kwargs["device"], changed = device, True
    return (target, args, kwargs) if changed else None


def _is_device_string(value: Any) -> bool:
    if not isinstance(value, str):
        return False
    try:
        torch.device(value)
    except RuntimeError:
        return False
    return True


def _is_factory(node: torch.fx.Node) -> bool:
    if node.op != "call_function":
        return False
    if node.target in _TORCH_FACTORIES:
        return True
    schema = getattr(node.target, "_schema", None)
    if not isinstance(node.target, torch._ops.OpOverload) or schema is None:
        return False
    if not any(a.name == "device" and a.kwarg_only for a in schema.arguments):
        return False
    # With a tensor input the op follows that tensor's device (empty_like, _to_copy, ...).
    return not any(
        not isinstance(p.meta.get("val"), (int, float, bool, torch.SymInt))
        for p in node.all_input_nodes
    )


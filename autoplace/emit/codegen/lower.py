"""Emit: copy the traced fx graph into the form that segments are cut from.

``lower`` returns a ``Lowered`` graph: ``call_module`` nodes inlined (generated source cannot
rebuild arbitrary modules), each tensor under one name (tied weights stay tied and are stored
once), torch.export's ``_guards_fn`` input check dropped. Read ``Lowered``, then ``lower`` and
``_Lowerer`` (``_copy`` walks one graph, ``_inline`` recurses into a module, ``_attr`` names a
tensor once); ``fetch`` reads a dotted attribute and is shared by the later steps.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch.utils import _pytree as pytree

from autoplace.errors import EmitError

__all__ = ["COMPUTE_OPS", "Lowered", "fetch", "lower"]

COMPUTE_OPS = ("call_function", "call_method", "call_module")
_GUARD_TARGET = "_guards_fn"  # torch.export's input check, torch.export._unlift.GuardsFn


@dataclass
class Lowered:
    """The graph after inlining and renaming: only placeholder, get_attr, call_function,
    call_method and output nodes; ``attrs`` maps each get_attr target to its object and
    ``origin`` maps each node name to the original fx node it came from."""

    graph: torch.fx.Graph
    attrs: dict[str, Any] = field(default_factory=dict)
    origin: dict[str, str] = field(default_factory=dict)
    orig_args: list[str] | None = None
    in_spec: pytree.TreeSpec | None = None
    out_spec: pytree.TreeSpec | None = None


def lower(gm: torch.fx.GraphModule, *, meta_weights: bool = False) -> Lowered:
    """Copy ``gm``'s graph into the form segments are cut from: ``call_module`` nodes inlined
    (generated source cannot rebuild arbitrary modules), each tensor under one name (so tied
    weights stay tied and are stored once), torch.export's ``_guards_fn`` dropped. Tensors on
    the meta device are refused unless ``meta_weights`` (their values come from a checkpoint
    when the emitted model is loaded)."""
    return _Lowerer(gm, meta_weights=meta_weights).run()


class _Lowerer:
    def __init__(self, gm: torch.fx.GraphModule, *, meta_weights: bool) -> None:
        self.gm = gm
        self.meta_weights = meta_weights
        self.out = Lowered(torch.fx.Graph())
        self.tensor_target: dict[int, str] = {}
        self.tensor_node: dict[str, torch.fx.Node] = {}

    def run(self) -> Lowered:
        info = getattr(self.gm.graph._codegen, "pytree_info", None)
        if info is not None:
            self.out.orig_args = [a for a in info.orig_args if a != "self"]
            self.out.in_spec, self.out.out_spec = info.in_spec, info.out_spec
        for tensor in list(self.gm.parameters()) + list(self.gm.buffers()):
            if tensor.is_meta and not self.meta_weights:
                raise EmitError("parameters are on the meta device; emit needs real weights")
        result = self._copy(self.gm.graph, self.gm, prefix="", bind=None, origin=None)
        self.out.graph.output(result)
        return self.out

    def _copy(
        self,
        graph: torch.fx.Graph,
        root: torch.nn.Module,
        *,
        prefix: str,
        bind: Any,
        origin: str | None,
    ) -> Any:
        env: dict[torch.fx.Node, Any] = {}
        new = self.out.graph
        placeholders = 0
        for node in graph.nodes:
            source = origin or node.name
            if node.op == "placeholder":
                if bind is None:
                    env[node] = new.node_copy(node)
                    self.out.origin[env[node].name] = node.name
                else:
                    env[node] = bind(node, placeholders)
                placeholders += 1
            elif node.op == "get_attr":
                target = f"{prefix}{node.target}"
                env[node] = self._attr(target, fetch(root, node.target), source)
            elif node.op == "output":
                return torch.fx.map_arg(node.args[0], env.__getitem__)
            elif node.op == "call_module" and bind is None and node.target == _GUARD_TARGET:
                env[node] = None  # export's guard function; it has no users
            else:
                args = torch.fx.map_arg(node.args, env.__getitem__)
                kwargs = torch.fx.map_arg(node.kwargs, env.__getitem__)
                if node.op == "call_module":
                    env[node] = self._inline(node, root, args, kwargs, prefix, source)
                    continue
                name = node.name if origin is None else f"{origin}_{node.name}"
                copied = new.create_node(node.op, node.target, args, kwargs, name, node.type)
                copied.meta = copy.copy(node.meta)
                self.out.origin[copied.name] = source
                env[node] = copied
        raise EmitError("the fx graph has no output node")

    def _inline(
        self,
        node: torch.fx.Node,
        root: torch.nn.Module,
        args: tuple[Any, ...],
        kwargs: dict[str, Any],
        prefix: str,
        origin: str,
    ) -> Any:
        module = root.get_submodule(node.target)
        if isinstance(module, torch.fx.GraphModule):
            graph = module.graph
        else:
            try:
                graph = torch.fx.Tracer().trace(module)
            except Exception as error:
                raise EmitError(
                    f"cannot inline call_module node {node.name!r} ({type(module).__qualname__}):"
                    f" torch.fx could not trace it ({error}); export the model with torch.export "
                    "instead of symbolic_trace"
                ) from error

        def bind(placeholder: torch.fx.Node, position: int) -> Any:
            name = str(placeholder.target)
            if name.startswith("*"):
                raise EmitError(
                    f"cannot inline call_module node {node.name!r}: {type(module).__qualname__}"
                    f".forward takes {name}; only named arguments can be inlined"
                )
            if position < len(args):
                return args[position]
            if name in kwargs:
                return kwargs[name]
            if placeholder.args:
                return placeholder.args[0]
            raise EmitError(f"call_module node {node.name!r} does not pass argument {name!r}")

        return self._copy(graph, module, prefix=f"{prefix}{node.target}.", bind=bind, origin=origin)

    def _attr(self, target: str, value: Any, origin: str) -> torch.fx.Node:
        graph, attrs = self.out.graph, self.out.attrs
        if isinstance(value, torch.Tensor):
            if value.is_meta and not self.meta_weights:
                raise EmitError(
                    f"parameters are on the meta device ({target!r}); emit needs real weights"
                )
            if target == "device" or target.startswith("device."):
                raise EmitError(f"attribute {target!r} clashes with the segments' device field")
            target = self.tensor_target.setdefault(id(value), target)
            if target not in self.tensor_node:
                self.tensor_node[target] = graph.get_attr(target)
                attrs[target] = value
                self.out.origin[self.tensor_node[target].name] = origin
            return self.tensor_node[target]
        if isinstance(value, torch.fx.GraphModule):
            node = graph.get_attr(target)
            attrs[target] = value
            self.out.origin[node.name] = origin
            return node
        raise EmitError(
            f"get_attr {target!r} is a {type(value).__qualname__}; emit supports tensors and "
            "fx subgraphs (higher-order ops such as torch.cond) only"
        )


def fetch(module: torch.nn.Module, target: str) -> Any:
    value: Any = module
    for part in target.split("."):
        value = getattr(value, part)
    return value

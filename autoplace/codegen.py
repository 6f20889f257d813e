"""How a placed graph becomes code: fx segments, then Python source that imports only torch.

``autoplace.emit`` decides what runs where; this module writes it down, in two halves.

Graphs, read in this order: ``lower`` copies the traced graph into the form segments are cut from
(``call_module`` inlined, one name per tensor); ``build_segment`` turns one device's run of nodes
into a ``GraphModule`` whose device arguments all read ``self.device`` (``_device_rewrite`` says
which arguments those are).

Source: ``IMPORTS_SOURCE`` and ``HELPERS_SOURCE`` start every generated file; ``signature_source``
and ``forward_source`` write the top-level forward that calls the segments and moves values
between devices; ``class_source`` writes one ``torch.nn.Module`` class per segment (its forward is
torch.fx's own codegen); ``model_source`` assembles ``model.py``. ``compile_forward`` runs the
same preamble, so the in-memory model executes exactly the forward that ``save_model`` writes.
"""

from __future__ import annotations

import builtins
import copy
import importlib
import linecache
import math
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx
from torch.utils import _pytree as pytree

from autoplace.errors import EmitError

__all__ = [
    "COMPUTE_OPS",
    "HELPERS_SOURCE",
    "IMPORTS_SOURCE",
    "MODEL_CLASS_NAME",
    "Lowered",
    "SegmentCall",
    "build_segment",
    "class_source",
    "compile_forward",
    "fetch",
    "forward_source",
    "literal_source",
    "lower",
    "merge_globals",
    "model_source",
    "signature_source",
]

MODEL_CLASS_NAME = "AutoplacedModel"
COMPUTE_OPS = ("call_function", "call_method", "call_module")
_GUARD_TARGET = "_guards_fn"  # torch.export's input check, torch.export._unlift.GuardsFn
# torch factory functions that place their result on the default device unless told otherwise.
_TORCH_FACTORIES = frozenset(
    [torch.arange, torch.empty, torch.eye, torch.full, torch.linspace, torch.ones, torch.rand]
    + [torch.randint, torch.randn, torch.scalar_tensor, torch.tensor, torch.zeros]
)

# ---------------------------------------------------------------------------------------------
# Graphs


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


def lower(gm: torch.fx.GraphModule) -> Lowered:
    """Copy ``gm``'s graph into the form segments are cut from: ``call_module`` nodes inlined
    (generated source cannot rebuild arbitrary modules), each tensor under one name (so tied
    weights stay tied and are stored once), torch.export's ``_guards_fn`` dropped."""
    return _Lowerer(gm).run()


class _Lowerer:
    def __init__(self, gm: torch.fx.GraphModule) -> None:
        self.gm = gm
        self.out = Lowered(torch.fx.Graph())
        self.tensor_target: dict[int, str] = {}
        self.tensor_node: dict[str, torch.fx.Node] = {}

    def run(self) -> Lowered:
        info = getattr(self.gm.graph._codegen, "pytree_info", None)
        if info is not None:
            self.out.orig_args = [a for a in info.orig_args if a != "self"]
            self.out.in_spec, self.out.out_spec = info.in_spec, info.out_spec
        for tensor in list(self.gm.parameters()) + list(self.gm.buffers()):
            if tensor.is_meta:
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
            if value.is_meta:
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
    # A copy even on the same device: the emitted model must not alias the original's weights.
    data = tensor.detach().to(device, copy=True)
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


# ---------------------------------------------------------------------------------------------
# Source


# Every name torch.fx codegen may reference without telling us where it comes from (see
# ``torch.fx.graph.CodeGen._gen_python_code``); a generated file binds all of them up front.
IMPORTS_SOURCE = """\
from math import inf, nan

import torch
import torch.fx._pytree as fx_pytree
import torch.utils._pytree as pytree
from torch import device

NoneType = type(None)
"""

HELPERS_SOURCE = '''\
def _move(value, device):
    """Copy tensors, also inside tuples, lists and dicts, to ``device``; pass other values."""
    if isinstance(value, torch.Tensor):
        return value.to(device, non_blocking=False)
    if type(value) in (tuple, list):
        return type(value)(_move(item, device) for item in value)
    if type(value) is dict:
        return {key: _move(item, device) for key, item in value.items()}
    return value


def _unflatten(flat, spec):
    """Rebuild the original output structure; a flat tuple when the structure was not saved."""
    if spec is None:
        return tuple(flat)
    return pytree.tree_unflatten(list(flat), spec)


def _empty(shape, dtype, *, parameter, requires_grad=False):
    """A meta-device stand-in that load_model replaces with the saved tensor."""
    tensor = torch.empty(shape, dtype=dtype, device="meta")
    if parameter:
        return torch.nn.Parameter(tensor, requires_grad=requires_grad)
    return tensor


def _attach(root, target, value):
    """Set ``root.<dotted target>``, creating empty parent modules so state_dict keys keep the
    original model's names."""
    *path, name = target.split(".")
    module = root
    for part in path:
        if part not in module._modules:
            module.add_module(part, torch.nn.Module())
        module = module._modules[part]
    if isinstance(value, torch.Tensor) and not isinstance(value, torch.nn.Parameter):
        module.register_buffer(name, value)
    else:
        setattr(module, name, value)
'''

# What the preamble binds, so a segment's codegen globals can be checked against it.
_PROVIDED: dict[str, Any] = {
    "inf": math.inf,
    "nan": math.nan,
    "torch": torch,
    "device": torch.device,
    "NoneType": type(None),
}
_PROVIDED_MODULES = {"fx_pytree": "torch.fx._pytree", "pytree": "torch.utils._pytree"}


@dataclass(frozen=True)
class SegmentCall:
    """One segment call in the top-level forward.

    ``moves`` are ``(new_name, value_name, is_tensor)``: values that arrive from another device
    (or from the caller) and are copied to this segment's device before the call.
    """

    index: int
    planned_device: str
    moves: tuple[tuple[str, str, bool], ...]
    args: tuple[str, ...]
    outputs: tuple[str, ...]


def signature_source(
    placeholders: Sequence[torch.fx.Node],
    *,
    orig_args: Sequence[str] | None,
    in_spec: Any,
) -> tuple[str, list[str]]:
    """The top-level forward's parameters and the lines that bind them to placeholder names:
    a pytree flatten for exported graphs (``in_spec``), plain parameters otherwise."""
    names = [p.name for p in placeholders]
    if in_spec is not None and orig_args is not None:
        # Mirrors torch.fx.graph._PyTreeCodeGen.gen_var_bindings, which exported modules use.
        spec, args = in_spec, list(orig_args)
        if (
            spec.type is tuple
            and spec.num_children == 2
            and spec.child(0).type is tuple
            and spec.child(1).type is dict
        ):
            count = spec.child(0).num_children
            kwargs = ", ".join(f"{k!r}: {v}" for k, v in zip(spec.child(1).context, args[count:]))
            flatten = f"([{', '.join(args[:count])}], {{{kwargs}}}), self._in_spec"
        else:
            flatten = f"[{', '.join(args)}], self._in_spec"
        bindings = [f"{', '.join(names)}, = fx_pytree.tree_flatten_spec({flatten})"]
        return ", ".join(args), bindings if names else []
    params, bindings = [], []
    for p in placeholders:
        target = str(p.target)
        if p.args:
            try:
                default = literal_source(p.args[0], {})
            except EmitError as error:
                raise EmitError(f"default of input {target!r}: {error}") from error
            params.append(f"{target}={default}")
        else:
            params.append(target)
        if p.name != target.lstrip("*"):
            bindings.append(f"{p.name} = {target.lstrip('*')}")
    return ", ".join(params), bindings


def forward_source(
    *, signature: str, bindings: Sequence[str], calls: Sequence[SegmentCall], result: str
) -> str:
    """The top-level ``def forward(self, ...)``: bind inputs, call segments in order, return."""
    head = f"def forward(self, {signature}):" if signature else "def forward(self):"
    lines = [head, *(f"    {line}" for line in bindings)]
    for call in calls:
        lines.append(f"    # segment {call.index}: planned on {call.planned_device}")
        target = f"self.seg{call.index}.device"
        for new_name, value, is_tensor in call.moves:
            if is_tensor:
                lines.append(f"    {new_name} = {value}.to({target}, non_blocking=False)")
            else:
                lines.append(f"    {new_name} = _move({value}, {target})")
        invoke = f"self.seg{call.index}({', '.join(call.args)})"
        if call.outputs:
            lines.append(f"    {', '.join(call.outputs)}, = {invoke}")
        else:
            lines.append(f"    {invoke}")
    lines.append(f"    return {result}")
    return "\n".join(lines) + "\n"


def literal_source(value: Any, name_of: Mapping[torch.fx.Node, str]) -> str:
    """Python source for an fx argument made of nodes, containers and plain constants."""
    if isinstance(value, torch.fx.Node):
        return name_of[value]
    if isinstance(value, tuple):
        items = [literal_source(item, name_of) for item in value]
        return "(" + ", ".join(items) + ("," if len(items) == 1 else "") + ")"
    if isinstance(value, list):
        return "[" + ", ".join(literal_source(item, name_of) for item in value) + "]"
    if isinstance(value, dict):
        pairs = (f"{key!r}: {literal_source(item, name_of)}" for key, item in value.items())
        return "{" + ", ".join(pairs) + "}"
    if value is None or isinstance(value, (bool, int, float, str)):
        return repr(value)  # inf and nan print as names the preamble binds
    if isinstance(value, torch.dtype):
        return str(value)
    raise EmitError(
        f"cannot write the constant {value!r} ({type(value).__name__}) into generated source; "
        "only None, bool, int, float, str, torch.dtype and containers of them are supported"
    )


def class_source(
    gm: torch.fx.GraphModule, *, class_name: str, doc: str
) -> tuple[list[str], dict[str, Any]]:
    """Classes for ``gm`` and the subgraph modules it holds (those first), and the extra globals
    its forward needs beyond the preamble (name -> object).

    ``gm`` must have been built by the emit stage: tensors and subgraphs reached by ``get_attr``,
    plus a ``device`` attribute that its forward reads for every device argument.
    """
    classes: list[str] = []
    extra: dict[str, Any] = {}
    init = [
        "    def __init__(self, device):",
        "        super().__init__()",
        "        self.device = torch.device(device)",
    ]
    seen: set[str] = {"device"}
    for node in gm.graph.nodes:
        if node.op != "get_attr" or node.target in seen:
            continue
        seen.add(node.target)
        value = fetch(gm, node.target)
        if isinstance(value, torch.fx.GraphModule):
            nested = f"{class_name}_{re.sub(r'[^0-9A-Za-z_]', '_', node.target)}"
            nested_classes, nested_globals = class_source(
                value, class_name=nested, doc=f"Subgraph {node.target!r} of {class_name}."
            )
            classes += nested_classes
            merge_globals(extra, nested_globals)
            init.append(f"        _attach(self, {node.target!r}, {nested}(device))")
        elif isinstance(value, torch.Tensor):
            is_param = isinstance(value, torch.nn.Parameter)
            grad = ", requires_grad=True" if is_param and value.requires_grad else ""
            empty = f"_empty({tuple(value.shape)!r}, {value.dtype}, parameter={is_param}{grad})"
            init.append(f"        _attach(self, {node.target!r}, {empty})")
        else:
            raise EmitError(
                f"{class_name}: attribute {node.target!r} is a {type(value).__name__}; generated "
                "code can only hold tensors and fx subgraphs"
            )
    code = gm.graph.python_code(root_module="self")
    merge_globals(extra, _extra_globals(code.globals, where=class_name))
    # fx puts module-level statements (e.g. ``torch.fx._symbolic_trace.wrap(...)``) before the
    # def; they only matter for re-tracing, and the class body needs the def alone.
    src = code.src[code.src.index("def forward") :].rstrip()
    forward = "\n".join(("    " + line) if line.strip() else "" for line in src.splitlines())
    body = "\n".join([f'    """{doc}"""', "", *init, "", forward])
    classes.append(f"class {class_name}(torch.nn.Module):\n{body}\n")
    return classes, extra


def model_source(
    *,
    classes: Sequence[str],
    extra_globals: Mapping[str, Any],
    planned_devices: Sequence[str],
    forward: str,
) -> str:
    """The complete ``model.py``: header, imports, helpers, segment classes, top-level class."""
    count = len(planned_devices)
    placement = ", ".join(f"seg{i} on {device}" for i, device in enumerate(planned_devices))
    header = (
        "# Generated by autoplace (emit stage). Do not edit by hand: re-run autoplace instead.\n"
        f"# {count} device-contiguous segment{'s' if count != 1 else ''}, as planned: "
        f"{placement}.\n"
        "# Weights are in weights.safetensors and devices and pytree specs in meta.json; load\n"
        "# with autoplace.emit.load_model(directory, device_map=...). Imports torch and the\n"
        "# standard library only.\n"
    )
    imports = IMPORTS_SOURCE + "".join(
        f"from {module} import {qualname} as {name}\n"
        for name, (module, qualname) in sorted(_import_lines(extra_globals).items())
    )
    init = [
        f"    planned_devices = {tuple(planned_devices)!r}",
        "",
        "    def __init__(self, devices=planned_devices, *, in_spec=None, out_spec=None):",
        "        super().__init__()",
        *(f"        self.seg{i} = Segment{i}(devices[{i}])" for i in range(count)),
        "        self._in_spec = in_spec",
        "        self._out_spec = out_spec",
    ]
    forward_body = "\n".join(("    " + line) if line else "" for line in forward.splitlines())
    top = "\n".join(
        [
            f"class {MODEL_CLASS_NAME}(torch.nn.Module):",
            '    """Calls the segments in order; tensors cross devices only at the explicit',
            '    ``.to(...)`` / ``_move`` lines in forward."""',
            "",
            *init,
            "",
            forward_body,
        ]
    )
    parts = [header, imports, HELPERS_SOURCE, *classes, top + "\n"]
    return "\n\n\n".join(part.rstrip("\n") for part in parts) + "\n"


def compile_forward(source: str) -> Any:
    """Execute the preamble and a top-level ``forward`` source; return the function."""
    filename = f"<autoplace top-level forward {abs(hash(source)):x}>"
    # Registering the source lets tracebacks through the generated forward show its lines.
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: dict[str, Any] = {}
    exec(compile(IMPORTS_SOURCE + HELPERS_SOURCE, "<autoplace helpers>", "exec"), namespace)
    exec(compile(source, filename, "exec"), namespace)
    return namespace["forward"]


def fetch(module: torch.nn.Module, target: str) -> Any:
    value: Any = module
    for part in target.split("."):
        value = getattr(value, part)
    return value


def _extra_globals(globals_: Mapping[str, Any], *, where: str) -> dict[str, Any]:
    """The codegen globals the preamble does not bind; fails on any we cannot import."""
    extra: dict[str, Any] = {}
    for name, value in globals_.items():
        if name in _PROVIDED and (value is _PROVIDED[name] or name in ("inf", "nan")):
            continue
        if name in _PROVIDED_MODULES and getattr(value, "__name__", "") == _PROVIDED_MODULES[name]:
            continue
        if getattr(builtins, name, None) is value:
            continue
        _importable(name, value, where=where)
        extra[name] = value
    return extra


def _importable(name: str, value: Any, *, where: str) -> tuple[str, str]:
    """``(module, qualname)`` to import ``value`` from torch or the standard library."""
    module = getattr(value, "__module__", None) or ""
    qualname = getattr(value, "__qualname__", None) or ""
    root = module.split(".")[0]
    allowed = root == "torch" or root in sys.stdlib_module_names
    if allowed and qualname.isidentifier():
        try:
            if getattr(importlib.import_module(module), qualname) is value:
                return module, qualname
        except (ImportError, AttributeError):
            pass
    what = f"{module}.{qualname} (global {name!r})" if module and qualname else repr(value)
    source = getattr(getattr(value, "__code__", None), "co_filename", "")
    if module not in sys.modules and source:
        # A function of the user's model file: its module was loaded under an internal name.
        what = f"{qualname or name}() from {source}"
    raise EmitError(
        f"{where}: generated code needs {what}, "
        "which model.py cannot import: it may import only torch and the standard library; "
        "express that call with torch ops, or pass --no-emit to plan without the emitted model"
    )


def _import_lines(extra_globals: Mapping[str, Any]) -> dict[str, tuple[str, str]]:
    return {
        name: _importable(name, value, where="model.py") for name, value in extra_globals.items()
    }


def merge_globals(into: dict[str, Any], new: Mapping[str, Any]) -> None:
    for name, value in new.items():
        if name in into and into[name] is not value:
            raise EmitError(
                f"two segments need different objects under the global name {name!r}: "
                f"{into[name]!r} and {value!r}"
            )
        into[name] = value

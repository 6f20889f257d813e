"""Emit: the Python source of an emitted model, importing only torch, the stdlib and the engine.

``IMPORTS_SOURCE`` and ``RUNTIME_IMPORT`` (the engine, ``runtime.engine``, that ``save_model``
copies next to ``model.py`` as ``RUNTIME_FILE``) start every generated file; ``signature_source``
and ``forward_source`` write the top-level forward that calls the segments and moves values
between devices (``SegmentCall`` is one call); ``class_source`` writes one ``torch.nn.Module``
class per segment (its forward is torch.fx's own codegen); ``model_source`` assembles
``model.py``. ``compile_forward`` runs the same preamble (``runtime_namespace``), so the
in-memory model executes exactly the forward that ``save_model`` writes. This is the one module
of autoplace that calls ``exec``, and only on source it generated itself.
"""

from __future__ import annotations

import builtins
import importlib
import linecache
import math
import re
import sys
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.fx

from autoplace.emit.codegen.lower import fetch
from autoplace.emit.runtime import engine
from autoplace.errors import EmitError

__all__ = [
    "IMPORTS_SOURCE",
    "MODEL_CLASS_NAME",
    "RUNTIME_FILE",
    "RUNTIME_IMPORT",
    "RUNTIME_MODULE",
    "SegmentCall",
    "class_source",
    "compile_forward",
    "engine_source",
    "forward_source",
    "literal_source",
    "merge_globals",
    "model_source",
    "runtime_namespace",
    "signature_source",
]

MODEL_CLASS_NAME = "AutoplacedModel"

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

# The engine's names, as model.py imports them from the copy of ``runtime.engine`` saved next to
# it and as ``runtime_namespace`` binds them: each with a leading underscore, so that no value
# name of the graph (``move``, ``empty``) hides one.
RUNTIME_MODULE = "_runtime"
RUNTIME_FILE = f"{RUNTIME_MODULE}.py"
RUNTIME_NAMES = {f"_{name}": name for name in engine.__all__}
RUNTIME_IMPORT = f"from .{RUNTIME_MODULE} import (\n" + "".join(
    f"    {name} as {alias},\n" for alias, name in RUNTIME_NAMES.items()) + ")\n"


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
    (or from the caller) and are copied to this segment's device before the call. ``free_moved``
    names the values whose last use was such a copy (deleted before the call, so the source's
    memory goes before the segment allocates); ``free_after`` those whose last use is this call.
    """

    index: int
    planned_device: str
    moves: tuple[tuple[str, str, bool], ...]
    args: tuple[str, ...]
    outputs: tuple[str, ...]
    free_moved: tuple[str, ...] = ()
    free_after: tuple[str, ...] = ()


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
    """The top-level ``def forward(self, ...)``: bind inputs, call segments in order, return.

    Each value is deleted right after its last use (a copy or a segment call), so what is alive
    between calls is what the simulator's memory rule keeps (``autoplace.simulate``): a value
    lives until its last reader's segment returns. Inside a segment torch.fx's own codegen sets
    each value to ``None`` after its last use; a segment's inputs stay referenced by the call
    until it returns."""
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
        if call.free_moved:
            lines.append(f"    del {', '.join(call.free_moved)}")
        invoke = f"self.seg{call.index}({', '.join(call.args)})"
        if call.outputs:
            lines.append(f"    {', '.join(call.outputs)}, = {invoke}")
        else:
            lines.append(f"    {invoke}")
        if call.free_after:
            lines.append(f"    del {', '.join(call.free_after)}")
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
    threaded: str | None = None,
    runtime: str = "sequential",
) -> str:
    """The complete ``model.py``: header, imports (the engine's too), segment classes, top-level
    class.

    ``forward`` is the sequential forward's source and ``threaded`` the threaded runtime's, if
    any: both are kept (``forward_sequential``, ``forward_threaded``) and ``runtime`` says which
    one ``forward`` runs, so a loaded model can still run its segments in order on one thread
    (memory measurement needs that: ``check.memory``)."""
    count = len(planned_devices)
    placement = ", ".join(f"seg{i} on {device}" for i, device in enumerate(planned_devices))
    header = (
        "# Generated by autoplace (emit stage). Do not edit by hand: re-run autoplace instead.\n"
        f"# {count} device-contiguous segment{'s' if count != 1 else ''}, as planned: "
        f"{placement}.\n"
        "# Weights are in weights.safetensors and devices and pytree specs in meta.json; load\n"
        "# with autoplace.emit.load_model(directory, device_map=...). Imports torch, the standard\n"
        f"# library and {RUNTIME_FILE} (autoplace's runtime, saved next to this file) only.\n"
    )
    imports = IMPORTS_SOURCE + "".join(
        f"from {module} import {qualname} as {name}\n"
        for name, (module, qualname) in sorted(_import_lines(extra_globals).items())
    ) + "\n" + RUNTIME_IMPORT
    init = [
        f"    planned_devices = {tuple(planned_devices)!r}",
        f"    runtime = {runtime!r}  # or 'sequential': which forward runs when called",
        "",
        "    def __init__(self, devices=planned_devices, *, in_spec=None, out_spec=None):",
        "        super().__init__()",
        *(f"        self.seg{i} = Segment{i}(devices[{i}])" for i in range(count)),
        "        self._in_spec = in_spec",
        "        self._out_spec = out_spec",
    ]
    forwards = [forward.replace("def forward(", "def forward_sequential(", 1)]
    if threaded:
        forwards.append(threaded.replace("def forward(", "def forward_threaded(", 1))
    else:
        runtime = "sequential"
    dispatch = [
        "def forward(self, *args, **kwargs):",
        "    if self.runtime == 'threaded':",
        "        return self.forward_threaded(*args, **kwargs)",
        "    return self.forward_sequential(*args, **kwargs)",
    ]
    forward_body = "\n\n".join(
        "\n".join(("    " + line) if line else "" for line in source.splitlines())
        for source in (*forwards, "\n".join(dispatch)))
    top = "\n".join(
        [
            f"class {MODEL_CLASS_NAME}(torch.nn.Module):",
            '    """Calls the segments in order, or runs the schedule (``_run_program``: GPUs',
            '    launched from this thread, a worker thread per CPU device); tensors cross devices',
            '    only at ``.to(...)``, ``_move`` and ``_hand_over``."""',
            "",
            *init,
            "",
            forward_body,
        ]
    )
    parts = [header, imports, *classes, top + "\n"]
    return "\n\n\n".join(part.rstrip("\n") for part in parts) + "\n"


def runtime_namespace() -> dict[str, Any]:
    """The preamble every generated forward runs in, as a fresh namespace: its imports and the
    engine's names (``_move``, ``_run_program``, ...), bound as ``RUNTIME_IMPORT`` binds them."""
    namespace: dict[str, Any] = {}
    exec(compile(IMPORTS_SOURCE, "<autoplace imports>", "exec"), namespace)
    namespace.update({alias: getattr(engine, name) for alias, name in RUNTIME_NAMES.items()})
    return namespace


def engine_source() -> str:
    """The engine's source (``runtime/engine.py``), which ``save_model`` writes as
    ``RUNTIME_FILE`` next to ``model.py``."""
    return Path(engine.__file__).read_text()


def compile_forward(source: str) -> Any:
    """Execute the preamble and a top-level ``forward`` source; return the function."""
    filename = f"<autoplace top-level forward {abs(hash(source)):x}>"
    # Registering the source lets tracebacks through the generated forward show its lines.
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace = runtime_namespace()
    exec(compile(source, filename, "exec"), namespace)
    return namespace["forward"]


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


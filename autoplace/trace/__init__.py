"""Trace a model into the ``OpGraph`` IR: torch.export (non-strict) first, torch.fx as fallback.

Read ``trace_model`` first: it exports (or symbolically traces), then runs every op once more on
fake tensors under ``FlopCounterMode`` to count FLOPs and read shapes, and finally ``_build_graph``
turns the fx graph into plain IR nodes and edges. Parameters and buffers become bytes attributed
to the first op that reads them; ops that share a tensor (tied embeddings) form a colocation
group. Nothing here allocates real memory for activations, so models whose parameters live on the
meta device trace too.

The fx ``GraphModule`` is returned beside the IR only so that the emit stage can split it; no
other stage looks at it. Beside this module: ``load.py`` (the user's model file, run on its
example inputs), ``count.py`` (the counting pass) and ``modules.py`` (module granularity).
"""

from __future__ import annotations

import contextlib
import inspect
import io
import logging
import operator
import re
import warnings
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.fx

from autoplace.errors import TraceError
from autoplace.ir import Edge, OpGraph, OpNode
from autoplace.trace.count import (
    CountingInterpreter,
    count_ops,
    flat_inputs,
    nbytes,
    op_name,
    tensors,
    value_bytes,
)
from autoplace.trace.load import run_example
from autoplace.trace.repeat import KEPT, export_repeated, repeated_blocks
from autoplace.trace.writes import drop_dead_writes

__all__ = ["CACHE_NOTE", "SHAPE_ONLY_OPS", "VIEW_OPS", "TracedModel", "attr_of", "cache_off",
           "flat_inputs", "to_meta", "trace_model"]

# Ops that launch no kernel and move no bytes: views, metadata checks, and eval-mode dropout
# (a dropout in training draws a mask and scales: ``_launches_nothing``). They cost nothing on
# any device, and coarsening folds them into their producer.
SHAPE_ONLY_OPS = frozenset(
    {
        "view", "_unsafe_view", "reshape", "t", "transpose", "permute", "expand", "expand_as",
        "slice", "select", "unsqueeze", "squeeze", "alias", "detach", "getitem", "split",
        "split_with_sizes", "chunk", "unbind", "narrow", "as_strided", "flatten", "unflatten",
        "view_as", "_assert_tensor_metadata", "sym_size", "size", "dim", "dropout",
        "feature_dropout", "contiguous", "lift_fresh_copy", "_assert_scalar", "identity",
        "_guards_fn",
    }
)

# Ops whose output is always a view of their input, never a copy (``SHAPE_ONLY_OPS`` also
# holds ops that launch nothing yet may copy: ``reshape`` or ``flatten`` of a tensor they cannot
# view, ``contiguous``, ``lift_fresh_copy``; and ``getitem``, a copy when it indexes a tensor).
VIEW_OPS = frozenset({
    "view", "_unsafe_view", "view_as", "t", "transpose", "permute", "expand", "expand_as",
    "slice", "select", "narrow", "unsqueeze", "squeeze", "alias", "detach", "as_strided",
    "split", "split_with_sizes", "chunk", "unbind",
})


@dataclass(frozen=True)
class TracedModel:
    """The IR of a model, and the fx module it came from (for the emit stage only)."""

    graph: OpGraph
    module: torch.fx.GraphModule
    tracer: str
    notes: tuple[str, ...] = ()
    has_meta_params: bool = False


def _target_str(node: torch.fx.Node) -> str:
    if node.op == "call_module":
        return f"module:{node.target}"
    if node.op == "call_method":
        return f"method:{node.target}"
    target = node.target
    if target is operator.getitem:
        return "getitem"
    return str(target) if hasattr(target, "_schema") else getattr(target, "__name__", str(target))


def _module_path(node: torch.fx.Node) -> str:
    stack = node.meta.get("nn_module_stack")
    if stack:
        path = list(stack.values())[-1][0]
        return str(path).removeprefix("L['self'].").removeprefix("L__self__.")
    if node.op == "call_module":
        return str(node.target)
    return ""


class _TorchLogs(logging.Filter):
    """Drops every record of torch's loggers and counts those of warning level and above."""

    def __init__(self) -> None:
        super().__init__()
        self.said: list[logging.LogRecord] = []

    def filter(self, record: logging.LogRecord) -> bool:
        if record.name != "torch" and not record.name.startswith("torch."):
            return True
        if record.levelno >= logging.WARNING and all(r is not record for r in self.said):
            self.said.append(record)  # once, though every handler it passes asks
        return False

    def note(self) -> str | None:
        """The note that says torch had something to say, or ``None``."""
        if not self.said:
            return None
        first = (self.said[0].getMessage().strip().splitlines() or [""])[0][:200]
        return (f"torch logged {len(self.said)} warning(s) or error(s) while tracing, kept off "
                f"the terminal (first, from {self.said[0].name}: {first!r})")


@contextlib.contextmanager
def _quiet_torch(logs: _TorchLogs) -> Iterator[None]:
    """Keep torch's loggers (and what torch.export prints to stderr while it fails: the partial
    fx graph, a failed fake-tensor op's traceback) off the terminal while tracing: autoplace
    reports a failure itself, as a fallback note or a ``TraceError`` of one paragraph, and the
    dump would bury it. ``logs`` counts what was kept back, for a note. Every handler of torch's
    loggers and the root logger's filter torch's records meanwhile; nothing else is touched."""
    loggers = [logging.getLogger(), *(logging.getLogger(name) for name in list(
        logging.Logger.manager.loggerDict) if name == "torch" or name.startswith("torch."))]
    handlers = {id(h): h for logger in loggers for h in logger.handlers}
    handlers = [*handlers.values(), *([logging.lastResort] if logging.lastResort else [])]
    for handler in handlers:
        handler.addFilter(logs)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for handler in handlers:
            handler.removeFilter(logs)


@contextlib.contextmanager
def _no_stack_traces() -> Iterator[None]:
    """Trace without a Python stack trace per node: torch.export records one for every op (about
    a fifth of exporting an 80-layer Llama), and autoplace never reads them. Where this torch has
    no such switch (``torch.fx.config.do_not_emit_stack_traces``; older releases), nothing
    changes."""
    config = getattr(torch.fx, "config", None)
    if config is None or not hasattr(config, "do_not_emit_stack_traces"):
        yield
        return
    before = config.do_not_emit_stack_traces
    config.do_not_emit_stack_traces = True
    try:
        yield
    finally:
        config.do_not_emit_stack_traces = before


def _export(model: torch.nn.Module, args: tuple, kwargs: dict,
            notes: list[str] | None = None) -> torch.fx.GraphModule:
    """torch.export's graph of ``model``; where it repeats blocks, exported with three and
    the rest copied (``repeat.py``; with weights, checked on the example inputs), with a
    note."""
    def export() -> torch.fx.GraphModule:
        return torch.export.export(model, args, kwargs, strict=False).module()

    with _no_stack_traces():
        blocks = repeated_blocks(model)
        example = None if _has_meta_params(model) else (args, kwargs)
        if blocks is not None and (
                gm := export_repeated(model, blocks, export, example)) is not None:
            if notes is not None:
                notes.append(f"{blocks.path}'s {blocks.count} blocks exported as their first "
                             f"{KEPT}, the last copied for the other {blocks.count - KEPT} "
                             "(trace.repeat)")
            return gm
        return export()


def _dtype_of(values: Iterable[torch.Tensor]) -> str:
    floating = [t.dtype for t in values if t.dtype.is_floating_point]
    return str(floating[0]).removeprefix("torch.") if floating else "float32"


def _build_graph(
    gm: torch.fx.GraphModule, interp: CountingInterpreter, *, name: str
) -> OpGraph:
    nodes: list[OpNode] = []
    edges: list[Edge] = []
    kept: set[str] = set()
    tensor_owner: dict[int, str] = {}
    tensor_users: dict[int, list[str]] = {}
    outputs: list[str] = []
    for n in gm.graph.nodes:
        if n.op == "get_attr":
            continue
        if n.op == "output":
            outputs = [i.name for i in n.all_input_nodes if i.name in kept]
            continue
        outs = tensors(interp.values.get(n.name))
        if n.op == "placeholder":
            nodes.append(_input_node(n, outs))
        else:
            param_bytes, trainable = _claim_state(n, _state_tensors(gm, n), tensor_owner,
                                                  tensor_users)
            nodes.append(replace(_op_node(n, interp, outs, kept=kept, param_bytes=param_bytes),
                                 trainable_bytes=trainable))
            edges += _in_edges(n, interp, kept=kept, out_bytes=sum(nbytes(t) for t in outs))
        kept.add(n.name)

    colocate = tuple(
        tuple(dict.fromkeys(users)) for users in tensor_users.values()
        if len(set(users)) > 1
    )
    return OpGraph(nodes=tuple(nodes), edges=tuple(edges), colocate=colocate,
                   outputs=tuple(outputs), name=name)


def _state_tensors(gm: torch.fx.GraphModule, n: torch.fx.Node) -> list[tuple[int, torch.Tensor]]:
    """Parameters and buffers an op reads, keyed by identity (tied weights share a key)."""
    found = []
    for inp in n.all_input_nodes:
        if inp.op == "get_attr":
            obj = gm
            for part in str(inp.target).split("."):
                obj = getattr(obj, part)
            if isinstance(obj, torch.Tensor):
                found.append((id(obj), obj))
    if n.op == "call_module":
        sub = gm.get_submodule(str(n.target))
        found += [(id(t), t) for t in sub.parameters()]
        found += [(id(t), t) for t in sub.buffers()]
    return found


def _claim_state(
    n: torch.fx.Node,
    state: list[tuple[int, torch.Tensor]],
    tensor_owner: dict[int, str],
    tensor_users: dict[int, list[str]],
) -> tuple[int, int]:
    """Record ``n`` as a user of each state tensor; the bytes of those it reads first, and of
    those the parameters that need a gradient."""
    param_bytes = trainable = 0
    for key, tensor in state:
        tensor_users.setdefault(key, []).append(n.name)
        if key not in tensor_owner:
            tensor_owner[key] = n.name
            param_bytes += nbytes(tensor)
            if isinstance(tensor, torch.nn.Parameter) and tensor.requires_grad:
                trainable += nbytes(tensor)
    return param_bytes, trainable


def _input_node(n: torch.fx.Node, outs: list[torch.Tensor]) -> OpNode:
    return OpNode(name=n.name, targets=("input",), is_input=True,
                  output_shapes=tuple(tuple(t.shape) for t in outs),
                  output_dtypes=tuple(str(t.dtype).removeprefix("torch.") for t in outs),
                  output_bytes=sum(nbytes(t) for t in outs))


def _op_node(
    n: torch.fx.Node,
    interp: CountingInterpreter,
    outs: list[torch.Tensor],
    *,
    kept: set[str],
    param_bytes: int,
) -> OpNode:
    out_bytes = sum(nbytes(t) for t in outs)
    # A view of parameters and buffers only (an expert weight transposed for a matmul) holds
    # resident storage: it allocates nothing, though a copy of it to another device moves it all.
    state_view = (n.op != "call_module" and op_name(n.target) in VIEW_OPS
                  and bool(n.all_input_nodes)
                  and all(inp.op == "get_attr" for inp in n.all_input_nodes))
    in_tensors: list[torch.Tensor] = []
    for inp in n.all_input_nodes:
        if inp.name in kept:
            in_tensors += tensors(interp.values.get(inp.name))
    if _launches_nothing(n):
        accessed, launches = 0, 0
    else:
        accessed = out_bytes + param_bytes + sum(nbytes(t) for t in in_tensors)
        launches = 1
    return OpNode(
        name=n.name,
        targets=(_target_str(n),),
        module=_module_path(n),
        output_shapes=tuple(tuple(t.shape) for t in outs),
        output_dtypes=tuple(str(t.dtype).removeprefix("torch.") for t in outs),
        output_bytes=out_bytes,
        view_bytes=out_bytes if state_view else 0,
        param_bytes=param_bytes,
        workspace_bytes=interp.transient_bytes.get(n.name, 0),
        flops=float(interp.flops.get(n.name, 0)),
        bytes_accessed=accessed,
        launches=launches,
        dtype=_dtype_of(in_tensors + outs),
    )


_DROPOUTS = frozenset({"dropout", "feature_dropout"})


def _launches_nothing(n: torch.fx.Node) -> bool:
    """Whether ``n`` is one of ``SHAPE_ONLY_OPS``, a dropout only where it does not drop: in
    ``eval()`` (its ``train`` flag off) or of probability 0. In ``train()`` (a training plan's
    ``--layers train``) a dropout draws a random mask, and multiplies and scales its input by
    it: an op like any other (``aten.dropout(x, p, train)``; ``F.dropout(x, p, training)``
    from torch.fx)."""
    name = op_name(n.target)
    if name not in _DROPOUTS:
        return name in SHAPE_ONLY_OPS
    p = n.kwargs.get("p", n.args[1] if len(n.args) > 1 else 0.5)
    train = n.kwargs.get("train", n.kwargs.get("training",
                                               n.args[2] if len(n.args) > 2 else True))
    return not (train is True and isinstance(p, (int, float)) and p > 0)


def _in_edges(
    n: torch.fx.Node, interp: CountingInterpreter, *, kept: set[str], out_bytes: int
) -> list[Edge]:
    """An edge from each kept input of ``n``, carrying that input's bytes (a ``getitem`` carries
    only the item it takes)."""
    edges = []
    for inp in dict.fromkeys(n.all_input_nodes):
        if inp.name in kept:
            size = out_bytes if op_name(n.target) == "getitem" else value_bytes(
                interp.values.get(inp.name))
            edges.append(Edge(src=inp.name, dst=n.name, bytes=size))
    return edges


def _has_meta_params(model: torch.nn.Module) -> bool:
    return any(t.is_meta for t in list(model.parameters()) + list(model.buffers()))


def attr_of(gm: torch.fx.GraphModule, target: str) -> Any:
    """What a ``get_attr`` node of ``gm`` reads: the attribute at the dotted path ``target``."""
    obj: Any = gm
    for part in target.split("."):
        obj = getattr(obj, part)
    return obj


def to_meta(value: Any) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to("meta")
    if isinstance(value, (list, tuple)):
        return type(value)(to_meta(v) for v in value)
    if isinstance(value, dict):
        return {k: to_meta(v) for k, v in value.items()}
    return value


# transformers' key-value caches: a ``DynamicCache`` (and its kin) in a model's output is a type
# torch.export cannot flatten, and one forward pass does not need it.
CACHE_NOTE = ("transformers model: planned with use_cache=False ({where}.config.use_cache set "
              "off): the plan covers one forward pass without the key-value cache, and the "
              "emitted model returns no past_key_values; generation reusing a cache is not "
              "planned")


def cache_off(model: torch.nn.Module, kwargs: dict[str, Any]) -> str | None:
    """Switch off a transformers model's key-value cache (``config.use_cache``, on by default)
    unless the inputs choose ``use_cache`` themselves; the note that says so, or ``None``. The
    model keeps the setting, so the original and the emitted model are compared on the same
    forward pass."""
    if "use_cache" in kwargs or getattr(model, "keeps_cache", False):  # trace.generate's
        return None
    for path, module in model.named_modules():
        config = getattr(module, "config", None)
        if getattr(config, "use_cache", None) is True and "use_cache" in inspect.signature(
                module.forward).parameters:
            config.use_cache = False
            return CACHE_NOTE.format(where=f"model.{path}" if path else "model")
    return None


# The exception names and texts that mean the forward branches on a tensor's value.
_DATA_DEPENDENT = re.compile(r"data.dependent|GuardOnDataDependent|control flow", re.IGNORECASE)
_UNKNOWN_TYPE = re.compile(r"Found <class '([\w.]+)'> in (output|input)")


def _advice(export_exc: BaseException, fx_exc: BaseException) -> str:
    """What to do when both tracers failed, from export's reason: control-flow advice only for
    a branch on a tensor's value; for a type export cannot flatten, that type."""
    found = _UNKNOWN_TYPE.search(str(export_exc))
    if found:
        kind, where = found.group(1), found.group(2)
        fix = ("pass use_cache=False in the example inputs (or set model.config.use_cache = "
               "False)" if "Cache" in kind else
               "return tensors, tuples, lists or dicts of them, or register the type with "
               "torch.utils._pytree.register_pytree_node")
        return (f"The model's {where} holds a {kind.rsplit('.', 1)[-1]} ({kind}), which "
                f"torch.export cannot flatten: {fix}")
    if any(_DATA_DEPENDENT.search(f"{type(e).__name__} {e}") for e in (export_exc, fx_exc)):
        return ("Make the model traceable: avoid Python control flow on tensor values in "
                "forward (use torch.cond or torch.where), or plan a submodule that traces")
    return ("Fix what torch.export reports (torch.export.export(model, args, kwargs, "
            "strict=False) shows its whole message), or plan a submodule that traces")


def trace_model(
    model: torch.nn.Module,
    args: tuple = (),
    kwargs: dict | None = None,
    *,
    name: str = "model",
    checked: bool = False,
) -> TracedModel:
    """Trace ``model`` on the example inputs into an ``OpGraph``.

    The model is traced as it is (call ``model.eval()`` first for inference). It is first run
    once on the inputs (``load.run_example``) unless ``checked``: the caller has run it on them
    already. When its parameters are on the meta device the example inputs are moved there too,
    so that nothing is allocated.
    """
    kwargs = dict(kwargs or {})
    notes: list[str] = [n for n in [cache_off(model, kwargs)] if n]
    meta = _has_meta_params(model)
    if meta:
        args, kwargs = to_meta(args), to_meta(kwargs)
        notes.append("parameters are on the meta device: traced and costed without weights")
    elif not checked:
        run_example(model, args, kwargs)  # a bug of the model's own is named as such, first
    device = "meta" if meta else "cpu"
    logs = _TorchLogs()
    with _quiet_torch(logs):
        gm, tracer = _trace(model, args, kwargs, notes)
        drop_dead_writes(gm)  # ordered by nothing once placed (``writes.py``)
        try:
            interp = count_ops(gm, args, kwargs, device=device)
        except Exception as exc:
            raise TraceError(
                f"the model traced with {tracer}, but running its graph on fake tensors to "
                f"count FLOPs and shapes failed: {type(exc).__name__}: "
                f"{(str(exc).strip().splitlines() or [''])[0][:300]}. Every op "
                "must run without reading tensor values (no .item(), .tolist() or Python "
                "branches on values, also inside functions wrapped with torch.fx.wrap)"
            ) from exc
    notes += [n for n in [logs.note()] if n]
    graph = _build_graph(gm, interp, name=name)
    return TracedModel(graph=graph, module=gm, tracer=tracer, notes=tuple(notes),
                       has_meta_params=meta)


def _trace(model: torch.nn.Module, args: tuple, kwargs: dict, notes: list[str]
           ) -> tuple[torch.fx.GraphModule, str]:
    """The graph and the tracer that made it: torch.export, else torch.fx (with a note)."""
    try:
        return _export(model, args, kwargs, notes), "export"
    except Exception as export_exc:  # export raises many types; all mean "fall back"
        reason = f"{type(export_exc).__name__}: {str(export_exc).strip().splitlines()[0][:300]}"
        try:
            gm = torch.fx.symbolic_trace(model)
        except Exception as fx_exc:
            raise TraceError(
                f"torch.export failed ({reason}) and torch.fx.symbolic_trace failed too "
                f"({type(fx_exc).__name__}: {str(fx_exc).strip().splitlines()[0][:300]}). "
                + _advice(export_exc, fx_exc)
            ) from fx_exc
        notes.append(f"torch.export failed, fell back to torch.fx.symbolic_trace: {reason}")
        return gm, "fx"

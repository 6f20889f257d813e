"""Trace a model into the ``OpGraph`` IR: torch.export (non-strict) first, torch.fx as fallback.

Read ``trace_model`` first: it exports (or symbolically traces), then runs every op once more on
fake tensors under ``FlopCounterMode`` to count FLOPs and read shapes, and finally ``_build_graph``
turns the fx graph into plain IR nodes and edges. Parameters and buffers become bytes attributed
to the first op that reads them; ops that share a tensor (tied embeddings) form a colocation
group. Nothing here allocates real memory for activations, so models whose parameters live on the
meta device trace too.

The fx ``GraphModule`` is returned beside the IR only so that the emit stage can split it; no
other stage looks at it.
"""

from __future__ import annotations

import contextlib
import inspect
import io
import logging
import math
import operator
import re
import warnings
import weakref
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, replace
from typing import Any

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from autoplace.coarsen import VIEW_OPS
from autoplace.errors import TraceError
from autoplace.ir import Edge, OpGraph, OpNode
from cost_models.calibration import POOLING_OPS

__all__ = ["CACHE_NOTE", "SHAPE_ONLY_OPS", "TracedModel", "cache_off", "flat_inputs", "to_meta",
           "trace_model"]

# Ops that launch no kernel and move no bytes: views, metadata checks, and eval-mode dropout.
# They cost nothing on any device, and coarsening folds them into their producer.
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


@dataclass(frozen=True)
class TracedModel:
    """The IR of a model, and the fx module it came from (for the emit stage only)."""

    graph: OpGraph
    module: torch.fx.GraphModule
    tracer: str
    notes: tuple[str, ...] = ()
    has_meta_params: bool = False


def _op_name(target: Any) -> str:
    """``aten.view.default`` -> ``view``; ``operator.getitem`` -> ``getitem``."""
    if isinstance(target, str):
        return target
    if target is operator.getitem:
        return "getitem"
    name = getattr(target, "__name__", str(target))
    if hasattr(target, "_schema"):
        name = target._schema.name.split("::")[-1]
    return name


def _target_str(node: torch.fx.Node) -> str:
    if node.op == "call_module":
        return f"module:{node.target}"
    if node.op == "call_method":
        return f"method:{node.target}"
    target = node.target
    if target is operator.getitem:
        return "getitem"
    return str(target) if hasattr(target, "_schema") else getattr(target, "__name__", str(target))


def _tensors(value: Any) -> list[torch.Tensor]:
    """The tensors in a (possibly nested) op result."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in _tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in _tensors(v)]
    return []


def _nbytes(t: torch.Tensor) -> int:
    return int(t.numel()) * t.element_size()


def _module_path(node: torch.fx.Node) -> str:
    stack = node.meta.get("nn_module_stack")
    if stack:
        path = list(stack.values())[-1][0]
        return str(path).removeprefix("L['self'].").removeprefix("L__self__.")
    if node.op == "call_module":
        return str(node.target)
    return ""


# Loggers that narrate a failed export at length (the partial graph, the guard that failed).
_EXPORT_LOGGERS = ("torch.export", "torch._export", "torch.fx.experimental.symbolic_shapes")


@contextlib.contextmanager
def _quiet_export() -> Iterator[None]:
    """Silence what torch.export writes to stderr while it fails (it prints the partial fx graph
    and logs warnings): autoplace reports the failure itself, as a fallback note or a
    ``TraceError`` of one paragraph, and the dump would bury it."""
    loggers = [logging.getLogger(name) for name in _EXPORT_LOGGERS]
    levels = [logger.level for logger in loggers]
    for logger in loggers:
        logger.setLevel(logging.CRITICAL)
    try:
        with warnings.catch_warnings(), contextlib.redirect_stderr(io.StringIO()):
            warnings.simplefilter("ignore")
            yield
    finally:
        for logger, level in zip(loggers, levels):
            logger.setLevel(level)


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


def _export(model: torch.nn.Module, args: tuple, kwargs: dict) -> torch.fx.GraphModule:
    with _quiet_export(), _no_stack_traces():
        exported = torch.export.export(model, args, kwargs, strict=False)
        return exported.module()


def _fake_like(t: torch.Tensor, device: str) -> torch.Tensor:
    """A tensor of the same shape and dtype; inside FakeTensorMode this allocates nothing."""
    return torch.empty_strided(tuple(t.shape), tuple(t.stride()), dtype=t.dtype, device=device)


class _Transient(TorchDispatchMode):
    """The most bytes the tensors one op makes hold at once, its result's included: an op that
    ATen decomposes (``max_pool2d`` into ``max_pool2d_with_indices``, whose int64 indices it
    drops) holds more than its output while it runs. Works on fake tensors: no memory is used."""

    # A higher-order op (``torch.cond``) reaches ``__torch_dispatch__`` whole: its result is
    # counted, and its branches' ops run with this mode off.
    supports_higher_order_operators = True

    def __init__(self) -> None:
        super().__init__()
        self.made: list[tuple[weakref.ref[torch.Tensor], int, int]] = []
        self.peak_bytes = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        out = func(*args, **(kwargs or {}))
        made = {key for _, key, _ in self.made}
        # A view of the op's own input holds no new memory.
        given = {t.untyped_storage()._cdata for t in _tensors((args, kwargs))} - made
        for t in _tensors(out):
            storage = t.untyped_storage()
            if storage._cdata not in given:
                self.made.append((weakref.ref(t), storage._cdata, storage.nbytes()))
        alive = {key: nbytes for ref, key, nbytes in self.made if ref() is not None}
        self.peak_bytes = max(self.peak_bytes, sum(alive.values()))
        return out


class _CountingInterpreter(torch.fx.Interpreter):
    """Runs each node on fake tensors under FlopCounterMode, recording FLOPs and results, and
    what each op holds beyond its output while it runs (``_Transient``)."""

    def __init__(self, module: torch.fx.GraphModule, fake_mode: FakeTensorMode, device: str):
        super().__init__(module, garbage_collect_values=False)
        self.fake_mode = fake_mode
        self.device = device
        self.flops: dict[str, int] = {}
        self.values: dict[str, Any] = {}
        self.failed: list[str] = []
        self.transient_bytes: dict[str, int] = {}
        # (FLOPs, transient bytes) by ``_signature``: a model's repeated layers count once.
        self.seen: dict[tuple, tuple[int, int]] = {}

    def get_attr(self, target, args, kwargs):  # noqa: ANN001 - fx signature
        value = super().get_attr(target, args, kwargs)
        if isinstance(value, torch.Tensor):
            return _fake_like(value, self.device)
        return value

    def run_node(self, n: torch.fx.Node) -> Any:
        if n.op in ("placeholder", "output", "get_attr"):
            result = super().run_node(n)
        elif (key := self._signature(n)) is not None and key in self.seen:
            result = super().run_node(n)
            self.flops[n.name], self.transient_bytes[n.name] = self.seen[key]
        else:
            counter, transient = FlopCounterMode(display=False), _Transient()
            with counter, transient:
                result = super().run_node(n)
            self.flops[n.name] = int(counter.get_total_flops()) or self._window_reads(n, result)
            output_bytes = sum(_nbytes(t) for t in _tensors(result))
            self.transient_bytes[n.name] = max(0, transient.peak_bytes - output_bytes,
                                               self._branch_bytes(n))
            if key is not None:
                self.seen[key] = self.flops[n.name], self.transient_bytes[n.name]
        self.values[n.name] = result
        return result

    def _signature(self, n: torch.fx.Node) -> tuple | None:
        """What a function's FLOPs and transient bytes depend on: the function and its
        arguments, each tensor by shape, strides, offset, dtype, device and which of the
        arguments share its storage (a view of an input holds nothing new). ``None`` (counted
        afresh) for modules, whose weights are not arguments, and for arguments that are not
        plain values (a branch of ``torch.cond``, a symbolic size)."""
        if n.op not in ("call_function", "call_method"):
            return None
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        storages: dict[int, int] = {}
        try:
            return (n.op, n.target, _plain(args, storages), _plain(kwargs, storages))
        except TypeError:
            return None

    def _branch_bytes(self, n: torch.fx.Node) -> int:
        """A higher-order op's (``torch.cond``) bound on what its branch holds while it runs:
        every value one branch computes, alive at once (the larger branch). ``_Transient`` sees
        the op whole, not the ops inside it."""
        if n.op != "call_function" or not isinstance(n.target, torch._ops.HigherOrderOperator):
            return 0
        largest = 0
        for arg in n.args:
            if isinstance(arg, torch.fx.Node) and arg.op == "get_attr":
                branch = getattr(self.module, str(arg.target), None)
                if isinstance(branch, torch.fx.GraphModule):
                    largest = max(largest, sum(
                        _nbytes(t) for node in branch.graph.nodes
                        if node.op == "call_function"
                        for t in _tensors(node.meta.get("val"))))
        return largest


    def _window_reads(self, n: torch.fx.Node, result: Any) -> int:
        """A pooling op's FLOPs, which the FLOP counter leaves at zero: each output element
        reads a window of inputs (the kernel; for adaptive pools, the input over the output).
        Pooling is ``POOLING_OPS`` (as an aten op, a function, or its ``nn`` module under the
        fx fallback); a kernel that is not plain integers counts nothing."""
        if n.op == "call_module":
            module = self.module.get_submodule(str(n.target))
            name = re.sub(r"(?<!^)(?=[A-Z])", "_", type(module).__name__).lower()
            kernel = getattr(module, "kernel_size", None)
        elif n.op == "call_function":
            name = _op_name(n.target)
            kernel = n.args[1] if len(n.args) > 1 else n.kwargs.get("kernel_size")
        else:
            return 0
        if name not in POOLING_OPS or not (outputs := _tensors(result)):
            return 0
        out = outputs[0]
        if name.lstrip("_").startswith("adaptive"):
            first = n.all_input_nodes[0].name if n.all_input_nodes else None
            inputs = _tensors(self.values.get(first)) if first else []
            return int(inputs[0].numel()) if inputs else int(out.numel())
        window = _kernel(kernel, int(re.search(r"pool(\d)d", name).group(1)))
        return int(out.numel()) * math.prod(window) if window else 0


_PLAIN = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout,
          torch.memory_format)


def _plain(value: Any, storages: dict[int, int]) -> Any:
    """``value`` as a hashable key for ``_CountingInterpreter._signature``; ``TypeError`` for
    anything else. ``storages`` numbers the storages met so far, in order."""
    if isinstance(value, torch.Tensor):
        shape, strides = tuple(value.shape), tuple(value.stride())
        if not all(type(d) is int for d in (*shape, *strides)):
            raise TypeError("symbolic size")
        storage = storages.setdefault(value.untyped_storage()._cdata, len(storages))
        return ("tensor", shape, strides, value.storage_offset(), value.dtype, value.device,
                storage)
    if isinstance(value, (list, tuple)):
        return (type(value).__name__, tuple(_plain(v, storages) for v in value))
    if isinstance(value, dict):
        return ("dict", tuple((k, _plain(v, storages)) for k, v in value.items()))
    if isinstance(value, _PLAIN):
        return value
    raise TypeError(f"not a plain value: {type(value).__name__}")


def _kernel(value: Any, spatial: int) -> list[int] | None:
    """A pooling kernel as one size per spatial dimension (an int, or a list of one, stands for
    all of them); ``None`` when it is not plain integers."""
    if isinstance(value, int):
        sizes = [value]
    elif isinstance(value, (list, tuple)):
        sizes = list(value)
    else:
        return None
    if not sizes or not all(isinstance(k, int) and not isinstance(k, bool) for k in sizes):
        return None
    if len(sizes) == 1:
        return sizes * spatial
    return sizes if len(sizes) == spatial else None


def flat_inputs(gm: torch.fx.GraphModule, args: tuple, kwargs: dict) -> list[Any]:
    """The example inputs in the order of ``gm``'s placeholders."""
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    flat = list(args) + [kwargs[k] for k in kwargs]
    in_spec = getattr(gm, "_in_spec", None)
    if in_spec is not None:
        import torch.fx._pytree as fx_pytree

        flat = fx_pytree.tree_flatten_spec((args, kwargs), in_spec)
    elif kwargs:
        # symbolic_trace placeholders follow forward's signature: match kwargs by name.
        by_name = {**{p.target: a for p, a in zip(placeholders, args)}, **kwargs}
        flat = [by_name.get(p.target) for p in placeholders]
    return list(flat)


def _count(
    gm: torch.fx.GraphModule, args: tuple, kwargs: dict, *, device: str
) -> _CountingInterpreter:
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    interp = _CountingInterpreter(gm, fake_mode, device)
    with fake_mode:
        fake_inputs = [_fake_like(x, device) if isinstance(x, torch.Tensor) else x
                       for x in flat_inputs(gm, args, kwargs)]
        interp.run(*fake_inputs)
    return interp


def _dtype_of(tensors: Iterable[torch.Tensor]) -> str:
    floating = [t.dtype for t in tensors if t.dtype.is_floating_point]
    return str(floating[0]).removeprefix("torch.") if floating else "float32"


def _build_graph(
    gm: torch.fx.GraphModule, interp: _CountingInterpreter, *, name: str
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
        outs = _tensors(interp.values.get(n.name))
        if n.op == "placeholder":
            nodes.append(_input_node(n, outs))
        else:
            param_bytes, trainable = _claim_state(n, _state_tensors(gm, n), tensor_owner,
                                                  tensor_users)
            nodes.append(replace(_op_node(n, interp, outs, kept=kept, param_bytes=param_bytes),
                                 trainable_bytes=trainable))
            edges += _in_edges(n, interp, kept=kept, out_bytes=sum(_nbytes(t) for t in outs))
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
            param_bytes += _nbytes(tensor)
            if isinstance(tensor, torch.nn.Parameter) and tensor.requires_grad:
                trainable += _nbytes(tensor)
    return param_bytes, trainable


def _input_node(n: torch.fx.Node, outs: list[torch.Tensor]) -> OpNode:
    return OpNode(name=n.name, targets=("input",), is_input=True,
                  output_shapes=tuple(tuple(t.shape) for t in outs),
                  output_dtypes=tuple(str(t.dtype).removeprefix("torch.") for t in outs),
                  output_bytes=sum(_nbytes(t) for t in outs))


def _op_node(
    n: torch.fx.Node,
    interp: _CountingInterpreter,
    outs: list[torch.Tensor],
    *,
    kept: set[str],
    param_bytes: int,
) -> OpNode:
    out_bytes = sum(_nbytes(t) for t in outs)
    # A view of parameters and buffers only (an expert weight transposed for a matmul) holds
    # resident storage: it allocates nothing, though a copy of it to another device moves it all.
    state_view = (n.op != "call_module" and _op_name(n.target) in VIEW_OPS
                  and bool(n.all_input_nodes)
                  and all(inp.op == "get_attr" for inp in n.all_input_nodes))
    in_tensors: list[torch.Tensor] = []
    for inp in n.all_input_nodes:
        if inp.name in kept:
            in_tensors += _tensors(interp.values.get(inp.name))
    shape_only = _op_name(n.target) in SHAPE_ONLY_OPS
    if shape_only:
        accessed, launches = 0, 0
    else:
        accessed = out_bytes + param_bytes + sum(_nbytes(t) for t in in_tensors)
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


def _in_edges(
    n: torch.fx.Node, interp: _CountingInterpreter, *, kept: set[str], out_bytes: int
) -> list[Edge]:
    """An edge from each kept input of ``n``, carrying that input's bytes (a ``getitem`` carries
    only the item it takes)."""
    edges = []
    for inp in dict.fromkeys(n.all_input_nodes):
        if inp.name in kept:
            nbytes = out_bytes if _op_name(n.target) == "getitem" else sum(
                _nbytes(t) for t in _tensors(interp.values.get(inp.name)))
            edges.append(Edge(src=inp.name, dst=n.name, bytes=nbytes))
    return edges


def _has_meta_params(model: torch.nn.Module) -> bool:
    return any(t.is_meta for t in list(model.parameters()) + list(model.buffers()))


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
    if "use_cache" in kwargs:
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
) -> TracedModel:
    """Trace ``model`` on the example inputs into an ``OpGraph``.

    The model is traced as it is (call ``model.eval()`` first for inference). When its
    parameters are on the meta device the example inputs are moved there too, so that nothing is
    allocated.
    """
    kwargs = dict(kwargs or {})
    notes: list[str] = [n for n in [cache_off(model, kwargs)] if n]
    meta = _has_meta_params(model)
    if meta:
        args, kwargs = to_meta(args), to_meta(kwargs)
        notes.append("parameters are on the meta device: traced and costed without weights")
    device = "meta" if meta else "cpu"

    try:
        gm = _export(model, args, kwargs)
        tracer = "export"
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
        tracer = "fx"
        notes.append(f"torch.export failed, fell back to torch.fx.symbolic_trace: {reason}")

    try:
        interp = _count(gm, args, kwargs, device=device)
    except Exception as exc:
        raise TraceError(
            f"the model traced with {tracer}, but running its graph on fake tensors to count "
            f"FLOPs and shapes failed: {type(exc).__name__}: "
            f"{(str(exc).strip().splitlines() or [''])[0][:300]}. Every op "
            "must run without reading tensor values (no .item(), .tolist() or Python branches "
            "on values, also inside functions wrapped with torch.fx.wrap)"
        ) from exc
    graph = _build_graph(gm, interp, name=name)
    return TracedModel(graph=graph, module=gm, tracer=tracer, notes=tuple(notes),
                       has_meta_params=meta)

"""Trace a model at module granularity: one ``OpNode`` per placeable module, for a Hugging Face
``device_map`` (``--granularity module``; ``docs/architecture.md``, "Stage 1, trace").

A node is a *unit*, a module kept whole: an instance of a no-split class
(``model._no_split_modules`` by default), a module without children, or one owning parameters or
buffers beside its children (kept whole: a simplification, where accelerate may name its own
tensors one by one), found by walking the module tree from the root to the first unit on every
path. The model runs once, eagerly (torch.export takes seconds for GPT-2), under ``torch.no_grad``
with hooks on every unit and a ``TorchDispatchMode`` that tags each tensor an aten op makes with
its source: the unit running, or outside any unit (a parent's glue) its inputs' sources. A unit's
in-edges are its inputs' sources and bytes; its FLOPs ``torch.utils.flop_counter``'s formulas; its
workspace the most bytes its ops held alive beyond what it held at entry (``weakref``). Glue costs
nothing (accelerate runs it where its inputs are); units sharing a tensor (GPT-2's ``wte``,
``lm_head``) are colocated. Read ``units``, ``module_units`` (the tree alone: bytes, tied groups,
enough to refuse a unit no device holds before anything runs), then ``trace_modules``.
"""

from __future__ import annotations

import contextlib
import weakref
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten
from torch.utils.flop_counter import flop_registry

from autoplace.errors import ModelLoadError, TraceError
from autoplace.ir import Edge, OpGraph, OpNode
from autoplace.trace import to_meta
from autoplace.trace.count import attention_flops, nbytes
from autoplace.trace.load import describe_failure

__all__ = ["INPUT", "ModuleTrace", "Unit", "Units", "module_units", "trace_modules", "units"]

INPUT = "input"  # the node of the model's inputs
_TAG = "_autoplace_sources"  # attribute each tensor's sources ride on


@dataclass(frozen=True)
class Unit:
    """A module the device_map places whole: its first name (the node's name), every name it
    goes by (a module reachable twice, as T5's shared embedding is), and its class."""

    name: str
    aliases: tuple[str, ...]
    cls: str


def _owns_tensors(module: torch.nn.Module) -> bool:
    return any(True for _ in module.named_parameters(recurse=False)) or any(
        True for _ in module.named_buffers(recurse=False))


def units(model: torch.nn.Module, no_split: frozenset[str]) -> dict[int, Unit]:
    """The units of ``model`` by ``id`` of their module, in tree order: a module is a unit when
    its class is in ``no_split``, it has no children, or it owns tensors itself."""
    aliases: dict[int, list[str]] = {}
    found: dict[int, torch.nn.Module] = {}

    def walk(module: torch.nn.Module, prefix: str) -> None:
        if id(module) in found:  # reached again under another name
            aliases[id(module)].append(prefix)
            return
        children = list(module.named_children())
        if (type(module).__name__ in no_split or not children or _owns_tensors(module)):
            found[id(module)] = module
            aliases[id(module)] = [prefix]
            return
        for name, child in children:
            walk(child, f"{prefix}.{name}" if prefix else name)

    walk(model, "")
    return {key: Unit(name=names[0], aliases=tuple(names), cls=type(found[key]).__name__)
            for key, names in aliases.items()}


@dataclass
class _Record:
    """What the run saw of one unit."""

    flops: float = 0.0
    launches: int = 0
    output_bytes: int = 0
    input_bytes: int = 0
    workspace_bytes: int = 0
    shapes: list[tuple[int, ...]] = field(default_factory=list)
    dtypes: list[str] = field(default_factory=list)
    reads: dict[str, int] = field(default_factory=dict)  # source -> bytes read


def _tensors(value: Any) -> list[torch.Tensor]:
    """The tensors in a module's arguments or result, through any container torch's pytree
    knows (``count.tensors`` walks lists, tuples and dicts only)."""
    return [v for v in tree_flatten(value)[0] if isinstance(v, torch.Tensor)]


def _storage(t: torch.Tensor) -> int:
    return t.untyped_storage()._cdata


def _sources(t: torch.Tensor) -> frozenset[str]:
    return getattr(t, _TAG, frozenset())


def _flops(func: Any, args: tuple, kwargs: dict, out: Any) -> float:
    """``func``'s FLOPs by ``torch.utils.flop_counter``'s formulas, and the CPU's fused
    attention kernel's, which is not in its registry (``count.attention_flops``)."""
    packet = func._overloadpacket
    if packet in flop_registry:
        return float(flop_registry[packet](*args, **kwargs, out_val=out))
    return attention_flops(str(packet), args)


class _Watch(TorchDispatchMode):
    """Tags every op's outputs with their sources, counts FLOPs and live bytes."""

    def __init__(self) -> None:
        super().__init__()
        self.current: str | None = None
        self.record: _Record | None = None
        self.live_bytes = 0
        self.peak_bytes = 0

    def _freed(self, size: int) -> None:
        self.live_bytes -= size

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        kwargs = kwargs or {}
        out = func(*args, **kwargs)
        if self.current is not None:
            sources = frozenset((self.current,))
            self.record.flops += _flops(func, args, kwargs, out)
            self.record.launches += 1
        else:
            sources = frozenset().union(*(_sources(t) for t in _tensors((args, kwargs))))
        # A view or an in-place op's result holds no new storage: ``_base`` is not set yet
        # down here, so storages are compared instead.
        held = set() if self.current is None or func.is_view else {
            _storage(t) for t in _tensors((args, kwargs))}
        for t in _tensors(out):
            with contextlib.suppress(AttributeError, RuntimeError):
                setattr(t, _TAG, sources)
            if self.current is not None and not func.is_view and _storage(t) not in held:
                size = nbytes(t)
                self.live_bytes += size
                self.peak_bytes = max(self.peak_bytes, self.live_bytes)
                weakref.finalize(t, self._freed, size)
        return out


@dataclass(frozen=True)
class ModuleTrace:
    """The module-level graph and what a device_map needs besides: each node's unit, the
    classes kept whole, and notes."""

    graph: OpGraph
    units: dict[str, Unit]
    no_split: tuple[str, ...]
    notes: tuple[str, ...] = ()


def _hooks(model: torch.nn.Module, found: dict[int, Unit], watch: _Watch,
           records: dict[str, _Record], order: list[str]) -> list[Any]:
    modules = {id(m): m for m in model.modules()}
    entry: dict[str, int] = {}
    # The units running, innermost last: a unit called from inside another (a shared module
    # handed to a layer) counts its own ops, and the outer one resumes after it.
    running: list[tuple[str | None, _Record | None]] = []

    def pre(module: torch.nn.Module, args: tuple, kwargs: dict) -> None:
        name = found[id(module)].name
        if name not in records:
            records[name] = _Record()
            order.append(name)
        record = records[name]
        for t in _tensors((args, kwargs)):
            size = nbytes(t)
            record.input_bytes += size
            for source in _sources(t) or {INPUT}:
                record.reads[source] = record.reads.get(source, 0) + size
        running.append((watch.current, watch.record))
        watch.current, watch.record = name, record
        entry[name] = watch.live_bytes
        watch.peak_bytes = watch.live_bytes

    def post(module: torch.nn.Module, args: tuple, kwargs: dict, output: Any) -> None:
        name = found[id(module)].name
        record = records[name]
        outs = _tensors(output)
        out_bytes = sum(nbytes(t) for t in outs)
        record.output_bytes += out_bytes
        record.shapes += [tuple(t.shape) for t in outs]
        record.dtypes += [str(t.dtype).removeprefix("torch.") for t in outs]
        record.workspace_bytes = max(record.workspace_bytes,
                                     watch.peak_bytes - entry[name] - out_bytes)
        for t in outs:  # its own, even when it hands an input back (eval-mode dropout)
            with contextlib.suppress(AttributeError, RuntimeError):
                setattr(t, _TAG, frozenset((name,)))
        watch.current, watch.record = running.pop()

    handles = []
    for key in found:
        module = modules[key]
        handles.append(module.register_forward_pre_hook(pre, with_kwargs=True))
        handles.append(module.register_forward_hook(post, with_kwargs=True))
    return handles


@contextlib.contextmanager
def _hooked(model: torch.nn.Module, found: dict[int, Unit], watch: _Watch,
            records: dict[str, _Record], order: list[str]) -> Iterator[None]:
    handles = _hooks(model, found, watch, records, order)
    try:
        yield
    finally:
        for handle in handles:
            handle.remove()


def _run(model: torch.nn.Module, args: tuple, kwargs: dict, watch: _Watch) -> Any:
    """One forward pass, for real: the ops a real pass runs, which a pass on meta tensors does
    not always match (T5's blocks ran about a third more ops on meta tensors than on real ones
    here), and data-dependent code (transformers' masks call ``.item()``, Mixtral's router
    ``nonzero``) that meta tensors cannot answer. A model whose weights are on the meta device
    runs there, its inputs moved to it."""
    if any(p.is_meta for p in model.parameters()):
        args, kwargs = to_meta(args), to_meta(kwargs)
    with torch.no_grad(), watch:
        return model(*args, **kwargs)


def _traced_run(model: torch.nn.Module, found: dict[int, Unit], args: tuple,
                kwargs: dict) -> tuple[Any, dict[str, _Record], list[str]]:
    """The output of one forward pass, what each unit did in it, and the units' call order."""
    watch, records, order = _Watch(), {}, []
    try:
        with _hooked(model, found, watch, records, order):
            output = _run(model, args, kwargs, watch)
    except Exception as exc:  # noqa: BLE001 - any failure of the user's model
        if any(p.is_meta for p in model.parameters()):
            raise TraceError(f"running the model once on meta tensors to trace its modules "
                             f"failed: {type(exc).__name__}: {exc}") from exc
        raise ModelLoadError(describe_failure(exc, what="the model, run on its example inputs "
                                              "to trace its modules,")) from exc
    return output, records, order


@dataclass(frozen=True)
class Units:
    """What the module tree alone says, before any run: the units by ``id`` of their module,
    the classes kept whole, each unit's parameter and buffer bytes (and of them the trainable
    ones), and the tied groups."""

    found: dict[int, Unit]
    no_split: tuple[str, ...]
    param_bytes: dict[str, int]
    trainable_bytes: dict[str, int]
    tied: tuple[tuple[str, ...], ...]


def module_units(model: torch.nn.Module, no_split: tuple[str, ...] | None = None) -> Units:
    """``model``'s units (``no_split``: the classes kept whole, default
    ``model._no_split_modules``), their bytes and tied groups."""
    if no_split is None:
        no_split = tuple(sorted(getattr(model, "_no_split_modules", None) or ()))
    found = units(model, frozenset(no_split))
    param_bytes, trainable_bytes, tied = _tensors_of_units(model, found)
    return Units(found=found, no_split=tuple(no_split), param_bytes=param_bytes,
                 trainable_bytes=trainable_bytes, tied=tied)


def trace_modules(model: torch.nn.Module, args: tuple, kwargs: dict, *,
                  no_split: tuple[str, ...] | None = None, name: str = "model",
                  tree: Units | None = None) -> ModuleTrace:
    """``model``'s module-level ``OpGraph`` on ``args``/``kwargs``. ``no_split``: the classes
    kept whole (default: ``model._no_split_modules``); ``tree``: ``module_units``' answer, when
    the caller has it. Parameter and buffer bytes are the model's before the forward pass: a
    buffer the forward registers or grows is not counted."""
    tree = tree or module_units(model, no_split)
    found, no_split = tree.found, tree.no_split
    output, records, order = _traced_run(model, found, args, kwargs)
    by_name = {u.name: u for u in found.values()}
    order += [u.name for u in found.values() if u.name not in records]  # never called
    nodes, edges, dropped = _nodes_and_edges(tree, by_name, records, order, args, kwargs)
    colocate = tree.tied
    outputs = sorted(set().union(*(_sources(t) for t in _tensors(output))) & set(by_name))
    notes = []
    if dropped:
        notes.append(f"{dropped} module-level edge(s) run backwards (a module called again "
                     "after what it feeds) and were left out of the graph's timing")
    graph = OpGraph(nodes=tuple(nodes), edges=tuple(edges), colocate=colocate,
                    outputs=tuple(outputs) or (order[-1],), name=name)
    return ModuleTrace(graph=graph, units=by_name, no_split=tuple(no_split), notes=tuple(notes))


def _tensors_of_units(model: torch.nn.Module, found: dict[int, Unit]) -> tuple[
        dict[str, int], dict[str, int], tuple[tuple[str, ...], ...]]:
    """In one walk over the units' parameters and buffers: the bytes per unit (each tensor
    once, in its first unit), of them the trainable ones, and the groups of units that share a
    tensor (tied weights)."""
    modules = dict(model.named_modules(remove_duplicate=False))
    owners: dict[int, set[str]] = {}
    total: dict[str, int] = {}
    trainable: dict[str, int] = {}
    for unit in found.values():
        module = modules[unit.name] if unit.name else model
        for tensor in [*module.parameters(), *module.buffers()]:
            if id(tensor) in owners:
                owners[id(tensor)].add(unit.name)
                continue
            owners[id(tensor)] = {unit.name}
            total[unit.name] = total.get(unit.name, 0) + nbytes(tensor)
            if isinstance(tensor, torch.nn.Parameter) and tensor.requires_grad:
                trainable[unit.name] = trainable.get(unit.name, 0) + nbytes(tensor)
    tied = tuple(sorted({tuple(sorted(group)) for group in owners.values() if len(group) > 1}))
    return total, trainable, tied


def _nodes_and_edges(tree: Units, unit_of: dict[str, Unit], records: dict[str, _Record],
                     order: list[str], args: tuple,
                     kwargs: dict) -> tuple[list[OpNode], list[Edge], int]:
    params, trainable = tree.param_bytes, tree.trainable_bytes
    input_bytes = sum(nbytes(t) for t in _tensors((args, kwargs)))
    nodes = [OpNode(name=INPUT, is_input=True, output_bytes=input_bytes)]
    index = {INPUT: 0} | {name: i + 1 for i, name in enumerate(order)}
    edges: list[Edge] = []
    dropped = 0
    for name in order:
        record = records.get(name, _Record())
        dtype = record.dtypes[0] if record.dtypes else "float32"
        nodes.append(OpNode(
            name=name, ops=(name,), targets=(f"module:{unit_of[name].cls}",), module=name,
            output_shapes=tuple(record.shapes), output_dtypes=tuple(record.dtypes),
            output_bytes=record.output_bytes, param_bytes=params.get(name, 0),
            trainable_bytes=trainable.get(name, 0), workspace_bytes=record.workspace_bytes,
            flops=record.flops, launches=record.launches, dtype=dtype,
            bytes_accessed=params.get(name, 0) + record.input_bytes + record.output_bytes))
        for source, size in record.reads.items():
            if source == name:
                continue
            if index[source] > index[name]:
                dropped += 1
                continue
            edges.append(Edge(src=source, dst=name, bytes=size))
    produced = {n.name: n.output_bytes for n in nodes}
    edges = [Edge(e.src, e.dst, min(e.bytes, produced[e.src])) for e in edges]
    return nodes, edges, dropped


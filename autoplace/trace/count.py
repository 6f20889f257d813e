"""Count each op of a traced graph: FLOPs and the bytes it holds while it runs beyond its
output, by running the graph once on fake tensors (no memory is used) under ``FlopCounterMode``.

``count_ops`` is the entry point (``autoplace.trace`` calls it after tracing); the
``CountingInterpreter`` it returns also holds every node's fake result, which ``trace`` reads
shapes and bytes from. An op whose function and arguments were seen before takes the counts
found then (``CountingInterpreter.signature``): a model's repeated layers are counted once.
"""

from __future__ import annotations

import math
import operator
import re
import weakref
from typing import Any

import torch
import torch.fx
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils.flop_counter import FlopCounterMode

from autoplace.trace.repeat import REPEAT_OF
from cost_models.calibration import POOLING_OPS

__all__ = ["CountingInterpreter", "attention_flops", "count_ops", "flat_inputs", "nbytes",
           "op_name", "tensors", "value_bytes"]


def op_name(target: Any) -> str:
    """``aten.view.default`` -> ``view``; ``operator.getitem`` -> ``getitem``."""
    if isinstance(target, str):
        return target
    if target is operator.getitem:
        return "getitem"
    name = getattr(target, "__name__", str(target))
    if hasattr(target, "_schema"):
        name = target._schema.name.split("::")[-1]
    return name


def tensors(value: Any) -> list[torch.Tensor]:
    """The tensors in a (possibly nested) op result."""
    if isinstance(value, torch.Tensor):
        return [value]
    if isinstance(value, (list, tuple)):
        return [t for v in value for t in tensors(v)]
    if isinstance(value, dict):
        return [t for v in value.values() for t in tensors(v)]
    return []


def nbytes(t: torch.Tensor) -> int:
    return int(t.numel()) * t.element_size()


def value_bytes(value: Any) -> int:
    """The bytes of the tensors in a (possibly nested) value."""
    return sum(nbytes(t) for t in tensors(value))


def attention_flops(name: str, args: tuple) -> float:
    """A fused attention kernel's FLOPs (``name``: its op's), which the FLOP counter's registry
    leaves at zero for the CPU's: ``2 * 2 * B * H * Lq * Lk * E`` (two matmuls), the formula
    the registry uses for the others; 0 for any other op."""
    if ("scaled_dot_product" in name and len(args) >= 3
            and all(isinstance(a, torch.Tensor) for a in args[:2])):
        return 4.0 * args[0].numel() * args[1].shape[-2]
    return 0.0


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
        given = {t.untyped_storage()._cdata for t in tensors((args, kwargs))} - made
        for t in tensors(out):
            storage = t.untyped_storage()
            if storage._cdata not in given:
                self.made.append((weakref.ref(t), storage._cdata, storage.nbytes()))
        alive = {key: size for ref, key, size in self.made if ref() is not None}
        self.peak_bytes = max(self.peak_bytes, sum(alive.values()))
        return out


class CountingInterpreter(torch.fx.Interpreter):
    """Runs each node on fake tensors under FlopCounterMode, recording FLOPs and results, and
    what each op holds beyond its output while it runs (``_Transient``). An op that copies
    another of a repeated block (``repeat.REPEAT_OF``) takes that op's, without running."""

    def __init__(self, module: torch.fx.GraphModule, device: str):
        super().__init__(module, garbage_collect_values=False)
        self.device = device
        self.flops: dict[str, int] = {}
        self.values: dict[str, Any] = {}
        self.transient_bytes: dict[str, int] = {}
        # (FLOPs, transient bytes) by ``signature``: a model's repeated layers count once.
        self.seen: dict[tuple, tuple[int, int]] = {}

    def get_attr(self, target, args, kwargs):  # noqa: ANN001 - fx signature
        value = super().get_attr(target, args, kwargs)
        if isinstance(value, torch.Tensor):
            return _fake_like(value, self.device)
        return value

    def run_node(self, n: torch.fx.Node) -> Any:
        if (of := n.meta.get(REPEAT_OF)) in self.values:  # a repeated block's copy of ``of``
            self.flops[n.name] = self.flops[of]
            self.transient_bytes[n.name] = self.transient_bytes[of]
            result = self.values[n.name] = self.values[of]
            return result
        if n.op in ("placeholder", "output", "get_attr"):
            result = super().run_node(n)
        elif (key := self.signature(n)) is not None and key in self.seen:
            result = super().run_node(n)
            self.flops[n.name], self.transient_bytes[n.name] = self.seen[key]
        else:
            counter, transient = FlopCounterMode(display=False), _Transient()
            with counter, transient:
                result = super().run_node(n)
            self.flops[n.name] = (int(counter.get_total_flops())
                                  or int(attention_flops(op_name(n.target),
                                                         self.fetch_args_kwargs_from_env(n)[0]))
                                  or self._window_reads(n, result))
            output_bytes = value_bytes(result)
            peak = self._on_cpu_peak(n) if self.device == "meta" else None
            self.transient_bytes[n.name] = max(
                0, (transient.peak_bytes if peak is None else peak) - output_bytes,
                self._branch_bytes(n))
            if key is not None:
                self.seen[key] = self.flops[n.name], self.transient_bytes[n.name]
        self.values[n.name] = result
        return result

    def _on_cpu_peak(self, n: torch.fx.Node) -> int | None:
        """What an attention op holds at its peak on fake CPU tensors, its fused kernel's
        (a meta tensor takes ATen's math path, which holds the L x L scores), for a graph on
        the meta device; ``None`` for any other op."""
        if n.op != "call_function" or "scaled_dot_product" not in op_name(n.target):
            return None
        args, kwargs = self.fetch_args_kwargs_from_env(n)
        moved = torch.utils._pytree.tree_map(
            lambda v: _fake_like(v, "cpu") if isinstance(v, torch.Tensor) else v, (args, kwargs))
        with _Transient() as transient:
            n.target(*moved[0], **moved[1])
        return transient.peak_bytes

    def signature(self, n: torch.fx.Node) -> tuple | None:
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
                        nbytes(t) for node in branch.graph.nodes
                        if node.op == "call_function"
                        for t in tensors(node.meta.get("val"))))
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
            name = op_name(n.target)
            kernel = n.args[1] if len(n.args) > 1 else n.kwargs.get("kernel_size")
        else:
            return 0
        if name not in POOLING_OPS or not (outputs := tensors(result)):
            return 0
        out = outputs[0]
        if name.lstrip("_").startswith("adaptive"):
            first = n.all_input_nodes[0].name if n.all_input_nodes else None
            inputs = tensors(self.values.get(first)) if first else []
            return int(inputs[0].numel()) if inputs else int(out.numel())
        window = _kernel(kernel, int(re.search(r"pool(\d)d", name).group(1)))
        return int(out.numel()) * math.prod(window) if window else 0


_PLAIN = (int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout,
          torch.memory_format)


def _plain(value: Any, storages: dict[int, int]) -> Any:
    """``value`` as a hashable key for ``CountingInterpreter._signature``; ``TypeError`` for
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


def count_ops(
    gm: torch.fx.GraphModule, args: tuple, kwargs: dict, *, device: str
) -> CountingInterpreter:
    fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
    interp = CountingInterpreter(gm, device)
    with fake_mode:
        fake_inputs = [_fake_like(x, device) if isinstance(x, torch.Tensor) else x
                       for x in flat_inputs(gm, args, kwargs)]
        interp.run(*fake_inputs)
    return interp

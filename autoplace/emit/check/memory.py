"""Emit: measure an emitted model's peak memory per *planned* device while it runs.

The plan's memory figure for a device (``autoplace.simulate``) is its resident parameters plus
its live activations at their peak. ``measure_peak_bytes`` measures the same two things on the
emitted model, on one forward pass without gradients, so that verification can fail a plan whose
figure is below what its model needs: the bytes of the distinct tensor storages each segment
holds, on its planned device, and every storage an op allocates, on the planned device of the
segment running when it was allocated, until its last reference is dropped (a value copied to
another planned device counts there from the copy on). ``method="allocator"`` (every segment on
its own CUDA device) reads ``torch.cuda.max_memory_allocated`` instead. ``measure_step`` does
the same for a training step. docs/design-notes.md ("emit") says what is counted and how.

Read ``measure_peak_bytes``, then ``_Tracker`` (a ``TorchDispatchMode`` below autograd, a
``TorchFunctionMode`` for ``Tensor.to``, hooks on ``seg0..segN``) and ``_replay``. Segments run
in other threads are invisible to these thread-local modes: measuring such a model raises.
"""

from __future__ import annotations

import contextlib
import threading
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch._C import DispatchKey
from torch.multiprocessing.reductions import StorageWeakRef
from torch.overrides import TorchFunctionMode
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from autoplace.errors import EmitError
from autoplace.ir import Problem, Schedule

__all__ = ["PeakMeasurement", "comparable_peak_bytes", "measure", "measure_peak_bytes",
           "measure_step", "weight_bytes"]

Method = Literal["auto", "storage", "allocator"]


@dataclass(frozen=True)
class PeakMeasurement:
    """Per planned device: resident weight bytes, the peak of live activation bytes, and their
    sum ``peak_bytes`` (the figure comparable to the plan's). ``method`` says how."""

    weights_bytes: Mapping[str, int]
    activation_peak_bytes: Mapping[str, int]
    method: str

    @property
    def peak_bytes(self) -> dict[str, int]:
        devices = sorted(set(self.weights_bytes) | set(self.activation_peak_bytes))
        return {d: self.weights_bytes.get(d, 0) + self.activation_peak_bytes.get(d, 0)
                for d in devices}


def comparable_peak_bytes(problem: Problem, schedule: Schedule) -> dict[str, int]:
    """The plan's peak per device as a measurement here can see it: less the runtime's reserve
    (the CUDA context, ``Device.reserved_bytes``), which neither tensor storages nor the caching
    allocator count. What verification and ``autoplace run`` set a measurement against."""
    return {d.name: int(schedule.peak_bytes[d.name]) - d.reserved_bytes
            for d in problem.cluster.devices}


def measure_peak_bytes(
    emitted: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any] | None = None,
    *,
    method: Method = "auto",
) -> dict[str, int]:
    """Peak bytes (weights + live activations) per planned device over one forward pass of
    ``emitted`` (a ``PartitionedModel`` or a model from ``load_model``) on ``args``/``kwargs``.
    See the module docstring for what is counted; ``measure`` gives the breakdown."""
    return measure(emitted, args, kwargs, method=method).peak_bytes


def measure(
    emitted: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: Mapping[str, Any] | None = None,
    *,
    method: Method = "auto",
) -> PeakMeasurement:
    """``measure_peak_bytes`` with the weights and activations apart."""
    planned, actual = _devices(emitted)
    if method == "auto":
        separate = len(set(actual)) == len(set(planned))
        on_gpus = all(torch.device(d).type == "cuda" for d in actual)
        method = "allocator" if separate and on_gpus else "storage"
    weights = weight_bytes(emitted)
    if method == "allocator":
        activations = _allocator_peaks(emitted, args, dict(kwargs or {}), planned, actual)
    elif method == "storage":
        # Storage tracking sees the ops of this thread only (a dispatch mode is per thread), so
        # a threaded emitted model is measured running its segments in order on this thread:
        # same segments, same order per device (the threaded runtime's workers follow it too).
        tracker = _Tracker(emitted, planned)
        with _sequential(emitted), tracker:
            with torch.no_grad():
                result = emitted(*args, **dict(kwargs or {}))
            tracker.keep(result)
        activations = tracker.peaks()
    else:
        raise EmitError(f"unknown measuring method {method!r}; valid: auto, storage, allocator")
    return PeakMeasurement(weights_bytes=weights, activation_peak_bytes=activations,
                           method=method)


def weight_bytes(emitted: torch.nn.Module) -> dict[str, int]:
    """Bytes of the distinct parameter and buffer storages per planned device."""
    planned, _ = _devices(emitted)
    seen: set[StorageWeakRef] = set()
    total = dict.fromkeys(planned, 0)
    for index, device in enumerate(planned):
        segment = getattr(emitted, f"seg{index}")
        for tensor in (*segment.parameters(), *segment.buffers()):
            if tensor.is_meta:
                continue
            key = StorageWeakRef(tensor.untyped_storage())
            if key not in seen:
                seen.add(key)
                total[device] += tensor.untyped_storage().nbytes()
    return total


def _devices(emitted: torch.nn.Module) -> tuple[list[str], list[str]]:
    planned = getattr(emitted, "planned_devices", None)
    actual = getattr(emitted, "devices", None)
    if not planned or actual is None or len(planned) != len(actual):
        raise EmitError(
            f"{type(emitted).__name__} is not an emitted model: measuring needs the "
            "planned_devices and segments of autoplace.emit.emit_model or load_model")
    return [str(d) for d in planned], [str(d) for d in actual]


def _allocator_peaks(
    emitted: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    planned: list[str],
    actual: list[str],
) -> dict[str, int]:
    """The caching allocator's peak per CUDA device over one pass, less what was allocated
    before it (the weights, and anything else already there), as activations per planned
    device."""
    where = dict(zip(actual, planned))
    before = {}
    for device in where:
        torch.cuda.synchronize(device)
        torch.cuda.reset_peak_memory_stats(device)
        before[device] = torch.cuda.memory_allocated(device)
    with torch.no_grad():
        emitted(*args, **kwargs)
    peaks = {}
    for device, plan in where.items():
        torch.cuda.synchronize(device)
        peaks[plan] = max(torch.cuda.max_memory_allocated(device) - before[device], 0)
    return peaks


_CHARGED = "autoplace.charged_to"  # an autograd node's metadata: the device it charges


Charge = Callable[[str], contextlib.AbstractContextManager[Any]]


def measure_step(emitted: torch.nn.Module, run: Callable[[Charge], Any], *,
                 optimizer: str, dtype: str = "float32") -> PeakMeasurement:
    """Peak bytes per planned device over a training step of ``emitted`` (a training plan's)
    in the steady state: one step is taken unmeasured, so that the optimizer holds its state,
    and the gradients are dropped (``zero_grad(set_to_none=True)``); then the measured step:
    ``run(charge)`` (its forward and backward, on this thread: ``microbatch.train_step(
    threads=False, charge=charge)``, or the loss's ``backward()``), then ``optimizer``'s update
    of each planned device's parameters. ``weights_bytes`` holds the weights and the
    optimizer's state (resident through the step, as the plan has them); the peak above
    them, besides what ``measure`` counts, holds the backward's allocations (gradients,
    ``.grad``, what autograd frees as it goes), charged to the planned device of the segment
    whose forward made the autograd node that allocates them, or whose backward runs
    (``charge(device)``: the gradients handed on between segments), and the update's
    temporaries, charged to its parameters' device. In a half ``dtype`` the update is mixed
    precision's (``optimizer.MasterWeights``), whose float32 masters are resident too. The
    weights are updated twice."""
    from autoplace.emit.train.optimizer import MasterWeights

    planned, _ = _devices(emitted)
    seen: set[int] = set()
    updates = []
    for index, device in enumerate(planned):
        params = [p for p in getattr(emitted, f"seg{index}").parameters()
                  if p.requires_grad and id(p) not in seen]
        seen.update(id(p) for p in params)
        if params:
            updates.append((device, MasterWeights(optimizer, params, dtype=dtype)))
    tracker = _Tracker(emitted, planned, backward=True)
    with _sequential(emitted):
        for measured in (False, True):
            for p in emitted.parameters():
                p.grad = None
            with tracker if measured else contextlib.nullcontext():
                result = run(tracker.on if measured else lambda _: contextlib.nullcontext())
                tracker.keep(result)
                for device, opt in updates:
                    with tracker.on(device) if measured else contextlib.nullcontext():
                        opt.step()
    resident = weight_bytes(emitted)
    for device, opt in updates:
        masters = opt.masters if opt.mixed else []
        resident[device] = resident.get(device, 0) + sum(
            m.untyped_storage().nbytes() for m in masters) + sum(
            value.untyped_storage().nbytes() for m in opt.masters
            for value in opt.optimizer.state.get(m, {}).values()
            if isinstance(value, torch.Tensor) and value.dim())  # not Adam's step count
    # What the caller's side makes (the batch's loss, moved to the CPU) is on no planned device.
    peaks = {d: b for d, b in tracker.peaks().items() if d in planned}
    return PeakMeasurement(weights_bytes=resident, activation_peak_bytes=peaks,
                           method="storage")


@contextlib.contextmanager
def _sequential(emitted: torch.nn.Module) -> Iterator[None]:
    """``emitted`` run with the sequential runtime inside (its segments in order on this
    thread, which storage tracking sees: a dispatch mode is per thread), its own afterwards."""
    runtime = getattr(emitted, "runtime", "sequential")
    if runtime != "sequential":
        emitted.runtime = "sequential"
    try:
        yield
    finally:
        if runtime != "sequential":
            emitted.runtime = runtime


class _Tracker:
    """The event log of one measured pass: allocations and frees of tensor storages, each
    storage charged to a planned device (possibly decided later, for copies). With
    ``backward``, each segment's autograd nodes charge what they allocate to its device."""

    def __init__(self, emitted: torch.nn.Module, planned: list[str], *,
                 backward: bool = False) -> None:
        self._emitted = emitted
        self._planned = planned
        self._backward = backward
        self._thread = threading.get_ident()
        self._running: list[str] = []  # planned device of the segment running, innermost last
        self._live: dict[StorageWeakRef, int] = {}  # storage -> its id in the log
        self._known: dict[StorageWeakRef, str] = {}  # weights -> planned device
        self._bytes: list[int] = []  # id -> bytes
        self._device: list[str | None] = []  # id -> planned device (None: a copy not yet read)
        self._copy_of: dict[int, str] = {}  # copy id -> planned device of what it copies
        self._log: list[tuple[int, bool]] = []  # (id, allocated?) in order
        self._kept: list[Any] = []
        self._hooks: list[Any] = []
        self._modes = (_Dispatch(self), _Function(self))

    def __enter__(self) -> _Tracker:
        for index, device in enumerate(self._planned):
            segment = getattr(self._emitted, f"seg{index}")
            for tensor in (*segment.parameters(), *segment.buffers()):
                self._known.setdefault(StorageWeakRef(tensor.untyped_storage()), device)
            self._hooks.append(segment.register_forward_pre_hook(
                lambda _m, a, d=device: self._enter(d, a)))
            self._hooks.append(segment.register_forward_hook(
                lambda _m, _a, out, d=device: self._leave(out, d)))
        _register_higher_order()
        for mode in self._modes:
            mode.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        for mode in reversed(self._modes):
            mode.__exit__(*exc)
        for hook in self._hooks:
            hook.remove()
        self._poll()

    def keep(self, result: Any) -> None:
        """The model's outputs live to the end (held until ``peaks`` is read)."""
        self._kept.append(result)

    def peaks(self) -> dict[str, int]:
        return _replay(self._log, self._bytes, self._resolved())

    # -- called by the hooks and modes -------------------------------------------------------

    def _enter(self, device: str, inputs: tuple[Any, ...]) -> None:
        if threading.get_ident() != self._thread:
            raise EmitError(
                "this emitted model runs segments in other threads, where the memory tracker "
                "cannot see them; measure it with method='allocator' on GPUs")
        self._poll()
        for leaf in pytree.tree_leaves(inputs):
            if isinstance(leaf, torch.Tensor):
                ident = self._live.get(StorageWeakRef(leaf.untyped_storage()))
                if ident is not None and self._device[ident] is None:
                    # A copy made in the top-level forward: it lives on the reader's device,
                    # unless it copies onto the device its source is on (then .to makes none).
                    same = self._copy_of.get(ident) == device
                    self._device[ident] = "" if same else device
        self._running.append(device)

    def _leave(self, outputs: Any = None, device: str | None = None) -> None:
        self._running.pop()
        if self._backward and device is not None:
            self._charge_backward(outputs, device)

    @contextlib.contextmanager
    def on(self, device: str) -> Iterator[None]:
        """Charge what is allocated inside to ``device``."""
        self._running.append(device)
        try:
            yield
        finally:
            self._running.pop()

    def _charge_backward(self, outputs: Any, device: str) -> None:
        """Hook the autograd nodes a segment's forward made (those no earlier segment's
        reach: its own), so that what each allocates in the backward is charged to
        ``device``."""
        stack = [x.grad_fn for x in pytree.tree_leaves(outputs)
                 if isinstance(x, torch.Tensor) and x.grad_fn is not None]
        while stack:
            node = stack.pop()
            # Marked in the node's own metadata: a set of nodes here would keep them, and an
            # AccumulateGrad keeps its tensor and that tensor's gradient.
            if node is None or _CHARGED in node.metadata:
                continue
            node.metadata[_CHARGED] = device
            node.register_prehook(lambda *_, d=device: self._running.append(d))
            node.register_hook(lambda *_: self._running.pop() and None)
            stack += [n for n, _ in node.next_functions]

    def _poll(self) -> None:
        for key in [k for k in self._live if k.expired()]:
            self._log.append((self._live.pop(key), False))

    def _allocated(self, outputs: Any, *, fresh: list[bool]) -> None:
        leaves = [x for x in pytree.tree_leaves(outputs) if isinstance(x, torch.Tensor)]
        for leaf, is_fresh in zip(leaves, fresh):
            key = StorageWeakRef(leaf.untyped_storage())
            if not is_fresh or key in self._live or key in self._known:
                continue
            ident = len(self._bytes)
            self._live[key] = ident
            self._bytes.append(leaf.untyped_storage().nbytes())
            device = self._running[-1] if self._running else None
            self._device.append(device)
            self._log.append((ident, True))

    def _home(self, tensor: torch.Tensor) -> str:
        """The planned device a tensor is on: its allocation's, or its own for inputs."""
        key = StorageWeakRef(tensor.untyped_storage())
        ident = self._live.get(key)
        if ident is not None and self._device[ident]:
            return str(self._device[ident])
        return self._known.get(key, str(tensor.device))

    def _resolved(self) -> list[str]:
        # A copy no segment read (returned as an output, say) stays on its source's device.
        return [d if d is not None else self._copy_of.get(i, "") for i, d in
                enumerate(self._device)]


class _Dispatch(TorchDispatchMode):
    """Every aten op: poll for frees, run it, record the storages it allocated. Of higher-order
    ops (``_register_higher_order``), ``torch.cond`` runs its taken branch under this mode, op
    by op; others (``while_loop``, ``map``, ...) run densely and only their outputs count."""

    def __init__(self, tracker: _Tracker) -> None:
        super().__init__()
        self._tracker = tracker

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        self._tracker._poll()
        out = func(*args, **(kwargs or {}))
        returns = func._schema.returns
        leaves = [x for x in pytree.tree_leaves(out) if isinstance(x, torch.Tensor)]
        # A return with alias info is a view of, or writes into, an input: no new memory.
        fresh = [True] * len(leaves)
        if len(returns) == len(leaves):
            fresh = [r.alias_info is None for r in returns]
        elif any(r.alias_info is not None for r in returns):
            fresh = [False] * len(leaves)
        self._tracker._allocated(out, fresh=fresh)
        return out


class _Function(TorchFunctionMode):
    """``Tensor.to`` in the top-level forward moves a value between planned devices: make the
    copy even where both devices are the CPU, so that it can be charged."""

    def __init__(self, tracker: _Tracker) -> None:
        super().__init__()
        self._tracker = tracker

    def __torch_function__(self, func, types, args=(), kwargs=None):  # noqa: ANN001, ANN204
        out = func(*args, **(kwargs or {}))
        tracker = self._tracker
        if func is not torch.Tensor.to or tracker._running or not args:
            return out
        source = args[0]
        if not isinstance(out, torch.Tensor) or not isinstance(source, torch.Tensor):
            return out
        if out.untyped_storage().data_ptr() == source.untyped_storage().data_ptr():
            out = out.clone()  # seen by _Dispatch as an allocation outside any segment
        ident = tracker._live.get(StorageWeakRef(out.untyped_storage()))
        if ident is not None and tracker._device[ident] is None:
            tracker._copy_of[ident] = tracker._home(source)
        return out


def _run_higher_order(hop: Any) -> Any:
    def run(mode: _Dispatch, *args: Any, **kwargs: Any) -> Any:
        if hop.name() == "cond":
            # torch.cond(pred, true_fn, false_fn, operands): the taken branch, op by op.
            pred, true_fn, false_fn, operands = args
            with mode:
                return (true_fn if bool(pred) else false_fn)(*operands)
        # Others run densely, unseen inside (torch refuses a mode there); outputs are counted.
        out = hop.dispatch(DispatchKey.CompositeExplicitAutograd, *args, **kwargs)
        mode._tracker._poll()
        leaves = [x for x in pytree.tree_leaves(out) if isinstance(x, torch.Tensor)]
        mode._tracker._allocated(out, fresh=[True] * len(leaves))
        return out
    return run


def _register_higher_order() -> None:
    """Teach every higher-order op that has a dense implementation to run under ``_Dispatch``
    (torch asks each mode for a rule; without one, ``torch.cond`` raises). Idempotent."""
    for hop in list(torch._ops._higher_order_ops.values()):
        dense = DispatchKey.CompositeExplicitAutograd in hop.py_kernels
        if dense and _Dispatch not in hop.python_key_table:
            hop.py_impl(_Dispatch)(_run_higher_order(hop))


def _replay(log: list[tuple[int, bool]], sizes: list[int], device: list[str]) -> dict[str, int]:
    """Live bytes per device along the log; the largest value each reaches."""
    live: dict[str, int] = {}
    peak: dict[str, int] = {}
    for ident, allocated in log:
        where = device[ident]
        if not where:
            continue
        live[where] = live.get(where, 0) + (sizes[ident] if allocated else -sizes[ident])
        peak[where] = max(peak.get(where, 0), live[where])
    return peak

"""Solve: the tensor-parallel candidate of an inference plan, priced by what DTensor does.

N ranks, one device each, run every op on their shards (``emit.distributed.tensor``). What each
rank computes and which collectives DTensor inserts are not guessed: ``observe`` runs the model
split so on a fake process group of N ranks in this process (``torch.distributed``'s ``fake``
backend; no data moves) through an fx interpreter, and records per traced op the share of the
work rank 0 does (the smallest local fraction of its DTensor inputs and output) and the
collectives dispatched while it ran, with their bytes. ``tensor_problem`` is then the forward
problem on the first device with each node's time and parameters scaled by its ops' shares and
each collective's time added to the node that waits for it, on the critical path: a ring over the
slowest link between the ranks (``cost_models.ring_allreduce_s``, ``ring_allgather_s``); between
CPU processes here, op times and collectives measured instead. A model on the meta device runs
on fake tensors, DTensor's dispatch per op measured once here (``dispatch_s``). Rules and
sources: docs/concepts.md, "Tensor parallelism".
"""

from __future__ import annotations

import contextlib
import functools
import math
import time
from collections.abc import Iterable, Iterator, Mapping
from dataclasses import dataclass, field, replace
from typing import Any

import torch
import torch.distributed as dist
import torch.fx
from torch._subclasses.fake_tensor import DataDependentOutputException
from torch.utils import _pytree as pytree
from torch.utils._python_dispatch import TorchDispatchMode

from autoplace.errors import EmitError
from autoplace.ir import Problem
from autoplace.solve.repeats import Repeats
from autoplace.solve.whatif import restrict
from autoplace.train.dataparallel import ring_link
from cost_models import ring_allgather_s, ring_allreduce_s

__all__ = ["OUTPUTS", "TIMED", "Collectives", "Observed", "SplitError", "dispatch_s",
           "measured_scale", "observe", "ring_pricer", "tensor_problem"]

OUTPUTS = "(outputs)"  # the key of the outputs' gathers, charged to the graph's last node

TIMED = 3  # passes timed per op under DTensor, the fastest kept

# Collectives DTensor dispatches (``torch.ops._c10d_functional``) and how each is priced from
# its bytes: the whole tensor's for an all-reduce and an all-gather's result, the input's for a
# reduce-scatter.
_RING = {"all_reduce": "allreduce", "all_gather_into_tensor": "allgather",
         "reduce_scatter_tensor": "allgather", "all_to_all_single": "allgather"}


@dataclass(frozen=True)
class Observed:
    """Per traced op: rank 0's share of its work (``share``), of the parameters it reads
    (``param_share``) and of its output (``output_share``); the collectives it waited for
    (``collectives``: kind and bytes); its seconds on this machine's CPU under DTensor, on one
    thread, collectives aside (``seconds``: the fastest of ``TIMED`` passes), and unsplit
    (``plain_seconds``), whose difference is DTensor's dispatch on the host (``overhead_s``)."""

    share: Mapping[str, float] = field(default_factory=dict)
    seconds: Mapping[str, float] = field(default_factory=dict)
    plain_seconds: Mapping[str, float] = field(default_factory=dict)
    param_share: Mapping[str, float] = field(default_factory=dict)
    output_share: Mapping[str, float] = field(default_factory=dict)
    collectives: Mapping[str, tuple[tuple[str, int], ...]] = field(default_factory=dict)
    # per op: the bytes of the parameters it reads, rank 0's and whole
    param_bytes: Mapping[str, tuple[int, int]] = field(default_factory=dict)
    # Fake tensors (nothing timed): DTensor's dispatch per op, measured here (``dispatch_s``),
    # and the ops that ran on DTensors.
    dispatch_s: float | None = None
    on_dtensors: frozenset[str] = frozenset()
    # A training step's (``observe``'s ``optimizer``): per traced op, the collectives its
    # backward waited for, and the step's passes on this machine's CPU under DTensor, one
    # thread, collectives aside: the forward with autograd recording, the backward, the
    # optimizer's update of rank 0's ``trained_bytes`` (each the fastest of ``TIMED``).
    backward_collectives: Mapping[str, tuple[tuple[str, int], ...]] = field(
        default_factory=dict)
    forward_s: float | None = None
    backward_s: float | None = None
    update_s: float | None = None
    trained_bytes: int = 0
    # Fake tensors: the segments that repeated one already run, whose records are its
    # (``solve.repeats``).
    repeated_segments: int = 0

    def overhead_s(self, op: str) -> float:
        """What DTensor adds to ``op`` on the host: its time split, less its share of its time
        whole (at least 0); untimed, ``dispatch_s`` for an op on DTensors."""
        if op not in self.seconds or op not in self.plain_seconds:
            return self.dispatch_s if self.dispatch_s and op in self.on_dtensors else 0.0
        return max(0.0, self.seconds[op] - self.share.get(op, 1.0) * self.plain_seconds[op])


def observe(emitted: torch.nn.Module, split: Mapping[str, tuple[str, int]], ranks: int,
            args: tuple[Any, ...], kwargs: dict[str, Any], *,
            optimizer: str | None = None, repeated: bool = True) -> Observed:
    """Run ``emitted`` (one device's, its segments fx graphs) split as ``split`` says over
    ``ranks`` fake ranks on ``args``/``kwargs`` (see the module's docstring). The emitted
    model's parameters are replaced by DTensors: pass a copy. A model whose parameters are on
    the meta device runs on fake tensors (``FakeTensorMode``: shapes, no data, nothing timed);
    each op on DTensors is then charged ``dispatch_s()``, DTensor's dispatch measured here,
    and a segment that repeats one already run (``repeated``) is observed once
    (``solve.repeats``).

    With ``optimizer`` (a training step: ``emitted`` returns the loss) the pass records
    autograd's graph and its backward runs under the same observation, each collective charged
    to the op whose backward dispatched it (a hook on each op's output fires as its gradient
    is ready, before that op's backward runs); then the step is timed (``_timed_step``)."""
    from torch.distributed.device_mesh import init_device_mesh

    recorder, found, plain = _Recorder(), _Found(), _Found()
    steps: dict[str, float] = {}
    interpreters = {}
    fake = any(p.is_meta for p in emitted.parameters())
    segments = [getattr(emitted, f"seg{i}") for i in range(len(emitted.segment_info))]
    repeats = Repeats(segments, split) if fake and repeated else None
    for index, segment in enumerate(segments):
        interpreters[index] = _Interpreter(segment, recorder, plain)
        run = _run_with(interpreters[index])
        segment.forward = repeats.forward(index, run) if repeats is not None else run
    try:
        if fake:
            mode = _fake_copy(emitted)
            with mode:
                args, kwargs = pytree.tree_map(_fake_input, (args, kwargs))
        else:
            mode = contextlib.nullcontext()
            _timed(emitted, interpreters.values(), args, kwargs)  # unsplit: DTensor's overhead
        for interpreter in interpreters.values():
            interpreter.found = found
        with _fake_group(ranks):
            mesh = init_device_mesh("cpu", (ranks,))  # outside the fake mode: it reads ranks
            with mode:
                _sharded_pass(emitted, split, mesh, recorder, found, args, kwargs,
                              train=optimizer is not None)
            if not fake:
                _timed(emitted, interpreters.values(), args, kwargs)
                if optimizer is not None:
                    _plain_forward(emitted, interpreters)
                    steps = _timed_step(emitted, optimizer, args, kwargs)
    finally:
        _plain_forward(emitted, interpreters)
    if repeats is not None:
        repeats.copy_into(found)
    return Observed(share=found.share, seconds=found.seconds, plain_seconds=plain.seconds,
                    param_share=found.param_share, param_bytes=found.param_bytes,
                    output_share=found.output_share,
                    collectives={k: tuple(v) for k, v in found.collectives.items()},
                    dispatch_s=dispatch_s() if fake else None,
                    on_dtensors=frozenset(found.on_dtensors),
                    backward_collectives={k: tuple(v) for k, v in found.backward.items()},
                    trained_bytes=sum(_nbytes(p, local=True) for p in emitted.parameters()
                                      if p.requires_grad),
                    repeated_segments=len(repeats.repeated) if repeats is not None else 0,
                    **steps)


def _plain_forward(emitted: torch.nn.Module, interpreters: Mapping[int, Any]) -> None:
    """Each segment's own ``forward`` again, its interpreter's dropped."""
    for index in interpreters:
        vars(getattr(emitted, f"seg{index}")).pop("forward", None)


def _sharded_pass(emitted: torch.nn.Module, split: Mapping[str, tuple[str, int]], mesh: Any,
                  recorder: _Recorder, found: _Found, args: tuple[Any, ...],
                  kwargs: dict[str, Any], *, train: bool = False) -> None:
    """``emitted`` split over the fake group's ``mesh`` and run once, each op's shares and
    collectives recorded, then its outputs gathered whole (as ``run_sharded`` returns them);
    with ``train``, its parameters copies (the step updates them) and the loss's backward run,
    each collective recorded against the op whose gradient came last (``_Found.reached``)."""
    from torch.distributed.tensor.experimental import implicit_replication

    from autoplace.emit.distributed.dtensor import dtensor_rules, shard_model

    shard_model(emitted, mesh, split, copy=train)
    found.hooks = train
    with (torch.enable_grad() if train else torch.no_grad()), implicit_replication(), \
            dtensor_rules(), recorder:
        out = emitted(*args, **kwargs)
        recorder.take()
        pytree.tree_map(_whole, out)
        gathered = recorder.take()
        if train:
            found.current = OUTPUTS  # the loss's own backward, until a hook fires
            loss = next(x for x in pytree.tree_leaves(out) if isinstance(x, torch.Tensor))
            try:
                loss.backward()
            except DataDependentOutputException as error:  # fake tensors hold no values
                raise SplitError(f"{found.current}@backward", RuntimeError(
                    "on fake tensors (the parameters are on the meta device), DTensor's "
                    f"backward asked for a value they do not hold ({error.func})"),
                    remedy="plan the model with its weights (built on the CPU, or "
                    "--checkpoint), or without --tp") from error
            found.reached(None, recorder)
    found.hooks = False
    if gathered:
        found.collectives[OUTPUTS] = gathered


def _timed_step(emitted: torch.nn.Module, optimizer: str, args: tuple[Any, ...],
                kwargs: dict[str, Any]) -> dict[str, float]:
    """The step of ``emitted`` (split, its loss its first output) on one thread under
    DTensor: the forward with autograd recording, the backward and the optimizer's update,
    each the fastest of ``TIMED`` (after one step that makes the optimizer's state)."""
    from torch.distributed.tensor.experimental import implicit_replication

    from autoplace.emit.distributed.dtensor import dtensor_rules
    from autoplace.train.graph import make_optimizer

    opt = make_optimizer(optimizer, [p for p in emitted.parameters() if p.requires_grad])
    threads = torch.get_num_threads()
    best = {"forward_s": math.inf, "backward_s": math.inf, "update_s": math.inf}
    try:
        torch.set_num_threads(1)
        with implicit_replication(), dtensor_rules():
            for attempt in range(TIMED + 1):
                took = {}
                opt.zero_grad()
                began = time.perf_counter()
                loss = next(x for x in pytree.tree_leaves(emitted(*args, **kwargs))
                            if isinstance(x, torch.Tensor))
                took["forward_s"] = time.perf_counter() - began
                began = time.perf_counter()
                loss.backward()
                took["backward_s"] = time.perf_counter() - began
                began = time.perf_counter()
                opt.step()
                took["update_s"] = time.perf_counter() - began
                if attempt:
                    best = {k: min(v, took[k]) for k, v in best.items()}
    finally:
        torch.set_num_threads(threads)
    return best


def _timed(emitted: torch.nn.Module, interpreters: Iterable[_Interpreter],
           args: tuple[Any, ...], kwargs: dict[str, Any]) -> None:
    """``TIMED`` passes of ``emitted`` on one thread, each op's fastest kept by its
    interpreter; DTensor's handlers on (a split model's)."""
    from torch.distributed.tensor.experimental import implicit_replication

    from autoplace.emit.distributed.dtensor import dtensor_rules

    threads = torch.get_num_threads()
    for interpreter in interpreters:
        interpreter.timing = True
    try:
        torch.set_num_threads(1)
        with torch.no_grad(), implicit_replication(), dtensor_rules():
            for _ in range(TIMED):
                emitted(*args, **kwargs)
    finally:
        torch.set_num_threads(threads)
        for interpreter in interpreters:
            interpreter.timing = False


def _fake_copy(emitted: torch.nn.Module) -> Any:
    """A ``FakeTensorMode`` in which ``emitted``'s meta parameters and buffers are now fake
    CPU tensors of their shapes and dtypes (in place), a parameter trained as before."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.symbolic_shapes import ShapeEnv

    # A ShapeEnv: a value read from a fake tensor (the indices DTensor gathers a strided shard
    # by, in a backward) is a symbol, not an error
    mode = FakeTensorMode(shape_env=ShapeEnv())
    with mode:
        for module in emitted.modules():
            for name, p in list(module.named_parameters(recurse=False)):
                module.register_parameter(name, torch.nn.Parameter(
                    torch.empty(p.shape, dtype=p.dtype, device="cpu"),
                    requires_grad=p.requires_grad))
            for name, b in list(module.named_buffers(recurse=False)):
                if b is not None:
                    module.register_buffer(name, torch.zeros(b.shape, dtype=b.dtype,
                                                             device="cpu"))
    return mode


def _fake_input(value: Any) -> Any:
    """An example input as a fake CPU tensor of its shape and dtype (inside the fake mode)."""
    if not isinstance(value, torch.Tensor):
        return value
    return torch.zeros(value.shape, dtype=value.dtype, device="cpu")


@functools.cache
def dispatch_s() -> float:
    """What DTensor adds to one op on this machine's host: a small matmul of a split weight on
    a fake group of 2 ranks, less the same matmul of plain tensors (the fastest of 200 each;
    at least 0). Charged per op where the ops are not timed one by one (fake tensors)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard, distribute_tensor
    from torch.distributed.tensor.experimental import implicit_replication

    x, w = torch.randn(4, 8), torch.randn(8, 8)

    def fastest(run: Any) -> float:
        best = float("inf")
        for _ in range(200):
            began = time.perf_counter()
            run()
            best = min(best, time.perf_counter() - began)
        return best

    with torch.no_grad():
        plain = fastest(lambda: torch.nn.functional.linear(x, w))
        with _fake_group(2), implicit_replication():
            split = distribute_tensor(w, init_device_mesh("cpu", (2,)), [Shard(0)])
            sharded = fastest(lambda: torch.nn.functional.linear(x, split))
    return max(0.0, sharded - plain)


@contextlib.contextmanager
def _fake_group(ranks: int) -> Iterator[None]:
    """A default process group of ``ranks`` fake ranks, this process rank 0, for the block."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if dist.is_initialized():
        raise EmitError("a process group is already set up in this process: plan tensor "
                        "parallelism from a process outside torch.distributed")
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=ranks)
    try:
        yield
    finally:
        dist.destroy_process_group()


class SplitError(Exception):
    """DTensor could not run traced op ``op`` split so (an attention's key/value heads that the
    ranks do not divide, say): ``error`` says why; ``remedy``, what to do where it is not the
    degree's fault."""

    def __init__(self, op: str, error: BaseException, remedy: str | None = None) -> None:
        super().__init__(f"{op}: {error}")
        self.op, self.error, self.remedy = op, error, remedy


@dataclass
class _Found:
    share: dict[str, float] = field(default_factory=dict)
    seconds: dict[str, float] = field(default_factory=dict)
    param_share: dict[str, float] = field(default_factory=dict)
    param_bytes: dict[str, tuple[int, int]] = field(default_factory=dict)
    output_share: dict[str, float] = field(default_factory=dict)
    collectives: dict[str, list[tuple[str, int]]] = field(default_factory=dict)
    on_dtensors: set[str] = field(default_factory=set)
    # A training pass: hooks on the ops' outputs (``hooks``), the op whose backward runs now
    # (``current``) and each op's backward collectives.
    hooks: bool = False
    current: str | None = None
    backward: dict[str, list[tuple[str, int]]] = field(default_factory=dict)

    def reached(self, op: str | None, recorder: _Recorder) -> None:
        """The gradient of ``op``'s output is ready (``None``: the backward is done): the
        collectives since the last such moment were the current op's backward's."""
        taken = recorder.take()
        if taken and self.current is not None:
            self.backward.setdefault(self.current, []).extend(taken)
        self.current = op


class _Recorder(TorchDispatchMode):
    """The collectives dispatched (``_c10d_functional``), with their bytes, since ``take``."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[tuple[str, int]] = []

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None
                           ) -> Any:
        from torch.distributed.tensor import DTensor

        if isinstance(func, torch._ops.HigherOrderOperator):
            return func(*args, **(kwargs or {}))
        if any(t is DTensor for t in types):
            # Modes run before subclasses: DTensor runs first, and its collectives come back
            # here (as torch.distributed.tensor.debug.CommDebugMode does).
            return NotImplemented
        out = func(*args, **(kwargs or {}))
        name = func.__name__.split(".")[0]
        if func.namespace == "_c10d_functional" and name in _RING:
            sized = out if name in ("all_gather_into_tensor", "all_reduce") else args[0]
            self.seen.append((name, sized.numel() * sized.element_size()))
        return out

    def take(self) -> list[tuple[str, int]]:
        seen, self.seen = self.seen, []
        return seen


class _Interpreter(torch.fx.Interpreter):
    """A segment run node by node, each op's shares and collectives recorded by its name."""

    def __init__(self, module: torch.fx.GraphModule, recorder: _Recorder, found: _Found) -> None:
        super().__init__(module, garbage_collect_values=True)
        self.recorder, self.found = recorder, found
        self.timing = False

    def run_node(self, n: torch.fx.Node) -> Any:
        if n.op != "call_function":
            return super().run_node(n)
        if self.timing:
            began = time.perf_counter()
            out = super().run_node(n)
            took = time.perf_counter() - began
            self.found.seconds[n.name] = min(self.found.seconds.get(n.name, took), took)
            return out
        self.recorder.take()
        try:
            out = super().run_node(n)
        except (RuntimeError, ValueError, NotImplementedError) as error:
            raise SplitError(n.name, error) from error
        ins = [self.env[a] for a in n.all_input_nodes if a in self.env]
        params = [self.env[a] for a in n.all_input_nodes if a.op == "get_attr" and a in self.env]
        outs = [x for x in torch.utils._pytree.tree_leaves(out) if isinstance(x, torch.Tensor)]
        self.found.share[n.name] = min((_fraction(x) for x in (*ins, *outs)), default=1.0)
        self.found.param_share[n.name] = min((_fraction(p) for p in params), default=1.0)
        self.found.param_bytes[n.name] = (sum(_nbytes(p, local=True) for p in params),
                                          sum(_nbytes(p, local=False) for p in params))
        self.found.output_share[n.name] = min((_fraction(x) for x in outs), default=1.0)
        if any(_is_dtensor(x) for x in (*ins, *outs)):
            self.found.on_dtensors.add(n.name)
        if self.found.hooks:
            found, recorder = self.found, self.recorder
            for x in outs:
                if x.requires_grad:
                    x.register_hook(functools.partial(_hook, found, n.name, recorder))
        taken = self.recorder.take()
        if taken:
            self.found.collectives.setdefault(n.name, []).extend(taken)
        return out


def _hook(found: _Found, op: str, recorder: _Recorder, grad: Any) -> None:
    found.reached(op, recorder)


def _is_dtensor(value: Any) -> bool:
    from torch.distributed.tensor import DTensor

    return isinstance(value, DTensor)


def _whole(value: Any) -> Any:
    from torch.distributed.tensor import DTensor

    return value.full_tensor() if isinstance(value, DTensor) else value


def _run_with(interpreter: _Interpreter) -> Any:
    def forward(*args: Any) -> Any:
        return interpreter.run(*args)
    return forward


def _nbytes(value: Any, *, local: bool) -> int:
    """The bytes of ``value``, rank 0's part of it (``local``) or whole."""
    from torch.distributed.tensor import DTensor

    if isinstance(value, DTensor) and local:
        value = value.to_local()
    return value.numel() * value.element_size() if isinstance(value, torch.Tensor) else 0


def _fraction(value: Any) -> float:
    """The share of ``value`` rank 0 holds: 1 for a plain tensor or a replicated DTensor."""
    from torch.distributed.tensor import DTensor

    if not isinstance(value, DTensor) or not value.numel():
        return 1.0
    return value.to_local().numel() / value.numel()


Collectives = Mapping[str, tuple[tuple[str, int], ...]]  # per op: (kind, bytes) in order


def ring_pricer(problem: Problem, devices: tuple[str, ...]) -> Any:
    """The price of one collective of DTensor's (its kind, its bytes) among ``devices`` of
    ``problem``'s cluster: a ring over the slowest link between them."""
    bandwidth, latency = ring_link(problem.cluster, list(devices))

    def ring(kind: str, nbytes: int) -> float:
        formula = ring_allreduce_s if _RING[kind] == "allreduce" else ring_allgather_s
        return formula(nbytes, len(devices), bandwidth_bytes_per_s=bandwidth,
                       latency_s=latency)

    return ring


def measured_scale(ring: Any, tables: Iterable[Collectives],
                   collectives_s: float | None) -> float:
    """What each ring's time is multiplied by: the measured ``collectives_s`` of every
    collective of ``tables`` over the rings' sum (1 without a measurement)."""
    rings = sum(ring(kind, nbytes) for table in tables for per in table.values()
                for kind, nbytes in per)
    return collectives_s / rings if collectives_s is not None and rings else 1.0


def tensor_problem(problem: Problem, observed: Observed, devices: tuple[str, ...], *,
                   measured: bool = False, collectives_s: float | None = None) -> Problem:
    """``problem`` (the forward, whose nodes hold traced ops) as one of ``devices`` runs its
    part of it: every node on ``devices[0]``, its time, parameters and output scaled by its
    ops' mean shares, its launch grown by DTensor's dispatch on the host
    (``Observed.overhead_s``; ``measured``: its time its ops' ``observed.seconds``, dispatch
    included, where the devices are this machine's CPU workers), and the collectives its ops
    waited for added to its time, each a ring over ``devices`` (see the module's docstring),
    or ``collectives_s``, all of a pass's measured (``profile.allreduce``, mode
    ``collectives``), shared by the rings' times."""
    ring = ring_pricer(problem, devices)

    def share_of(ops: tuple[str, ...]) -> float:
        """The node's share of its work: its ops' shares weighted by their unsplit times."""
        known = [(observed.share[op], observed.plain_seconds.get(op, 1.0)) for op in ops
                 if op in observed.share]
        weight = sum(w for _, w in known)
        return sum(f * w for f, w in known) / weight if known and weight else 1.0

    def params_of(ops: tuple[str, ...]) -> float:
        local = sum(observed.param_bytes.get(op, (0, 0))[0] for op in ops)
        whole = sum(observed.param_bytes.get(op, (0, 0))[1] for op in ops)
        return local / whole if whole else 1.0

    def output_of(ops: tuple[str, ...]) -> float:
        last = [op for op in ops if op in observed.output_share]
        return observed.output_share[last[-1]] if last else 1.0

    scale = measured_scale(ring, [observed.collectives], collectives_s)
    one = restrict(problem, devices[:1])
    device, host = devices[0], one.costs.host
    nodes, compute, launches = [], {}, {}
    last = one.graph.nodes[-1].name
    for node in one.graph.nodes:
        share = share_of(node.ops)
        held = int(node.param_bytes * params_of(node.ops))
        out = int(node.output_bytes * output_of(node.ops))
        nodes.append(replace(node, param_bytes=held, output_bytes=out,
                             trainable_bytes=min(node.trainable_bytes, held),
                             view_bytes=min(node.view_bytes, out)))
        waited = (*node.ops, OUTPUTS) if node.name == last else node.ops
        waits = scale * sum(ring(kind, nbytes) for op in waited
                            for kind, nbytes in observed.collectives.get(op, ()))
        launch = host.launch_of(node.name, device) if host is not None else 0.0
        t = one.costs.compute_s[node.name][device]
        if measured and any(op in observed.seconds for op in node.ops):
            t = sum(observed.seconds.get(op, 0.0) for op in node.ops)
            compute[node.name] = {device: max(t, launch) + waits}
            continue
        # The host launches each op, DTensor's dispatch included, and the device runs its share.
        dispatch = launch + sum(observed.overhead_s(op) for op in node.ops)
        launches[node.name] = {device: dispatch}
        compute[node.name] = {device: max(dispatch, launch + (t - launch) * share) + waits}
    if host is not None:
        host = replace(host, launch_s={**host.launch_s, **launches})
    kept = {n.name: n.output_bytes for n in nodes}
    edges = tuple(replace(e, bytes=min(e.bytes, kept[e.src])) for e in one.graph.edges)
    return replace(one, graph=replace(one.graph, nodes=tuple(nodes), edges=edges),
                   costs=replace(one.costs, compute_s=compute, host=host))

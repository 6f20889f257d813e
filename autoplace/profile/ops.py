"""Time every op of a traced model on one device, and the whole model's forward pass.

Read ``profile_device``: one walk of the traced fx graph in topological order on the device,
with the example inputs (real values of the traced shapes and dtypes), each op's signature looked
up in the cache, values freed after their last use (about one forward pass's memory). A miss:

- **in situ** on the CPU: ``_time_in_situ`` walks the graph again several times the same way
  and times one call of each op where it runs, between its neighbours (``Timer.per_call_s``).
  An op timed alone finds its data hot in the caches and its output memory mapped, so isolated
  times summed fell short of the whole pass; the emitted model runs the same ops in the same
  order, so in-situ times are what it pays (``docs/profiling.md``, "In situ, not in isolation");
- **in isolation** on GPUs: ``timing.measure`` with CUDA events, plus the allocator's peak for
  the op's workspace; an op that fails alone is timed after the op before it, that time
  subtracted. An op that cannot run here stops the walk (later ops keep the best costs there
  are); the whole forward pass is timed once per model and device and cached with the ops.
"""

from __future__ import annotations

import copy
import hashlib
import json
import statistics
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.fx

from autoplace.ir import Device
from autoplace.profile.cache import OpRecord, ProfileCache
from autoplace.profile.cost import node_family
from autoplace.profile.timing import (
    Measurement,
    Timer,
    is_stable,
    measure,
    relative_spread,
    timer_for,
)
from autoplace.trace import TracedModel, attr_of
from autoplace.trace.count import flat_inputs, value_bytes

__all__ = ["DeviceProfile", "OpProfile", "op_signature", "profile_device"]

Progress = Callable[[str, int, int], None]  # (op name, done, total)


@dataclass(frozen=True, kw_only=True)
class OpProfile:
    """One op's measured time on one device. ``method``: ``in-situ`` (timed where it runs in
    the model), ``isolated``, ``with-neighbour`` (timed with the op before it), or ``cached`` (an
    earlier identical op, this run or before)."""

    node: str
    signature: str
    median_s: float
    spread: float
    samples: int
    param_bytes: int
    output_bytes: int
    workspace_bytes: int | None
    method: str


@dataclass(frozen=True, kw_only=True)
class DeviceProfile:
    """Every op measured on one device, and the whole forward pass for comparison."""

    device: str
    torch_device: str
    device_key: str
    device_type: str
    ops: Mapping[str, OpProfile]
    whole_forward: Measurement | None
    notes: tuple[str, ...] = ()
    unmeasured: tuple[str, ...] = ()
    measured_now: int = 0
    from_cache: int = 0
    wall_s: float = 0.0
    extra: Mapping[str, Any] = field(default_factory=dict)

    @property
    def sum_s(self) -> float:
        """The sum of the ops' median times, as timed one by one."""
        return sum(p.median_s for p in self.ops.values())

    @property
    def whole_scale(self) -> float:
        """What the ops' times are scaled by so that, on the CPU, they add up to the whole
        pass where it took longer: ops timed in situ leave out the interpreter's work between
        them and the ops that launch nothing (views, checks), which the emitted model pays
        all the same. 1 on a GPU (ops timed alone), or without a whole pass."""
        whole = self.whole_forward
        if (whole is None or not self.ops or not self.sum_s
                or torch.device(self.torch_device).type != "cpu"):
            return 1.0
        return max(1.0, whole.median_s / self.sum_s)


def _describe(value: Any) -> Any:
    """A JSON-able description of an argument: tensors by shape and dtype, the rest by value."""
    if isinstance(value, torch.Tensor):
        return ["T", list(value.shape), str(value.dtype).removeprefix("torch.")]
    if isinstance(value, (list, tuple)):
        return [_describe(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _describe(v) for k, v in sorted(value.items())}
    if isinstance(value, torch.device):
        return "device"  # where it runs is the cache's device key, not the signature
    if isinstance(value, (int, float, bool, str)) or value is None:
        return value
    return repr(value)


def op_signature(target: str, args: Any, kwargs: Mapping[str, Any]) -> str:
    """The op's cache key: target, then every argument (tensors as shape and dtype)."""
    return json.dumps([target, _describe(list(args)), _describe(dict(kwargs))],
                      separators=(",", ":"))


def _to_device(value: Any, device: torch.device) -> Any:
    if isinstance(value, torch.Tensor):
        return value.to(device)
    if isinstance(value, torch.device):
        return device
    if isinstance(value, (list, tuple)):
        return type(value)(_to_device(v, device) for v in value)
    if isinstance(value, dict):
        return {k: _to_device(v, device) for k, v in value.items()}
    return value


def _mutates(node: torch.fx.Node) -> bool:
    schema = getattr(node.target, "_schema", None)
    if schema is not None:
        return bool(schema.is_mutable)
    name = node.target if isinstance(node.target, str) else getattr(node.target, "__name__", "")
    return str(name).endswith("_") and not str(name).endswith("__")


def _callable(gm: torch.fx.GraphModule, node: torch.fx.Node) -> Callable[..., Any]:
    if node.op == "call_module":
        return gm.get_submodule(str(node.target))
    if node.op == "call_method":
        return lambda self_, *a, **k: getattr(self_, str(node.target))(*a, **k)
    return node.target  # call_function


def _inputs(node: torch.fx.Node, env: Mapping[str, Any], dev: torch.device) -> tuple[Any, Any]:
    """The op's arguments and keyword arguments, with the values computed so far, on ``dev``."""
    call_args = torch.fx.node.map_arg(node.args, lambda a: env[a.name])
    call_kwargs = torch.fx.node.map_arg(node.kwargs, lambda a: env[a.name])
    return _to_device(call_args, dev), _to_device(call_kwargs, dev)


def _record(profile: OpProfile, ir: Any, *, device_key: str, device_type: str) -> OpRecord:
    """The cache row of a fresh measurement."""
    return OpRecord(
        signature=profile.signature, device_key=device_key, device_type=device_type,
        family=node_family(ir), dtype=ir.dtype, flops=ir.flops,
        bytes_accessed=float(ir.bytes_accessed), launches=ir.launches,
        median_s=profile.median_s, spread=profile.spread, samples=profile.samples,
        param_bytes=profile.param_bytes, output_bytes=profile.output_bytes,
        workspace_bytes=profile.workspace_bytes, method=profile.method)


def profile_device(
    traced: TracedModel,
    model: torch.nn.Module | None,
    args: tuple,
    kwargs: Mapping[str, Any],
    *,
    device: Device,
    device_key: str,
    cache: ProfileCache,
    timer: Timer | None = None,
    progress: Progress | None = None,
    whole_forward: bool = True,
    in_situ: bool | None = None,
) -> DeviceProfile:
    """Time every op of ``traced`` that launches work on ``device`` (see the module docstring).

    ``model``: the original module; without it (None) the traced graph's whole pass is not timed.
    ``timer`` defaults to the device's (``timing.timer_for``); tests pass their own.
    ``in_situ`` times ops where they run in the model rather than each alone; by default on the
    CPU only. A cached time is reused only when it was taken the same way.
    """
    began = time.perf_counter()
    dev = torch.device(device.torch_device)
    cuda = dev.type == "cuda"
    on = _OnDevice(device=device, device_key=device_key, cache=cache, dev=dev, cuda=cuda,
                   timer=timer or timer_for(device.torch_device),
                   in_situ=(not cuda) if in_situ is None else in_situ)
    gm = traced.module
    fx_nodes = list(gm.graph.nodes)
    free_at = _free_schedule(fx_nodes)
    walk = _Walk(ir_node={n.name: n for n in traced.graph.nodes},
                 wanted={n.name for n in traced.graph.nodes if not n.is_input and n.launches > 0})
    with torch.no_grad():
        end = _first_walk(gm, fx_nodes, args, kwargs, on=on, walk=walk, free_at=free_at,
                          progress=progress)
        if walk.pending:
            samples = _time_in_situ(gm, fx_nodes[:end], args, kwargs, dev=dev, timer=on.timer,
                                    free_at=free_at,
                                    names={n for v in walk.pending.values() for n in v})
            _take_in_situ(samples, on=on, walk=walk)
            walk.ops = {n.name: walk.ops[n.name] for n in fx_nodes if n.name in walk.ops}
    cache.put_ops(walk.records)
    unmeasured = tuple(sorted(walk.wanted - set(walk.ops)))
    if walk.stopped is not None:
        walk.notes.append(f"profiling on {device.name} stopped at {walk.stopped}; the "
                          f"{len(unmeasured)} ops not measured keep calibrated or analytic costs")
    whole = (_whole_forward_cached(gm, args, kwargs, on=on, walk=walk)
             if whole_forward and model is not None and walk.stopped is None else None)
    return DeviceProfile(device=device.name, torch_device=device.torch_device,
                         device_key=device_key, device_type=device.type, ops=walk.ops,
                         whole_forward=whole, notes=tuple(walk.notes), unmeasured=unmeasured,
                         measured_now=walk.measured_now, from_cache=walk.from_cache,
                         wall_s=time.perf_counter() - began)


@dataclass(frozen=True, kw_only=True)
class _OnDevice:
    """Where and how ``profile_device`` times: fixed for one device."""

    device: Device
    device_key: str
    cache: ProfileCache
    dev: torch.device
    cuda: bool
    timer: Timer
    in_situ: bool


# The op before, to time an op together with: its node, a closure running it, its time (or 0).
_Previous = tuple[torch.fx.Node, Callable[[], Any], float]


@dataclass(kw_only=True)
class _Walk:
    """What the walks over one device gather; filled in as they go."""

    ir_node: Mapping[str, Any]
    wanted: set[str]
    ops: dict[str, OpProfile] = field(default_factory=dict)
    records: list[OpRecord] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)
    seen: dict[str, OpProfile] = field(default_factory=dict)  # by signature, this run
    signatures: list[str] = field(default_factory=list)
    # In situ: the signatures still to time and their nodes, and each node's inputs (for the
    # isolated fallback should the repeated walks fail) and output size.
    pending: dict[str, list[str]] = field(default_factory=dict)
    fallback: dict[str, tuple[Any, ...]] = field(default_factory=dict)
    output_bytes: dict[str, int] = field(default_factory=dict)
    previous: _Previous | None = None
    stopped: str | None = None
    measured_now: int = 0
    from_cache: int = 0
    done: int = 0

    def measured(self, profile: OpProfile, *, ir: Any, on: _OnDevice) -> None:
        """Count a fresh measurement and keep its cache row."""
        self.measured_now += 1
        self.records.append(_record(profile, ir, device_key=on.device_key,
                                    device_type=on.device.type))


def _free_schedule(fx_nodes: list[torch.fx.Node]) -> dict[int, list[str]]:
    """The values to drop after each position, that of their last reader. (An op timed with its
    neighbour needs the neighbour's inputs again: the neighbour's `run` closure keeps them.)"""
    index = {n.name: i for i, n in enumerate(fx_nodes)}
    free_at: dict[int, list[str]] = {}
    for n in fx_nodes:
        last_use = max((index[u.name] for u in n.users), default=index[n.name])
        free_at.setdefault(last_use, []).append(n.name)
    return free_at


def _first_walk(gm: torch.fx.GraphModule, fx_nodes: list[torch.fx.Node], args: tuple,
                kwargs: Mapping[str, Any], *, on: _OnDevice, walk: _Walk,
                free_at: Mapping[int, list[str]], progress: Progress | None) -> int:
    """Run the graph once on the device, timing (or looking up, or setting aside for the in-situ
    walks) every wanted op. Returns the position where it ended: the output, or the op that
    could not run (``walk.stopped`` says why)."""
    inputs = iter(flat_inputs(gm, args, dict(kwargs)))
    env: dict[str, Any] = {}
    end = 0
    for end, node in enumerate(fx_nodes):
        for name in free_at.get(end - 1, ()):
            env.pop(name, None)
        if node.op == "output":
            break
        if node.op == "placeholder":
            env[node.name] = _to_device(next(inputs, None), on.dev)
            continue
        if node.op == "get_attr":
            env[node.name] = _to_device(attr_of(gm, str(node.target)), on.dev)
            continue
        fn_target = _callable(gm, node)
        call_args, call_kwargs = _inputs(node, env, on.dev)

        def run(f=fn_target, a=call_args, k=call_kwargs) -> Any:
            return f(*a, **k)

        # The op runs for real first (later ops need its value; an op whose state the op
        # before it sets up finds it set up), then is timed.
        try:
            env[node.name] = run()
        except Exception as exc:  # the op cannot run here at all
            walk.stopped = (f"{node.name} ({node.target}) failed on {on.device.torch_device}: "
                            f"{type(exc).__name__}: {str(exc).strip().splitlines()[0][:200]}")
            break
        if node.name in walk.wanted:
            if progress is not None:
                progress(node.name, walk.done, len(walk.wanted))
            _visit_op(node, fn_target, call_args, call_kwargs, value=env[node.name], on=on,
                      walk=walk)
            walk.done += 1
        if node.name in walk.ops or node.name in walk.fallback:
            walk.previous = (node, run,
                             walk.ops[node.name].median_s if node.name in walk.ops else 0.0)
    env.clear()
    return end


def _visit_op(node: torch.fx.Node, fn_target: Callable[..., Any], call_args: Any,
              call_kwargs: Any, *, value: Any, on: _OnDevice, walk: _Walk) -> None:
    """One wanted op on the first walk: an identical op's time from this run or the cache, a
    place in the in-situ walks, or a time taken now."""
    ir = walk.ir_node[node.name]
    target = ir.targets[0] if ir.targets else str(node.target)
    signature = op_signature(target, call_args, call_kwargs)
    walk.signatures.append(signature)
    profile = walk.seen.get(signature)
    if profile is None:
        cached = on.cache.get_op(signature, on.device_key)
        if cached is not None and (cached.method == "in-situ") == on.in_situ:
            profile = OpProfile(
                node=node.name, signature=signature, median_s=cached.median_s,
                spread=cached.spread, samples=cached.samples, param_bytes=cached.param_bytes,
                output_bytes=cached.output_bytes, workspace_bytes=cached.workspace_bytes,
                method="cached")
            walk.from_cache += 1
    if profile is None and on.in_situ:
        walk.pending.setdefault(signature, []).append(node.name)
        walk.fallback[node.name] = (node, fn_target, call_args, call_kwargs, walk.previous)
        walk.output_bytes[node.name] = value_bytes(value)
        return
    if profile is None:
        profile, note = _time_op(node, fn_target, call_args, call_kwargs, ir=ir,
                                 signature=signature, timer=on.timer, cuda=on.cuda, dev=on.dev,
                                 previous=walk.previous)
        if note:
            walk.notes.append(note)
        if profile is not None:
            walk.measured(profile, ir=ir, on=on)
    elif profile.node != node.name:
        profile = OpProfile(**{**profile.__dict__, "node": node.name, "method": "cached"})
    if profile is not None:
        walk.seen.setdefault(signature, profile)
        walk.ops[node.name] = profile


def _take_in_situ(samples: Mapping[str, list[float]], *, on: _OnDevice, walk: _Walk) -> None:
    """Each pending signature's time from the in-situ walks (pooled over its nodes), or, where
    the walks failed before it, timed alone."""
    for signature, names in walk.pending.items():
        pooled = [t for name in names for t in samples.get(name, ())]
        first, ir = names[0], walk.ir_node[names[0]]
        if pooled:
            profile: OpProfile | None = OpProfile(
                node=first, signature=signature, median_s=statistics.median(pooled),
                spread=relative_spread(pooled), samples=len(pooled), param_bytes=ir.param_bytes,
                output_bytes=walk.output_bytes[first], workspace_bytes=None, method="in-situ")
        else:  # the repeated walks failed before this op: time it alone
            fb_node, fb_fn, fb_args, fb_kwargs, fb_previous = walk.fallback[first]
            if fb_previous is not None and fb_previous[0].name in walk.ops:
                fb_previous = (*fb_previous[:2], walk.ops[fb_previous[0].name].median_s)
            profile, note = _time_op(fb_node, fb_fn, fb_args, fb_kwargs, ir=ir,
                                     signature=signature, timer=on.timer, cuda=on.cuda,
                                     dev=on.dev, previous=fb_previous)
            if note:
                walk.notes.append(note)
        if profile is None:
            continue
        walk.measured(profile, ir=ir, on=on)
        for k, name in enumerate(names):
            walk.ops[name] = profile if k == 0 else OpProfile(
                **{**profile.__dict__, "node": name, "method": "cached"})


def _whole_forward_cached(graph: torch.nn.Module, args: tuple, kwargs: Mapping[str, Any], *,
                          on: _OnDevice, walk: _Walk) -> Measurement | None:
    """The traced graph's whole pass, from the cache (keyed by its op signatures in order, under
    "graph": older records timed the original module) or timed now and stored."""
    model_key = hashlib.sha256("\n".join(["graph", *walk.signatures]).encode()).hexdigest()
    known = on.cache.get_forward(model_key, on.device_key)
    if known is not None:
        return Measurement(median_s=known[0], spread=known[1], samples=known[2], calls=1)
    whole = _whole_forward(graph, args, kwargs, dev=on.dev, timer=on.timer, notes=walk.notes)
    if whole is not None:
        on.cache.put_forward(model_key, on.device_key, median_s=whole.median_s,
                             spread=whole.spread, samples=whole.samples)
    return whole


def _time_in_situ(
    gm: torch.fx.GraphModule,
    nodes: list[torch.fx.Node],
    args: tuple,
    kwargs: Mapping[str, Any],
    *,
    dev: torch.device,
    timer: Timer,
    free_at: Mapping[int, list[str]],
    names: set[str],
    warmup: int = 1,
    min_passes: int = 9,
    max_passes: int = 200,
    min_s: float = 0.1,
    rel_tol: float = 0.03,
    budget_s: float = 5.0,
) -> dict[str, list[float]]:
    """Run ``nodes`` (the graph up to where the first walk stopped) again and again as the model
    runs them, values freed after their last use, and time one call of each op in ``names``
    where it runs. Returns each op's seconds, one per complete walk.

    After ``warmup`` walks that are not kept, stops like ``timing.measure``: once ``min_passes``
    walks and ``min_s`` seconds are in and the median walk's total of timed ops moved less than
    ``rel_tol``, at ``max_passes``, or when ``budget_s`` is spent (after at least 3). (A small
    model's walk takes well under a millisecond: ``min_s`` gives it enough walks for a median.)
    A walk that raises ends the timing; the walks completed before it count.
    Each timed call also carries the timer's own cost (two clock reads and a closure call, about
    0.2 us with ``time.perf_counter``), which is small beside any op that launches work.
    """
    inputs = [_to_device(v, dev) for v in flat_inputs(gm, args, dict(kwargs))]
    consts = {n.name: _to_device(attr_of(gm, str(n.target)), dev)
              for n in nodes if n.op == "get_attr"}
    # An in-place op would change the inputs or the model's state once more on every walk:
    # what it writes gets a fresh copy per walk.
    written = {a.name for n in nodes if _mutates(n) for a in n.all_input_nodes
               if a.op in ("placeholder", "get_attr")}
    samples: dict[str, list[float]] = {name: [] for name in names}
    totals: list[float] = []
    box: list[Any] = [None]
    began = time.perf_counter()
    passes = 0
    while len(totals) < max_passes:
        passes += 1
        env: dict[str, Any] = {}
        feed = iter(inputs)
        this: dict[str, float] = {}
        try:
            for i, node in enumerate(nodes):
                for name in free_at.get(i - 1, ()):
                    env.pop(name, None)
                if node.op in ("placeholder", "get_attr"):
                    value = next(feed, None) if node.op == "placeholder" else consts[node.name]
                    env[node.name] = copy.deepcopy(value) if node.name in written else value
                    continue
                fn = _callable(gm, node)
                a, k = _inputs(node, env, dev)
                if node.name not in samples:
                    env[node.name] = fn(*a, **k)
                    continue

                def call(fn: Callable[..., Any] = fn, a: Any = a, k: Any = k) -> None:
                    box[0] = fn(*a, **k)

                this[node.name] = timer.per_call_s(call, 1)
                env[node.name], box[0] = box[0], None
        except Exception:
            break
        finally:
            env.clear()
        if passes <= warmup:
            began = time.perf_counter()
            continue
        for name, seconds in this.items():
            samples[name].append(seconds)
        totals.append(sum(this.values()))
        if (len(totals) >= min_passes and time.perf_counter() - began >= min_s
                and is_stable(totals, rel_tol)):
            break
        if time.perf_counter() - began > budget_s and len(totals) >= 3:
            break
    return samples


def _time_op(
    node: torch.fx.Node,
    fn: Callable[..., Any],
    call_args: Any,
    call_kwargs: Any,
    *,
    ir: Any,
    signature: str,
    timer: Timer,
    cuda: bool,
    dev: torch.device,
    previous: tuple[torch.fx.Node, Callable[[], Any], float] | None,
) -> tuple[OpProfile | None, str | None]:
    """Time one op alone; if that fails, with the op before it. Returns the profile (None when
    neither worked) and a note for the user when something was unusual."""
    label = ir.targets[0] if ir.targets else str(node.target)
    a, k = call_args, call_kwargs
    if _mutates(node):
        # An in-place op timed over and over would keep changing the values the rest of the
        # model reads: time it on copies.
        a, k = copy.deepcopy((call_args, call_kwargs))

    def alone() -> Any:
        return fn(*a, **k)

    try:
        m = measure(alone, timer=timer)
        output_bytes, workspace = _memory(alone, cuda=cuda, dev=dev)
        return OpProfile(node=node.name, signature=signature, median_s=m.median_s,
                         spread=m.spread, samples=m.samples, param_bytes=ir.param_bytes,
                         output_bytes=output_bytes, workspace_bytes=workspace,
                         method="isolated"), None
    except Exception as exc:
        reason = f"{type(exc).__name__}: {str(exc).strip()[:160]}"
    if previous is None or previous[0] not in node.all_input_nodes:
        return None, (f"{node.name} ({label}) failed when timed alone ({reason}) and reads no "
                      "value of the op before it, so it cannot be timed with it either; it "
                      "keeps the best cost available")
    prev_node, prev_run, prev_s = previous

    def pair() -> Any:
        fresh = prev_run()
        return fn(*_substitute(call_args, node.args, prev_node, fresh),
                  **_substitute(call_kwargs, node.kwargs, prev_node, fresh))

    try:
        m = measure(pair, timer=timer)
    except Exception as exc:
        return None, (f"{node.name} ({label}) failed when timed alone ({reason}) and together "
                      f"with {prev_node.name} ({type(exc).__name__}); it keeps the best cost "
                      "available")
    return OpProfile(node=node.name, signature=signature,
                     median_s=max(m.median_s - prev_s, 0.0), spread=m.spread,
                     samples=m.samples, param_bytes=ir.param_bytes,
                     output_bytes=ir.output_bytes, workspace_bytes=None,
                     method="with-neighbour"), (
        f"{node.name} ({label}) failed when timed alone ({reason}); it was timed together with "
        f"the op before it, {prev_node.name}, whose time was subtracted")


def _substitute(values: Any, fx_args: Any, prev_node: torch.fx.Node, fresh: Any) -> Any:
    """``values`` with every position that ``fx_args`` fills from ``prev_node`` set to
    ``fresh``."""
    if isinstance(fx_args, torch.fx.Node):
        return fresh if fx_args is prev_node else values
    if isinstance(fx_args, (list, tuple)):
        return type(values)(_substitute(v, a, prev_node, fresh) for v, a in zip(values, fx_args))
    if isinstance(fx_args, dict):
        return {key: _substitute(values[key], a, prev_node, fresh) for key, a in fx_args.items()}
    return values


def _memory(run: Callable[[], Any], *, cuda: bool, dev: torch.device) -> tuple[int, int | None]:
    """Output bytes of one call, and the transient workspace above them from the CUDA
    allocator's peak (None on the CPU, whose allocator keeps no peak)."""
    if not cuda:
        return value_bytes(run()), None
    torch.cuda.synchronize(dev)
    torch.cuda.reset_peak_memory_stats(dev)
    before = torch.cuda.memory_allocated(dev)
    out = run()
    torch.cuda.synchronize(dev)
    peak = torch.cuda.max_memory_allocated(dev)
    output_bytes = value_bytes(out)
    return output_bytes, max(0, peak - before - output_bytes)


def _whole_forward(model: torch.nn.Module, args: tuple, kwargs: Mapping[str, Any], *,
                   dev: torch.device, timer: Timer, notes: list[str]) -> Measurement | None:
    try:
        params = list(model.parameters()) + list(model.buffers())
        on_device = all(p.device == dev for p in params)
        target = model if on_device else copy.deepcopy(model).to(dev)
        a, k = _to_device(args, dev), _to_device(dict(kwargs), dev)
        with torch.no_grad():
            return measure(lambda: target(*a, **k), timer=timer, min_samples=7,
                           max_samples=30, budget_s=5.0)
    except Exception as exc:
        notes.append(f"the whole forward pass could not be timed on {dev} "
                     f"({type(exc).__name__}: {str(exc).strip()[:160]})")
        return None

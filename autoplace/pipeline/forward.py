"""The pipeline's first stages for a model: load (``load``: its checkpoint, mode and dtype), then
trace -> profile -> cost -> fold, its forward problem (``traced_problem``), which ``plan``
solves (``inference.py``) or turns into a training step's (``training.py``). Within
``reusing_traces`` (a plan), the last forward problem serves a call with the same model, inputs,
cluster and tracing again (a replica count's shard and the mesh's dp shard of that size)."""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from typing import Any

import torch

from autoplace.config import Config, Mode
from autoplace.emit.files.checkpoint import Referred, load_checkpoint
from autoplace.fold import fold
from autoplace.ir import Cluster, OpGraph, Problem
from autoplace.profile.cost import Tf32, analytic_cpu_note, tf32_note
from autoplace.profile.cost import costs as cost_nodes
from autoplace.progress import stage
from autoplace.progress.notes import collecting, note, note_all
from autoplace.solve.pins import Pins, pin_costs, pins_note, resolve_pins
from autoplace.trace import trace_model
from autoplace.trace.load import normalize_inputs
from autoplace.train.layers import set_layers
from autoplace.train.precision import cast, cast_notes

__all__ = ["Forward", "Loaded", "Tracing", "load", "reusing_traces", "traced_problem"]


@dataclass(frozen=True)
class Loaded:
    """The model as it is planned: its weights from the ``checkpoint`` (where one was given),
    in ``eval()`` mode (a training plan's: as ``--layers`` says, ``train.layers``), cast to
    the plan's dtype, with its example ``args``, ``kwargs`` and (training) ``targets`` so
    cast, and the ``loss`` of its outputs and targets (training; none: the model returns its
    loss)."""

    model: torch.nn.Module
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    targets: Any = ()
    loss: Callable[..., torch.Tensor] | None = None
    checkpoint: Referred | None = None


def load(model: torch.nn.Module, example_inputs: Any, config: Config, *,
         loss: Callable[..., torch.Tensor] | None = None, example_targets: Any = ()) -> Loaded:
    """Stage "load": the model and its examples as ``config`` plans them (``Loaded``)."""
    args, kwargs = normalize_inputs(example_inputs, where="example_inputs")
    source = None
    if config.checkpoint is not None:
        source, found = load_checkpoint(model, config.checkpoint)
        note_all(found)
    if config.mode == Mode.TRAINING:
        note(set_layers(model, config.training.layers))
    else:
        model.eval()
    model, (args, kwargs, targets) = cast(model, (args, kwargs, example_targets), config.dtype)
    note_all(cast_notes(config.dtype, training=config.mode == Mode.TRAINING))
    return Loaded(model=model, args=args, kwargs=kwargs, targets=targets, loss=loss,
                  checkpoint=source)


@dataclass(frozen=True)
class Tracing:
    """How ``plan`` traces and costs a model (``traced_problem``): the plan's name, and
    whether and how the devices here are profiled."""

    name: str
    profile: bool
    cache: Any
    progress: bool
    # Modules fixed to devices by hand (``autoplace.solve.pins``): module path -> device.
    pins: Mapping[str, str | int] | None = None
    # The model has run on its inputs already (a training step's loss check), so tracing need
    # not run it first.
    checked: bool = False
    # float32 matmuls and convolutions on TF32 cores (``Cost.tf32``; None: torch's settings).
    tf32: bool | None = None

    @classmethod
    def of(cls, config: Config, *, checked: bool = False) -> Tracing:
        return cls(name=config.name, profile=config.cost.profile, cache=config.cost.cache,
                   progress=config.cost.progress, pins=config.pins, checked=checked,
                   tf32=config.cost.tf32)


@dataclass(frozen=True)
class Forward:
    """A traced model, costed and folded: the forward problem the solver (or, for training,
    ``train.step_problem``) takes."""

    traced: Any
    profiled: Any
    graph: OpGraph
    folded: Any
    problem: Problem
    # With pins: the pins as resolved, and the same problem without them (what they cost).
    pins: Pins | None = None
    unpinned: Problem | None = None


# Within ``reusing_traces``: the last ``traced_problem`` call, what it was asked and what it
# gave (its forward problem and notes); one kept, so a plan holds at most one more trace.
_LAST: ContextVar[list[tuple[tuple[Any, ...], Forward, list[str]]] | None] = ContextVar(
    "autoplace_last_trace", default=None)


@contextmanager
def reusing_traces() -> Iterator[None]:
    """Within the block, ``traced_problem`` asked again what it was last asked gives back
    what it gave (a trace of 80 Llama-70B-wide layers takes about 25 s here)."""
    token = _LAST.set([])
    try:
        yield
    finally:
        _LAST.reset(token)


def _asked(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
           cluster: Cluster, how: Tracing) -> tuple[Any, ...]:
    """What a call of ``traced_problem`` depends on, to compare with ``==``: the model and
    cluster themselves, the inputs' structure and each tensor's shape, dtype, device, strides
    and storage (any other value as it is), and the tracing."""
    from torch.utils._pytree import tree_flatten

    leaves, spec = tree_flatten((args, kwargs))
    inputs = tuple(
        (tuple(x.shape), x.dtype, x.device, x.stride(), None if x.is_meta else x.data_ptr())
        if isinstance(x, torch.Tensor)
        else (type(x), x if isinstance(x, (int, float, str, type(None))) else _Same(x))
        for x in leaves)
    return _Same(model), _Same(cluster), spec, inputs, how


@dataclass(frozen=True, eq=False)
class _Same:
    """An object compared by identity (a model's ``==`` is its identity too, a cluster's is
    not: a call on another cluster object is not the same)."""

    what: Any

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _Same) and other.what is self.what


def traced_problem(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                    cluster: Cluster, how: Tracing) -> Forward:
    """Trace, profile (with ``how.profile``), cost and fold ``model`` on ``args``/``kwargs``:
    its forward problem on ``cluster`` (with the links measured here, when profiled). Within
    ``reusing_traces``, the last call's forward problem where it was asked the same, its
    notes made again."""
    last = _LAST.get()
    asked = _asked(model, args, kwargs, cluster, how) if last is not None else None
    if last and last[0][0] == asked:
        note_all(last[0][2])
        return last[0][1]
    with collecting() as notes:
        forward = _traced_problem(model, args, kwargs, cluster, how)
    note_all(notes)
    if last is not None:
        last[:] = [(asked, forward, notes)]
    return forward


def _traced_problem(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any],
                    cluster: Cluster, how: Tracing) -> Forward:
    stage("trace")
    traced = trace_model(model, args, kwargs, name=how.name, checked=how.checked)
    note_all(traced.notes)
    # Checked before profiling, which may take minutes: the pins need the ops and device names.
    pins = resolve_pins(model, traced.graph, cluster, how.pins) if how.pins else None
    profiled, graph = None, traced.graph
    if how.profile:
        from autoplace.emit.codegen.source import runtime_namespace
        from autoplace.profile import open_cache, profile_model

        cache = how.cache if how.cache is not None else open_cache()
        stage("profile")
        profiled = profile_model(traced, model, args, kwargs, cluster, cache=cache,
                                 progress=how.progress, engine=runtime_namespace())
        note_all(profiled.notes)
        cluster = profiled.apply_links(cluster)
        graph = profiled.with_workspace(graph)
    stage("cost")
    # as asked (--dtype tf32), else the user's settings, after the model file ran
    tf32 = Tf32.from_torch() if how.tf32 is None else Tf32(matmul=how.tf32, conv=how.tf32)
    costs = cost_nodes(graph, cluster,
                       measured=profiled.measured() if profiled else None,
                       fits=profiled.fits if profiled else None,
                       launcher=profiled.launcher if profiled else None,
                       worker=profiled.worker if profiled else None, tf32=tf32)
    note(analytic_cpu_note(graph, cluster, costs))
    note(tf32_note(graph, cluster, costs, tf32, asked=how.tf32 is True))
    stage("fold")
    unpinned = None
    if pins is not None:
        note(pins_note(pins, cluster.names))
        free = fold(graph, costs)
        unpinned = Problem(graph=free.graph, cluster=cluster, costs=free.costs)
        costs = pin_costs(costs, pins.device_of_op)
    folded = fold(graph, costs)
    return Forward(traced=traced, profiled=profiled, graph=graph, folded=folded,
                    problem=Problem(graph=folded.graph, cluster=cluster, costs=folded.costs),
                    pins=pins, unpinned=unpinned)

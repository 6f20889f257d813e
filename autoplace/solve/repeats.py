"""Solve: repeated blocks observed once. A model's layers are alike (a Llama's 80 decoder
layers, cut into FSDP2 units, are 80 runs of the same segments on weights of the same shapes,
split alike), and on fake tensors (a model on the meta device) what a segment records depends
only on its code, the metadata of what it is given (shapes, dtypes, autograd, DTensor
placements) and, in the backward, on the segments beside it. ``Repeats`` finds the longest run
of segments whose code repeats with a period (``periodic``): the first two periods and the last
run, and each period between repeats the second, given what the second was given, its outputs
(the same objects) standing for its own; so each period run keeps the neighbours it has in the
whole model. Its ops get the second period's records, position by position, once the pass and
its backward are done (``copy_into``). Real tensors are never skipped: their ops are timed.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import torch
from torch.utils import _pytree as pytree

from autoplace.trace import attr_of

__all__ = ["Repeats", "Unlike", "periodic"]

# _Found's records per op, each copied from an observed op to the ops that repeat it
_PER_OP = ("share", "param_share", "param_bytes", "output_share", "collectives", "backward")


class Unlike(Exception):
    """A segment to repeat another was given other metadata than it: observe every segment."""


@dataclass
class Repeats:
    """The segments of an emitted model in the order they run (``segments[i]``: ``seg{i}``'s
    fx graph module), the split of its parameters, and which segments repeat which
    (``periodic`` of each segment's ``_code``)."""

    segments: Sequence[torch.fx.GraphModule]
    split: Mapping[str, tuple[str, int]]
    template: dict[int, int] = field(default_factory=dict)
    # the segments repeated: the metadata of what each was given, and its outputs
    ran: dict[int, tuple[tuple[Any, ...], Any]] = field(default_factory=dict)
    # (segment observed, segment that repeats it), in the order they ran
    repeated: list[tuple[int, int]] = field(default_factory=list)

    def __post_init__(self) -> None:
        self.template = periodic([_code(index, segment, self.split)
                                  for index, segment in enumerate(self.segments)])

    def forward(self, index: int, run: Callable[..., Any]) -> Callable[..., Any]:
        """``seg{index}``'s forward: ``run`` (its interpreter), or where it repeats a segment,
        that segment's outputs; ``Unlike`` where it is given other metadata than that one."""
        repeats = self.template.get(index)
        kept = index in self.template.values()

        def forward(*args: Any) -> Any:
            if repeats is not None:
                given, out = self.ran.get(repeats, (None, None))
                if _metadata(args) != given:  # or it has not run yet
                    raise Unlike(f"seg{index} repeats seg{repeats} on other inputs")
                self.repeated.append((repeats, index))
                return out
            out = run(*args)
            if kept:
                self.ran[index] = _metadata(args), out
            return out
        return forward

    def copy_into(self, found: Any) -> None:
        """Each repeating segment's ops given the records of the ops they repeat."""
        for observed, index in self.repeated:
            pairs = zip(_ops(self.segments[observed]), _ops(self.segments[index]), strict=True)
            for source, target in pairs:
                for name in _PER_OP:
                    records = getattr(found, name)
                    if source in records:
                        value = records[source]
                        records[target] = list(value) if isinstance(value, list) else value
                if source in found.on_dtensors:
                    found.on_dtensors.add(target)


def periodic(codes: Sequence[Any]) -> dict[int, int]:
    """Of the segments' ``codes`` in the order they run, each segment to repeat another and
    that one: in the run of a period ``p`` with the most of them (the shortest period among
    equals), of ``m`` periods (4 or more), those of periods 3 to ``m - 1``, each repeating the
    segment at its place in period 2."""
    count, best = len(codes), {}
    for p in range(1, count // 4 + 1):
        start = 0
        while start + 4 * p <= count:
            end = start
            while end + p < count and codes[end] == codes[end + p]:
                end += 1
            periods = (end + p - start) // p
            if periods >= 4 and (periods - 3) * p > len(best):
                best = {start + k * p + j: start + p + j
                        for k in range(2, periods - 1) for j in range(p)}
            start = end + 1 if end > start else start + 1
    return best


def _ops(segment: torch.fx.GraphModule) -> list[str]:
    return [n.name for n in segment.graph.nodes if n.op == "call_function"]


def _code(index: int, segment: torch.fx.GraphModule, split: Mapping[str, tuple[str, int]]
          ) -> tuple[Any, ...]:
    """What ``seg{index}`` computes, comparable across segments: per node its kind and target,
    its arguments with each node read given by its position (a parameter by its shape, dtype,
    whether it is trained and how ``split`` splits it)."""
    position = {n: i for i, n in enumerate(segment.graph.nodes)}
    code = []
    for n in segment.graph.nodes:
        if n.op == "get_attr":
            value = attr_of(segment, str(n.target))
            code.append(("get_attr", tuple(value.shape), value.dtype, value.requires_grad,
                         split.get(f"seg{index}.{n.target}"))
                        if isinstance(value, torch.Tensor) else ("get_attr", repr(value)))
            continue
        if n.op == "placeholder":  # named for what it is given: the position says it
            code.append(("placeholder",))
            continue
        args = torch.fx.node.map_arg((n.args, n.kwargs), lambda a: ("node", position[a]))
        code.append((n.op, str(n.target), repr(args)))
    return tuple(code)


def _metadata(args: tuple[Any, ...]) -> tuple[Any, ...]:
    """What an observation on fake tensors reads of ``args``: each tensor's kind, shape,
    dtype and whether autograd records it, a DTensor's placements; any other value itself."""
    from torch.distributed.tensor import DTensor

    leaves, spec = pytree.tree_flatten(args)
    return (str(spec), *(
        (type(x).__name__, tuple(x.shape), x.dtype, x.requires_grad,
         tuple(x.placements) if isinstance(x, DTensor) else None)
        if isinstance(x, torch.Tensor) else repr(x) for x in leaves))

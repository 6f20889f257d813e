"""PipeDream profiles: the per-layer training costs PipeDream's profiler writes (``graph.txt``).

The format (msr-fiddle/pipedream, ``graph/graph.py``; the files in
``../shared/benchdata/pipedream``) is one line per layer and one tab-indented line per edge::

    node4 -- ReLU(inplace) -- forward_compute_time=2.513, backward_compute_time=2.620, ...
        activation_size=822083584.000, parameter_size=0.000         (on one line)
    \tnode1 -- node4

Times are milliseconds per minibatch (the profile's batch), sizes bytes: ``activation_size`` the
layer's output (several outputs, ``[6291456.0; 131072.0]``, summed), ``parameter_size`` its
weights. Node ids are the profiler's trace order; lines come in any order. ``read_profile`` returns
the layers in a topological order, stable in node-id order, in seconds and bytes, the file as it is
(``partitioner.training_chain`` drops what PipeDream's optimizer drops). Every mistake in a file is
a ``GraphError`` naming the file and the line (exit code 2).
"""

from __future__ import annotations

import math
import os
import re
from dataclasses import dataclass
from pathlib import Path

from autoplace.errors import AutoplaceError, GraphError
from autoplace.ir.graphs import topological_order

__all__ = ["Layer", "Profile", "parse_profile", "read_profile"]

MS = 1e-3  # the profiles' time unit, in seconds
FIELDS = ("forward_compute_time", "backward_compute_time", "activation_size", "parameter_size")
_NODE_ID = re.compile(r"node(\d+)")
_LAYER_FORM = ("nodeN -- <layer> -- forward_compute_time=MS, backward_compute_time=MS, "
               "activation_size=BYTES, parameter_size=BYTES")


@dataclass(frozen=True)
class Layer:
    """One profiled layer: its id in the file (``node4``), what it is (``Conv2d(...)``), and its
    costs for one minibatch."""

    name: str
    description: str
    forward_s: float
    backward_s: float
    activation_bytes: int
    parameter_bytes: int


@dataclass(frozen=True)
class Profile:
    """A profiled model: layers in topological order and the edges (producer, consumer)."""

    name: str
    layers: tuple[Layer, ...]
    edges: tuple[tuple[str, str], ...]


def read_profile(path: str | os.PathLike[str]) -> Profile:
    """Read a ``graph.txt`` profile; the profile is named after the file (``vgg16``)."""
    where = str(path)
    try:
        text = Path(path).read_text()
    except FileNotFoundError:
        raise AutoplaceError(f"profile {where!r} does not exist: check the path") from None
    except (OSError, UnicodeDecodeError) as exc:
        raise AutoplaceError(f"cannot read profile {where!r}: {exc}") from exc
    return parse_profile(text, where=where, name=Path(path).name.split(".")[0])


def parse_profile(text: str, *, where: str = "profile", name: str = "profile") -> Profile:
    """The ``Profile`` in ``text``; errors name ``where`` and the line."""
    layers: dict[str, Layer] = {}
    edges: list[tuple[str, str, int]] = []
    for number, line in enumerate(text.splitlines(), start=1):
        if not line.strip():
            continue
        if line[0].isspace():
            edges.append((*_edge(line, f"{where}:{number}"), number))
            continue
        layer = _layer(line, f"{where}:{number}")
        if layer.name in layers:
            raise GraphError(f"{where}:{number}: layer {layer.name!r} appears twice")
        layers[layer.name] = layer
    for src, dst, number in edges:
        for end in (src, dst):
            if end not in layers:
                raise GraphError(f"{where}:{number}: edge {src} -- {dst} names {end!r}, which "
                                 "no layer line defines")
    if not layers:
        raise GraphError(f"{where}: no layer lines; expected lines of the form {_LAYER_FORM}")
    ids = sorted(layers, key=_id_key)
    pairs = [(src, dst) for src, dst, _ in edges]
    try:
        order = topological_order(ids, pairs)
    except GraphError as exc:
        raise GraphError(f"{where}: {exc}") from None
    return Profile(name=name, layers=tuple(layers[v] for v in order), edges=tuple(pairs))


def _id_key(name: str) -> tuple[int, int, str]:
    """``node12`` after ``node9``: the profiler numbers nodes in the order it traced them; any
    other name after those, by name."""
    match = _NODE_ID.fullmatch(name)
    return (0, int(match.group(1)), "") if match else (1, 0, name)


def _edge(line: str, at: str) -> tuple[str, str]:
    parts = [part.strip() for part in line.strip().split(" -- ")]
    if len(parts) != 2 or not all(parts):
        raise GraphError(f"{at}: an indented line is an edge 'nodeA -- nodeB', got "
                         f"{line.strip()!r}")
    return parts[0], parts[1]


def _number(key: str, value: str, at: str) -> float:
    """A number, or a layer's several outputs ``[6291456.0; 131072.0]``, summed as PipeDream's
    ``Node.from_str`` sums them."""
    parts = value[1:-1].split(";") if value.startswith("[") and value.endswith("]") else [value]
    try:
        return sum(float(part) for part in parts)
    except ValueError:
        raise GraphError(f"{at}: {key}={value!r} is not a number") from None


def _layer(line: str, at: str) -> Layer:
    # The description may hold anything but the separator at either end: split at the first
    # and the last ' -- ' (GNMT's LSTM descriptions hold runs of spaces and parentheses).
    name, _, rest = line.partition(" -- ")
    description, _, costs = rest.rpartition(" -- ")
    if not name.strip() or not description.strip():
        raise GraphError(f"{at}: expected a layer line of the form {_LAYER_FORM}, got "
                         f"{line[:80]!r}")
    values: dict[str, float] = {}
    for item in costs.split(","):
        key, sep, value = item.strip().partition("=")
        if not sep:
            raise GraphError(f"{at}: {item.strip()!r} is not 'key=value' (expected {_LAYER_FORM})")
        values[key] = _number(key, value.strip(), at)
        if not (math.isfinite(values[key]) and values[key] >= 0):
            raise GraphError(f"{at}: {key}={value} must be a finite number >= 0")
    missing = [key for key in FIELDS if key not in values]
    if missing:
        raise GraphError(f"{at}: layer {name.strip()!r} lacks {', '.join(missing)}")
    return Layer(name=name.strip(), description=description.strip(),
                 forward_s=values["forward_compute_time"] * MS,
                 backward_s=values["backward_compute_time"] * MS,
                 activation_bytes=round(values["activation_size"]),
                 parameter_bytes=round(values["parameter_size"]))

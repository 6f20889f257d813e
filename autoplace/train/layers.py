"""Train: how a training step runs its layers (``--layers``): ``train``, as users train (dropout
on, batch norm normalizing by the batch and updating its running statistics), or ``eval``.

Read ``set_layers`` (the mode a training plan traces and runs the model in), ``kept_state``
(``trace.load``'s, kept here too: runs made while planning and checking leave the buffers and
the random state as they found them), then the exact comparison's tools: ``no_dropout`` (an
eager model run with every dropout probability at zero), ``zero_dropout`` (the same for an
emitted model's fx graphs, whose segments may run on worker threads that a
``TorchFunctionMode`` does not reach), ``dropout_ops`` and ``updates_statistics`` (what a traced
graph holds). A dropout of probability zero returns its input and draws nothing (ATen's
``_dropout_impl``), so a model in ``train()`` with zero probabilities computes what it computes
without dropout, batch norm still on the batch's statistics. ``docs/training.md``, "The
layers' mode".
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch
import torch.fx
import torch.nn.functional as F
from torch.overrides import TorchFunctionMode

from autoplace.trace.load import kept_state

__all__ = ["TRAINING_NOTES", "NoDropout", "dropout_ops", "in_eval", "kept_state", "no_dropout",
           "set_layers", "updates_statistics", "zero_dropout"]

TRAINING_NOTES = {
    "train": ("training plan: one step of one batch, planned and run with the layers as users "
              "train them (train(): dropout on, batch norm on the batch's statistics, updating "
              "its running ones); checked against the original with dropout's probabilities "
              "set to zero, the running statistics compared too, and with dropout on once to "
              "see it is active (--layers eval: as in eval())"),
    "eval": ("training plan: one step of one batch, planned and checked with the layers in "
             "eval() behaviour (dropout off, batch norm on running statistics; --layers eval), "
             "so that the emitted model's losses can be compared with the original's"),
}

aten = torch.ops.aten

# Calls that drop out, each with where its probability is (position, keyword) and where its
# ``train`` flag is (position, keyword; None: it always drops when the probability is not 0).
# The aten ops are what torch.export records; the functions, what torch.fx and eager code call.
_DROPOUT: dict[Any, tuple[tuple[int, str], tuple[int, str] | None]] = {
    **{op: ((1, "p"), (2, "train")) for op in (
        aten.dropout.default, aten.feature_dropout.default, aten.alpha_dropout.default,
        aten.feature_alpha_dropout.default, aten.native_dropout.default, torch.dropout,
        torch.feature_dropout, torch.alpha_dropout, torch.feature_alpha_dropout)},
    **{fn: ((1, "p"), (2, "training")) for fn in (
        F.dropout, F.dropout1d, F.dropout2d, F.dropout3d, F.alpha_dropout,
        F.feature_alpha_dropout)},
    **{fn: ((4, "dropout_p"), None) for fn in (
        aten.scaled_dot_product_attention.default, F.scaled_dot_product_attention)},
}


def set_layers(model: torch.nn.Module, layers: str) -> str | None:
    """Put ``model`` in the mode a training plan runs it in: ``eval`` calls ``eval()``;
    ``train`` keeps a model in ``train()`` as it is (a submodule the user set to ``eval()``,
    a batch norm frozen for fine-tuning, stays so) and calls ``train()`` on one in ``eval()``
    (``from_pretrained`` returns models so). The note that says so, or ``None``."""
    if layers == "eval":
        model.eval()
        return None
    if model.training:
        return None
    model.train()
    return ("the model was in eval() (from_pretrained returns models so): switched to train() "
            "for the training plan, as users train (--layers eval keeps eval())")


@contextlib.contextmanager
def in_eval(model: torch.nn.Module) -> Iterator[None]:
    """``model`` in ``eval()`` inside, each module in its own mode again afterwards."""
    modes = [(m, m.training) for m in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in modes:
            module.training = training


def _with_zero(args: tuple[Any, ...], kwargs: dict[str, Any],
               where: tuple[int, str]) -> tuple[tuple[Any, ...], dict[str, Any]]:
    """``args`` and ``kwargs`` with the probability at ``where`` set to zero."""
    position, keyword = where
    if keyword in kwargs:
        return args, {**kwargs, keyword: 0.0}
    if position < len(args):
        return (*args[:position], 0.0, *args[position + 1:]), kwargs
    return args, kwargs  # the default: no dropout (sdpa's) or one the call did not ask for


class NoDropout(TorchFunctionMode):
    """Every dropout this thread calls inside (``nn.Dropout``, ``F.dropout``, the attention's
    ``dropout_p``, their aten ops) runs with probability zero: an eager model (the original)
    as it computes without dropout. ``dropped`` counts the calls that would have dropped
    (probability above zero, in training)."""

    def __init__(self) -> None:
        super().__init__()
        self.dropped = 0

    def __torch_function__(self, func: Callable[..., Any], types: Any, args: tuple = (),
                           kwargs: dict[str, Any] | None = None) -> Any:
        kwargs = dict(kwargs or {})
        where = _DROPOUT.get(func)
        if where is not None:
            probability, train = where
            p = _argument(args, kwargs, probability)
            on = True if train is None else _argument(args, kwargs, train, default=True)
            self.dropped += isinstance(p, (int, float)) and p > 0 and on is not False
            args, kwargs = _with_zero(tuple(args), kwargs, probability)
        return func(*args, **kwargs)


def no_dropout() -> NoDropout:
    """``with no_dropout() as mode:`` (``NoDropout``)."""
    return NoDropout()


def _argument(args: tuple[Any, ...], kwargs: dict[str, Any], where: tuple[int, str], *,
              default: Any = None) -> Any:
    position, keyword = where
    if keyword in kwargs:
        return kwargs[keyword]
    return args[position] if position < len(args) else default


def _graphs(module: torch.nn.Module) -> list[torch.fx.GraphModule]:
    return [m for m in module.modules() if isinstance(m, torch.fx.GraphModule)]


def _p(node: torch.fx.Node, where: tuple[int, str]) -> Any:
    return _argument(node.args, dict(node.kwargs), where)


def _drops(node: torch.fx.Node) -> bool:
    """Whether ``node`` is a dropout of a probability above zero that runs (its train flag
    on, or none)."""
    if node.op != "call_function" or node.target not in _DROPOUT:
        return False
    probability, train = _DROPOUT[node.target]
    p = _p(node, probability)
    on = True if train is None else _p(node, train)
    return isinstance(p, (int, float)) and p > 0 and on is not False


def dropout_ops(module: torch.nn.Module) -> int:
    """How many dropouts that drop (``_drops``) the fx graphs in ``module`` hold."""
    return sum(_drops(n) for gm in _graphs(module) for n in gm.graph.nodes)


@contextlib.contextmanager
def zero_dropout(module: torch.nn.Module) -> Iterator[None]:
    """Every dropout in the fx graphs of ``module`` (an emitted model's segments) runs with
    probability zero inside, on whichever thread runs it; the graphs are as they were
    afterwards."""
    changed: list[tuple[torch.fx.GraphModule, torch.fx.Node, tuple, dict]] = []
    for gm in _graphs(module):
        for node in gm.graph.nodes:
            if _drops(node):
                changed.append((gm, node, node.args, dict(node.kwargs)))
                node.args, node.kwargs = _with_zero(node.args, dict(node.kwargs),
                                                    _DROPOUT[node.target][0])
    touched = list({id(gm): gm for gm, *_ in changed}.values())
    for gm in touched:
        gm.recompile()
    try:
        yield
    finally:
        for _, node, args, kwargs in changed:
            node.args, node.kwargs = args, kwargs
        for gm in touched:
            gm.recompile()


# batch norm's training flag and running mean, by position and keyword: aten's and torch.fx's.
_BATCH_NORM = {aten.batch_norm.default: ((5, "training"), (3, "running_mean")),
               F.batch_norm: ((5, "training"), (1, "running_mean"))}


def updates_statistics(module: torch.nn.Module) -> bool:
    """Whether the fx graphs in ``module`` update a batch norm's running statistics (a batch
    norm in training with them) or write a buffer in place (``_writes_state``)."""
    for gm in _graphs(module):
        for node in gm.graph.nodes:
            if node.op != "call_function":
                continue
            if node.target in _BATCH_NORM:
                training, stats = _BATCH_NORM[node.target]
                if _p(node, training) is True and _p(node, stats) is not None:
                    return True
            if _writes_state(node):
                return True
    return False


def _writes_state(node: torch.fx.Node) -> bool:
    """Whether ``node`` writes a tensor attribute (a buffer) in place, as its schema says
    (``Tensor(a!)``: ``num_batches_tracked.add_(1)``); an in-place op on an activation
    (``relu_``) writes no state."""
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return False
    for position, argument in enumerate(schema.arguments):
        if argument.alias_info is None or not argument.alias_info.is_write:
            continue
        value = (node.args[position] if position < len(node.args)
                 else node.kwargs.get(argument.name))
        if isinstance(value, torch.fx.Node) and value.op == "get_attr":
            return True
    return False

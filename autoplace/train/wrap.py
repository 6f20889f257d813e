"""Train: the module whose output is the loss, traced for a training plan and trained to verify
the emitted model (``LossModel``)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch

from autoplace.errors import ModelLoadError
from autoplace.trace.load import describe_failure

__all__ = ["LossModel", "loss_model", "training_targets"]

NO_LOSS_HINT = ("define `loss(outputs, *targets)` and `example_targets` in the model file (or "
                "pass `loss=` and `example_targets=` to `autoplace.plan`), or make the model "
                "return its scalar loss itself (transformers models do, given `labels`)")


class LossModel(torch.nn.Module):
    """``model`` followed by ``loss``: ``forward(*args, targets=(), **kwargs)`` returns
    ``loss(model(*args, **kwargs), *targets)``. Without ``loss`` the model's own output is the
    loss: a scalar tensor, or an output with a ``loss`` attribute (transformers' ``ModelOutput``
    when given labels)."""

    def __init__(self, model: torch.nn.Module, loss: Callable[..., torch.Tensor] | None) -> None:
        super().__init__()
        self.model = model
        self.loss = loss

    def forward(self, *args: Any, targets: tuple[Any, ...] = (), **kwargs: Any) -> torch.Tensor:
        out = self.model(*args, **kwargs)
        if self.loss is not None:
            return self.loss(out, *targets)
        return getattr(out, "loss", out) if not isinstance(out, torch.Tensor) else out


def training_targets(targets: Any) -> tuple[Any, ...]:
    """``example_targets`` as the tuple ``loss(outputs, *targets)`` takes: a tensor, a tuple or a
    list of them, or nothing (``None``, ``()``)."""
    if targets is None:
        return ()
    if isinstance(targets, torch.Tensor):
        return (targets,)
    if isinstance(targets, (tuple, list)):
        return tuple(targets)
    raise ModelLoadError(f"example_targets is a {type(targets).__name__}; it must be a tensor or "
                         "a tuple of tensors, the targets loss(outputs, *targets) takes")


def loss_model(model: torch.nn.Module, loss: Callable[..., torch.Tensor] | None,
               args: tuple[Any, ...], kwargs: dict[str, Any],
               targets: tuple[Any, ...]) -> LossModel:
    """``LossModel(model, loss)``, checked on the example inputs: it must return a scalar
    tensor that needs a gradient. Raises ``ModelLoadError`` saying what to change. A model on
    the meta device is not run: its trace is checked instead."""
    if loss is not None and not callable(loss):
        raise ModelLoadError(f"`loss` is a {type(loss).__name__}, not a function "
                             "loss(outputs, *targets)")
    if loss is not None and not targets:
        raise ModelLoadError("the model file defines loss() but no example_targets: define "
                             "example_targets, the targets loss(outputs, *targets) takes")
    wrapped = LossModel(model, loss)
    if any(t.is_meta for t in (*model.parameters(), *model.buffers())):
        # No values to run on (a model too large for this machine, or its shape only): the
        # trace checks the loss instead (``train.graph.step_problem``: one scalar output).
        return wrapped
    try:
        value = wrapped(*args, targets=targets, **kwargs)
    except Exception as exc:
        what = "the model and its loss" if loss is not None else "the model"
        raise ModelLoadError(describe_failure(
            exc, what=f"{what}, run on the example inputs and targets,",
            fix="Fix the model, its loss or the example inputs and targets (run "
                + ("`loss(model(*example_inputs), *example_targets)`" if loss is not None
                   else "`model(*example_inputs)`") + " once) and run again")) from exc
    if not isinstance(value, torch.Tensor):
        raise ModelLoadError(f"a training plan needs a scalar loss, but the model returns a "
                             f"{type(value).__name__}: {NO_LOSS_HINT}")
    if value.dim() != 0 and loss is None:
        raise ModelLoadError(f"a training plan needs a scalar loss, but the model returns a "
                             f"tensor of shape {list(value.shape)}: {NO_LOSS_HINT}")
    if value.dim() != 0:
        raise ModelLoadError(f"the loss has shape {list(value.shape)}, not a scalar: reduce it "
                             "(mean or sum) in loss(outputs, *targets)")
    if not value.requires_grad:
        raise ModelLoadError("the loss carries no gradient: no parameter of the model requires "
                             "one on the way to it (are they all frozen, or is the output "
                             "detached?); unfreeze the parameters to train")
    return wrapped

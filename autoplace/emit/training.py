"""Emit: an emitted training plan checked by training it (``verify_training``).

The emitted model of a training plan computes the loss (``train.LossModel`` traced and split as
the plan places its forward nodes); autograd runs each segment's backward on the device that
ran its forward, and each optimizer updates the parameters where they live, as the step graph
(``train.graph``) charges them. ``verify_training`` takes a few optimizer steps on a copy of the
original and on the emitted model, from the same weights, and compares the loss of every step,
then the gradients and the updated parameters, with ``torch.testing.assert_close``. Under Adam
the parameters are compared where the update is well conditioned (``_conditioned``); the
others are set to the original's before the next step (``_resync``), and the record counts
them.
"""

from __future__ import annotations

import copy
import re
from collections.abc import Callable, Mapping
from typing import Any

import torch

from autoplace.errors import VerificationError

__all__ = ["TRAINING_STEPS", "make_optimizer", "verify_training"]

TRAINING_STEPS = 3
# Adam's eps is 1e-8: an element whose gradient's root mean square is below 100 x eps has an
# ill-conditioned update (see ``_conditioned``).
ADAM_CONDITIONED = 1e-6
# assert_close's float32 rtol; the atol is this share of the tensor's largest magnitude.
RTOL, ATOL = 1.3e-6, 1e-4
_SEGMENT = re.compile(r"^seg\d+\.")


def make_optimizer(name: str, params: Any, lr: float | None = None) -> torch.optim.Optimizer:
    """``name``'s ``torch.optim`` optimizer with torch's defaults (``lr`` if given), one tensor
    at a time (``foreach=False``: the step graph's update temporaries are per tensor)."""
    extra = {} if lr is None else {"lr": lr}
    if name == "sgd":
        return torch.optim.SGD(params, foreach=False, **extra)
    if name == "sgd-momentum":
        return torch.optim.SGD(params, momentum=0.9, foreach=False, **extra)
    if name == "adam":
        return torch.optim.Adam(params, foreach=False, **extra)
    if name == "adamw":
        return torch.optim.AdamW(params, foreach=False, **extra)
    raise ValueError(f"unknown optimizer {name!r}")


def _named(module: torch.nn.Module, prefix: bool) -> dict[str, torch.nn.Parameter]:
    """Trainable parameters by name; an emitted model's lose their ``segN.`` prefix."""
    return {(_SEGMENT.sub("", n) if prefix else n): p
            for n, p in module.named_parameters(remove_duplicate=False) if p.requires_grad}


def verify_training(emitted: torch.nn.Module, original: torch.nn.Module, args: tuple[Any, ...],
                    kwargs: Mapping[str, Any], targets: tuple[Any, ...], *, optimizer: str,
                    steps: int = TRAINING_STEPS, lr: float | None = None,
                    emitted_step: Callable[[], torch.Tensor] | None = None) -> dict[str, Any]:
    """Train a copy of ``original`` (a ``train.LossModel``) and ``emitted`` for ``steps``
    steps of ``optimizer`` on the example inputs and targets, and compare them. Returns the
    record (``losses`` of both, the largest differences); raises ``VerificationError`` naming
    the first step and tensor that differ. ``emitted`` is trained in place: emit it again
    for an untrained copy. ``emitted_step`` runs the emitted model's forward and backward
    and returns the batch's loss (``microbatch.train_step``); by default it is called on the
    whole batch and its loss backpropagated."""
    reference = copy.deepcopy(original)
    ours, theirs = _named(emitted, prefix=True), _named(reference, prefix=False)
    _known(ours, theirs)
    opts = [make_optimizer(optimizer, dict.fromkeys(m.values()), lr) for m in (theirs, ours)]
    losses: list[list[float]] = [[], []]
    worst = {"grad": 0.0, "param": 0.0}
    masks: dict[str, torch.Tensor] = {}
    for step in range(steps):
        values = []
        for model, opt, record, run in zip((reference, emitted), opts, losses,
                                           (None, emitted_step)):
            opt.zero_grad()
            if run is None:
                loss = model(*args, targets=targets, **kwargs)
                loss.backward()
            else:
                loss = run()
            values.append(loss.detach().to("cpu"))
            record.append(float(values[-1]))
        _close(values[1], values[0], f"the loss at step {step + 1}")
        _all_trained(ours, theirs, step)
        for name, p in ours.items():
            worst["grad"] = max(worst["grad"], _close(
                p.grad, theirs[name].grad, f"the gradient of {name} at step {step + 1}"))
        for opt in opts:
            opt.step()
        for name, p in ours.items():
            worst["param"] = max(worst["param"], _compare_update(
                (opts[0], theirs[name]), (opts[1], p), f"{name} after step {step + 1}",
                masks, name, follow="emitted"))
    return {"status": "passed", "optimizer": optimizer, "steps": steps,
            "losses": losses[1], "original_losses": losses[0],
            "max_abs_diff_gradients": worst["grad"], "max_abs_diff_parameters": worst["param"],
            "ill_conditioned_elements": _apart(masks)}


def _known(ours: Mapping[str, Any], theirs: Mapping[str, torch.Tensor]) -> None:
    """Every trainable parameter of the emitted model (by name) is one of the original's."""
    unknown = sorted(set(ours) - set(theirs))
    if unknown:
        raise VerificationError(
            f"the emitted model has trainable parameters the original does not ({unknown[:3]}):"
            " it cannot be trained as the original is")


Updated = tuple[torch.optim.Optimizer, torch.Tensor]


def _compare_update(original: Updated, emitted: Updated, what: str,
                    masks: dict[str, torch.Tensor], name: str, *, follow: str) -> float:
    """``assert_close`` of one parameter after an update, the original's and the emitted
    model's (each with its optimizer), where the update is well conditioned
    (``_conditioned``); the largest difference. The elements set apart join ``masks[name]``
    and the side ``follow`` names (``emitted``, or ``original`` where the emitted model trains
    in other processes) takes the other's values there (``_resync``)."""
    (opt, param), (other, twin) = original, emitted
    keep = _conditioned(opt, param, other, twin)
    mine, ref = twin.detach().to("cpu"), param.detach().to("cpu")
    worst = _close(mine[keep] if keep is not None else mine,
                   ref[keep] if keep is not None else ref, what)
    if keep is not None and not bool(keep.all()):
        masks[name] = keep & masks.get(name, keep)
        if follow == "emitted":
            _resync(other, twin, opt, param, ~keep)
        else:
            _resync(opt, param, other, twin, ~keep)
    return worst


def _apart(masks: Mapping[str, torch.Tensor]) -> int:
    """How many elements ``_compare_update`` set apart, over every parameter."""
    return sum(int((~keep).sum()) for keep in masks.values())


def _all_trained(ours: Mapping[str, torch.Tensor], theirs: Mapping[str, torch.Tensor],
                 step: int) -> None:
    """Every parameter the original trains (a gradient reached it) is in the emitted model;
    one the forward never reads (an unused head) is in neither's graph."""
    compared = {id(theirs[name]) for name in ours}
    missing = sorted(name for name, p in theirs.items()
                     if p.grad is not None and id(p) not in compared)
    if missing:
        raise VerificationError(
            f"training check failed: the original trains {missing[:3]} at step {step + 1}, "
            "which the emitted model lacks")


def _conditioned(opt: torch.optim.Optimizer, param: torch.Tensor,
                 other: torch.optim.Optimizer, twin: torch.Tensor) -> torch.Tensor | None:
    """Under Adam, the elements whose update can be compared. Where ``sqrt(v_hat)`` is below
    ``ADAM_CONDITIONED`` on *both* sides, yet not zero, the update divides a gradient of about
    ``eps`` by its own root mean square, so float32 rounding in the gradient (1e-9 where it is
    1e-9) moves the parameter by a good part of the learning rate: those elements are not
    compared (from then on), and the next steps' losses and gradients check them. That holds
    where one side's gradient is exactly zero and the other's is rounding noise (micro-batches
    sum in another order: a key bias's gradient, zero in exact arithmetic, is 0 on one side and
    4e-11 on the other, which Adam turns into a step of 0.35% of the learning rate). An element
    well conditioned on either side (a gradient lost on one side), or zero on both, is compared.
    None (compare every element) for SGD."""
    small = [_small(o, t) for o, t in ((opt, param), (other, twin))]
    if small[0] is None or small[1] is None:
        return None
    (tiny, zero), (tiny_twin, zero_twin) = ((a.to("cpu"), b.to("cpu")) for a, b in small)
    return ~(tiny & tiny_twin) | (zero & zero_twin)


def _resync(opt: torch.optim.Optimizer, param: torch.Tensor, reference: torch.optim.Optimizer,
            twin: torch.Tensor, apart: torch.Tensor) -> None:
    """Set the ``apart`` (ill-conditioned) elements of ``param`` and of its Adam moments to the
    original's, so that the next step starts both models from the same point: otherwise the
    rounding noise Adam amplified there (up to the learning rate) moves every later gradient
    by a little (0.1% in GPT-2's first attention after one step of 4 micro-batches), and the
    next steps would compare that noise instead of the split."""
    with torch.no_grad():
        for mine, theirs in ((param, twin), *(
                (opt.state[param][key], reference.state[twin][key])
                for key in ("exp_avg", "exp_avg_sq", "max_exp_avg_sq")
                if key in opt.state[param])):
            where = apart.to(mine.device)
            mine[where] = theirs.to(mine.device)[where]


def _small(opt: torch.optim.Optimizer,
           param: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor] | None:
    """The elements whose ``sqrt(v_hat)`` is below ``ADAM_CONDITIONED``, and those where it is
    zero; ``None`` for an optimizer without Adam's second moment."""
    state = opt.state.get(param)
    if not state or "exp_avg_sq" not in state:
        return None
    beta2 = opt.param_groups[0]["betas"][1]
    v_hat = state["exp_avg_sq"] / (1 - beta2 ** float(state["step"]))
    return v_hat.sqrt() < ADAM_CONDITIONED, v_hat == 0


def _close(actual: torch.Tensor | None, expected: torch.Tensor | None, what: str) -> float:
    """``assert_close`` on the CPU; the largest absolute difference. A gradient present on one
    side only is a difference too."""
    if actual is None or expected is None:
        if actual is None and expected is None:
            return 0.0
        raise VerificationError(f"training check failed: {what} exists on one side only")
    actual, expected = actual.detach().to("cpu"), expected.detach().to("cpu")
    # The absolute tolerance scales with the tensor: a gradient of 1e-7 everywhere is not
    # "close" to zeros, as assert_close's fixed 1e-5 would have it.
    scale = float(expected.abs().max()) if expected.numel() else 0.0
    try:
        torch.testing.assert_close(actual, expected, rtol=RTOL, atol=ATOL * scale + 1e-12)
    except AssertionError as exc:
        raise VerificationError(f"training check failed: {what} differs from the original's: "
                                f"{str(exc).splitlines()[0]}") from None
    return float((actual.double() - expected.double()).abs().max()) if actual.numel() else 0.0

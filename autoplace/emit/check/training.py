"""Emit: an emitted training plan checked by training it (``verify_training``).

The emitted model of a training plan computes the loss (``train.LossModel`` traced and split as
the plan places its forward nodes); autograd runs each segment's backward on the device that
ran its forward, and each optimizer updates the parameters where they live, as the step graph
(``train.graph``) charges them. ``verify_training`` takes a few optimizer steps on a copy of the
original and on the emitted model, from the same weights, and compares the loss of every step,
then the gradients, the updated parameters and the buffers (batch norm's running statistics),
with ``torch.testing.assert_close``, every dropout's probability at zero on both sides
(``train.layers``), after one step with dropout on has shown it active. Under Adam
the parameters are compared where the update is well conditioned (``_conditioned``); the
others are set to the original's before the next step (``_resync``), and the record counts
them. A model in a half dtype (mixed precision) is stepped by ``train.optimizer.MasterWeights``
on both sides, its losses compared with that dtype's ``tolerance``, its gradients against the
original's in float32 (``_against_float32``), and each step from the same float32 masters.
"""

from __future__ import annotations

import contextlib
import copy
import re
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
from torch.utils import _pytree as pytree

from autoplace.emit.train.microbatch import split_batch
from autoplace.emit.train.optimizer import MasterWeights
from autoplace.errors import VerificationError
from autoplace.train.layers import (
    NoDropout,
    dropout_ops,
    kept_state,
    no_dropout,
    zero_dropout,
)

__all__ = ["TRAINING_STEPS", "dropout_active", "take_step_state", "tolerance", "verify_training"]

TRAINING_STEPS = 3
# float16: steps the check may skip for an overflow (``MasterWeights``), beside the steps it
# compares: enough to halve GradScaler's initial scale 2**16 down to 1.
SKIP_LIMIT = 16
# Adam's eps is 1e-8: an element whose gradient's root mean square is below 100 x eps has an
# ill-conditioned update (see ``_conditioned``).
ADAM_CONDITIONED = 1e-6
# assert_close's float32 rtol; the atol is this share of the tensor's largest magnitude.
RTOL, ATOL = 1.3e-6, 1e-4


# A half dtype's (rtol, eps) (docs/training.md, "Mixed precision"): assert_close's own rtol for
# the dtype, and its machine epsilon.
HALF_PRECISION: Mapping[str, tuple[float, float]] = {
    "bfloat16": (1.6e-2, 2**-7), "float16": (1e-3, 2**-10)}


# How many times the half original's own error (against float32) the emitted model's may be
# (``_against_float32``). The segments add a value's gradients from its readers in the half
# dtype where autograd sums them its own way: the example GPT-2 split over two CPU workers,
# in 2 bfloat16 micro-batches, measured 4.1 times (a layer norm's weight); a gradient 10% off
# in one layer of the MLP still fails (tests/test_precision.py).
HALF_ERROR = 8.0


def tolerance(dtype: str) -> tuple[float, float]:
    """``(rtol, atol)`` of the losses in ``dtype`` (the atol a share of the loss): float32's
    ``RTOL`` and ``ATOL``; a half dtype's rtol and 2 eps (it rounds at every op, and the
    emitted model's kernels may round apart from the original's)."""
    if dtype == "float32":
        return RTOL, ATOL
    rtol, eps = HALF_PRECISION[dtype]
    return rtol, 2 * eps


_SEGMENT = re.compile(r"^seg\d+\.")
Batch = tuple[tuple[Any, ...], dict[str, Any]]


def _named(module: torch.nn.Module, prefix: bool) -> dict[str, torch.nn.Parameter]:
    """Trainable parameters by name; an emitted model's lose their ``segN.`` prefix."""
    return {(_SEGMENT.sub("", n) if prefix else n): p
            for n, p in module.named_parameters(remove_duplicate=False) if p.requires_grad}


def _named_buffers(module: torch.nn.Module, prefix: bool) -> dict[str, torch.Tensor]:
    """Buffers by name (batch norm's running statistics and its count of batches), as
    ``_named``."""
    return {(_SEGMENT.sub("", n) if prefix else n): b
            for n, b in module.named_buffers(remove_duplicate=False)}


def verify_training(emitted: torch.nn.Module, original: torch.nn.Module, args: tuple[Any, ...],
                    kwargs: Mapping[str, Any], targets: tuple[Any, ...], *, optimizer: str,
                    steps: int = TRAINING_STEPS, lr: float | None = None,
                    emitted_step: Callable[..., torch.Tensor] | None = None,
                    dtype: str = "float32", microbatches: int = 1,
                    rule: str | None = "mean") -> dict[str, Any]:
    """Train a copy of ``original`` (a ``train.LossModel``) and ``emitted`` for ``steps``
    steps of ``optimizer`` on the example inputs and targets, and compare them. Returns the
    record (``losses`` of both, the largest differences); raises ``VerificationError`` naming
    the first step and tensor that differ. ``emitted`` is trained in place: emit it again
    for an untrained copy. ``emitted_step`` runs the emitted model's forward and backward
    and returns the batch's loss (``microbatch.train_step``); by default it is called on the
    whole batch and its loss backpropagated; under float16 it is called with
    ``loss_scale=`` the scale its backward is to start from.

    ``dtype``: the precision both models are in (``train.precision``); a half one is stepped
    through float32 master weights (``optimizer.MasterWeights``); its losses and gradients
    are compared with that dtype's ``tolerance`` and against the float32 original's
    (``_against_float32``), its updates from the same masters and
    gradients (``_same_start``, ``_restart``) with float32's; float16's overflowed steps are
    skipped on both sides, up to ``SKIP_LIMIT`` beside the ``steps`` compared. Where
    ``emitted_step`` runs ``microbatches`` M > 1 (their loss the ``rule``, mean or sum, of
    theirs), the original in a half dtype, or with its layers in ``train()`` (batch norm
    normalizes by each micro-batch), accumulates the same M micro-batches
    (``_reference_step``), not the whole batch.

    Both sides run with every dropout's probability at zero (``train.layers``: the original
    under ``no_dropout``, the emitted graphs under ``zero_dropout``), so that a model in
    ``train()`` is compared exactly, batch norm on the batch's statistics; the buffers both
    hold (batch norm's running statistics) are compared after every step, and a buffer the
    original's step updates must be the emitted model's too, and the original must drop out at
    as many places as the emitted graphs. Before the steps, emitted graphs with dropout run
    one step with it on and one without (``dropout_active``): their losses must differ. In
    float32 every step starts both from the original's weights (``_realign``)."""
    reference = copy.deepcopy(original)
    ours, theirs = _named(emitted, prefix=True), _named(reference, prefix=False)
    _known(ours, theirs)
    opts = [MasterWeights(optimizer, m.values(), dtype=dtype, lr=lr) for m in (theirs, ours)]
    tolerances = tolerance(opts[0].dtype)
    exact = _Float32(original, (args, {**kwargs, "targets": targets})) if opts[0].mixed else None
    in_train = any(m.training for m in original.modules())
    parts = (split_batch(tuple(args), {**kwargs, "targets": targets}, microbatches)
             if (opts[0].mixed or in_train) and microbatches > 1 else None)
    mine_buffers, their_buffers = _named_buffers(emitted, True), _named_buffers(reference, False)
    initial = {name: b.detach().to("cpu", copy=True) for name, b in their_buffers.items()}
    _compare_buffers(mine_buffers, their_buffers, initial, "before the first step")
    losses: list[list[float]] = [[], []]
    worst = {"grad": 0.0, "param": 0.0, "buffer": 0.0}
    masks: dict[str, torch.Tensor] = {}
    whole = (args, {**kwargs, "targets": targets})

    def emitted_run(opt: MasterWeights) -> torch.Tensor:
        if emitted_step is None:
            return _reference_step(emitted, opt, whole, parts, rule)
        return emitted_step() if opt.loss_scale == 1.0 else emitted_step(
            loss_scale=opt.loss_scale)

    steppers = (lambda opt: _reference_step(reference, opt, whole, parts, rule), emitted_run)
    dropout = dropout_active(emitted, lambda: emitted_run(opts[1]))
    done = 0
    for step in range(1, steps + SKIP_LIMIT + 1):
        if done == steps:
            break
        values = []
        for opt, record, run, off in zip(opts, losses, steppers,
                                         (no_dropout, lambda: zero_dropout(emitted))):
            opt.zero_grad()
            with off() as mode:
                loss = run(opt)
            values.append(loss.detach().to("cpu", torch.float32))
            record.append(float(values[-1]))
            if step == 1 and isinstance(mode, NoDropout):
                _same_dropouts(mode.dropped // len(parts or [whole]), dropout)
        _close(values[1], values[0], f"the loss at step {step}", tolerances)
        worst["buffer"] = max(worst["buffer"], _compare_buffers(
            mine_buffers, their_buffers, initial, f"after step {step}"))
        _all_trained(ours, theirs, step - 1)
        if not all(opt.finite() for opt in opts):
            # float16: a gradient overflowed under the loss scale. A split may overflow where
            # the original does not, or the other way: both skip the update and halve the
            # scale, and the check goes on to the next step.
            for opt in opts:
                opt.back_off()
            continue
        if exact is None:
            for name, p in ours.items():
                worst["grad"] = max(worst["grad"], _close(
                    p.grad, theirs[name].grad, f"the gradient of {name} at step {step}"))
        else:
            worst["grad"] = max(worst["grad"], _against_float32(
                ours, theirs, exact.gradients(theirs), opts[0], step))
        start = _same_start(opts, ours, theirs) if opts[1].mixed else {}
        for opt in opts:
            opt.step()
        for name, p in ours.items():
            worst["param"] = max(worst["param"], _compare_update(
                (opts[0].optimizer, opts[0].master(theirs[name])),
                (opts[1].optimizer, opts[1].master(p)), f"{name} after step {step}",
                masks, name, follow="emitted", start=start.get(name)))
        if opts[1].mixed:
            _restart(opts, ours, theirs)
        else:
            _realign(ours, theirs)
        opts[1].sync()
        done += 1
    if done < steps:
        raise VerificationError(
            f"training check failed: float16 gradients overflowed at {SKIP_LIMIT} steps, the "
            f"loss scale is down to {opts[1].loss_scale:g} ({opts[0].skipped} steps skipped): "
            "the original's or the emitted model's gradients are not finite")
    return {"status": "passed", "optimizer": optimizer, "steps": steps, "dtype": opts[0].dtype,
            "skipped_steps": opts[0].skipped,
            "losses": losses[1], "original_losses": losses[0],
            "max_abs_diff_gradients": worst["grad"], "max_abs_diff_parameters": worst["param"],
            "ill_conditioned_elements": _apart(masks), "max_abs_diff_buffers": worst["buffer"],
            "buffers_compared": len(set(mine_buffers) & set(their_buffers))} | dropout


def _compare_buffers(ours: Mapping[str, torch.Tensor], theirs: Mapping[str, torch.Tensor],
                     start: Mapping[str, torch.Tensor], when: str) -> float:
    """Every buffer of the original's that the emitted model holds too (by name) is equal
    to it ``when``; the largest difference. One the emitted model lacks fails where the
    original's value moved from its ``start`` (a running statistic the split lost); the
    emitted model's own (constants torch.export lifted) are not the original's."""
    worst = 0.0
    for name, buffer in theirs.items():
        if name in ours:
            worst = max(worst, _close(ours[name], buffer,
                                      f"buffer {name} (running statistics) {when}"))
        elif not torch.equal(buffer.detach().to("cpu"), start[name]):
            raise VerificationError(f"training check failed: the original updates buffer "
                                    f"{name} {when}, which the emitted model lacks")
    return worst


def _same_dropouts(original: int, dropout: Mapping[str, Any]) -> None:
    """The original drops out (in ``train()``) at as many places a forward as the emitted
    graphs hold dropouts that drop (``dropout``, ``dropout_active``'s record): a graph traced
    in ``eval()`` would pass the comparison at probability zero and train without dropout."""
    emitted = dropout.get("dropout_ops", 0)
    if original != emitted:
        raise VerificationError(
            f"training check failed: the original drops out at {original} place(s) a forward "
            f"and the emitted graphs at {emitted}: the emitted step does not run the layers as "
            "the original does (traced in another mode?)")


def dropout_active(emitted: torch.nn.Module, step: Callable[[], torch.Tensor]
                   ) -> dict[str, Any]:
    """Where ``emitted``'s graphs drop out (``train.layers.dropout_ops``): its ``step`` (which
    returns the loss) run once with dropout on and once at probability zero, its buffers, the
    random state and the gradients kept, and the record: ``dropout_ops``, the count, and
    ``loss_with_dropout``, the first run's loss. Raises ``VerificationError`` where the two
    losses are equal: dropout is not active in the step that runs."""
    ops = dropout_ops(emitted)
    if not ops:
        return {}
    losses = []
    for off in (contextlib.nullcontext, lambda: zero_dropout(emitted)):
        with kept_state(emitted), off():
            losses.append(float(step().detach().to("cpu", torch.float32)))
        for p in emitted.parameters():
            p.grad = None
    if losses[0] == losses[1]:
        raise VerificationError(
            f"training check failed: the emitted step's loss with its {ops} dropout(s) on is "
            f"the loss with them at probability zero ({losses[0]:.6g}): dropout is not active "
            "in the step that runs")
    return {"dropout_ops": ops, "loss_with_dropout": losses[0]}


def _known(ours: Mapping[str, Any], theirs: Mapping[str, torch.Tensor]) -> None:
    """Every trainable parameter of the emitted model (by name) is one of the original's."""
    unknown = sorted(set(ours) - set(theirs))
    if unknown:
        raise VerificationError(
            f"the emitted model has trainable parameters the original does not ({unknown[:3]}):"
            " it cannot be trained as the original is")


Updated = tuple[torch.optim.Optimizer, torch.Tensor]


def _compare_update(original: Updated, emitted: Updated, what: str,
                    masks: dict[str, torch.Tensor], name: str, *, follow: str,
                    start: torch.Tensor | None = None) -> float:
    """``assert_close`` of one parameter after an update, the original's and the emitted
    model's (each with its optimizer), where the update is well conditioned
    (``_conditioned``); the largest difference. The elements set apart join ``masks[name]``
    and the side ``follow`` names (``emitted``, or ``original`` where the emitted model trains
    in other processes) takes the other's values there (``_resync``). With ``start`` (mixed
    precision, ``_same_start``) both stepped from ``start`` on the same gradient, and their
    updates are compared, every element: no gradient noise for Adam to amplify."""
    (opt, param), (other, twin) = original, emitted
    keep = _conditioned(opt, param, other, twin) if start is None else None
    mine, ref = twin.detach().to("cpu"), param.detach().to("cpu")
    if start is not None:  # both updated from ``start``: their updates
        mine, ref = mine - start, ref - start
    if keep is not None:  # the elements set apart zero on both sides: equal, and no scale
        mine, ref = torch.where(keep, mine, 0), torch.where(keep, ref, 0)
    worst = _close(mine, ref, what)
    if keep is not None and not bool(keep.all()):
        masks[name] = keep & masks.get(name, keep)
        if follow == "emitted":
            _resync(other, twin, opt, param, ~keep)
        else:
            _resync(opt, param, other, twin, ~keep)
    return worst


def _reference_step(model: torch.nn.Module, opt: MasterWeights, whole: Batch,
                    parts: Sequence[Batch] | None, rule: str | None) -> torch.Tensor:
    """The original's forward and backward: on the ``whole`` batch, or, in a half dtype, on
    the emitted step's micro-batches (``parts``), their gradients accumulated in ``.grad``,
    each backward seeded as ``microbatch.train_step`` seeds it. A GEMM of B/M rows may round a
    pre-activation to the other side of a ReLU than the GEMM of B rows does, and the gradient
    of that row then differs by a whole term: from identical bfloat16 weights, at step 3 of
    the 784-256-128-10 MLP, the whole batch's gradient and 4 micro-batches' were 17 eps of the
    largest element apart. Whether the micro-batches make the batch (the cut, the rule) is
    checked in float32 and by ``loss_rule``. The batch's loss, detached."""
    if parts is None:
        args, kwargs = whole
        loss = model(*args, **kwargs)
        opt.backward(loss)
        return loss
    share = 1.0 / len(parts) if rule == "mean" else 1.0
    losses = []
    for args, kwargs in parts:
        loss = model(*args, **kwargs)
        loss.backward(torch.full_like(loss, share * opt.loss_scale))
        losses.append(loss.detach().to("cpu").double())
    return (sum(losses) * share).float()


class _Float32:
    """The original in float32, for the gradients a half step is measured against: each step
    it takes the half original's weights (exactly) and runs the whole batch (its floating
    inputs and targets cast up)."""

    def __init__(self, original: torch.nn.Module, whole: Batch) -> None:
        self.model = copy.deepcopy(original).float()
        self.params = _named(self.model, prefix=False)

        def up(x: Any) -> Any:
            return x.float() if isinstance(x, torch.Tensor) and x.is_floating_point() else x

        self.whole = pytree.tree_map(up, whole)

    def gradients(self, weights: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
        with torch.no_grad():
            for name, p in self.params.items():
                p.copy_(weights[name])
                p.grad = None
        args, kwargs = self.whole
        with no_dropout():
            self.model(*args, **kwargs).backward()
        return {name: p.grad for name, p in self.params.items()}


def _against_float32(ours: Mapping[str, torch.Tensor], theirs: Mapping[str, torch.Tensor],
                     exact: Mapping[str, torch.Tensor | None], reference: MasterWeights,
                     step: int) -> float:
    """The emitted model's half gradients (unscaled) against the float32 original's
    (``exact``), each tensor within ``HALF_ERROR`` times the half original's own largest
    error, 1 eps of the largest element and the dtype's rtol (as FlashAttention's tests hold a
    kernel to twice PyTorch's error in the same dtype): a reduction over many terms of both
    signs (a layer norm's weight, summed over every token) rounds by eps of its terms, not of
    its result, which no fixed share of the tensor bounds. The largest difference from the
    half original's gradient."""
    rtol, eps = HALF_PRECISION[reference.dtype]
    worst = 0.0
    for name, p in ours.items():
        mine, ref, truth = p.grad, theirs[name].grad, exact[name]
        if mine is None or ref is None or truth is None:
            _close(mine, ref, f"the gradient of {name} at step {step}")
            continue
        mine, ref = (g.detach().to("cpu", torch.float32) / reference.loss_scale
                     for g in (mine, ref))
        largest = float(truth.abs().max()) if truth.numel() else 0.0
        own = float((ref - truth).abs().max()) if truth.numel() else 0.0
        _close(mine, truth, f"the gradient of {name} at step {step} (against the float32 "
               f"original's, within {HALF_ERROR:g} times the {reference.dtype} original's "
               f"error, {own:.3g})", (rtol, eps + HALF_ERROR * own / largest if largest else eps))
        worst = max(worst, float((mine - ref).abs().max()) if mine.numel() else 0.0)
    return worst


def _same_start(opts: Sequence[MasterWeights], ours: Mapping[str, torch.Tensor],
                theirs: Mapping[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Under mixed precision, once the gradients are compared: the original's parameters take
    the emitted model's gradients, so that both optimizers step from the same masters
    (``_restart``) with the same gradients, and their updates must agree as float32's do.
    Stepping on its own gradients, a half gradient's rounding (within the dtype's tolerance)
    can move an Adam element by up to the learning rate, where its second moment is small or
    its moments cancel, and no tolerance on the update would both pass that and fail a missed
    update. The masters before the step, by name."""
    with torch.no_grad():
        for name, p in ours.items():
            twin = theirs[name]
            twin.grad = None if p.grad is None else p.grad.to(twin.device, copy=True)
    return {name: opts[0].master(theirs[name]).detach().to("cpu", copy=True) for name in ours}


def _restart(opts: Sequence[MasterWeights], ours: Mapping[str, torch.Tensor],
             theirs: Mapping[str, torch.Tensor]) -> None:
    """Under mixed precision, the emitted model's masters and optimizer state set to the
    original's after a step has been compared: each step is checked from the same point.
    Otherwise a master a rounding apart rounds to another half weight (one bfloat16 ulp of a
    weight of 0.03 is 1e-4, a tenth of Adam's step), a ReLU flips, and by step 3 a gradient
    of the 784-256-128-10 MLP cut into 2 micro-batches is off by 13% of its largest element:
    half-precision noise grown by training, not the split's doing."""
    (reference, emitted) = opts
    for name, p in ours.items():
        take_step_state(emitted.master(p), emitted.optimizer,
                        reference.master(theirs[name]), reference.optimizer)


def _realign(ours: Mapping[str, torch.Tensor], theirs: Mapping[str, torch.Tensor]) -> None:
    """In float32, once a step's updates are compared: the emitted model's parameters set to
    the original's, each optimizer keeping its own state, so that every step is compared from
    the same weights. Otherwise Adam turns the first gradients' rounding (6e-8 in T5's, summed
    in another order over 4 workers) into weights 5e-7 apart after two steps, and by step 3 a
    ReLU near zero flips and moves a few of the tied embedding's gradients by 1.6e-6, past the
    tolerance: training's noise grown, not the split's doing. A wrong update is caught at its
    own step, a lost optimizer state at the next."""
    with torch.no_grad():
        for name, p in ours.items():
            p.copy_(theirs[name].to(p.device))


def take_step_state(param: torch.Tensor, opt: torch.optim.Optimizer, source: torch.Tensor,
                    source_opt: torch.optim.Optimizer) -> None:
    """``param`` and its state in ``opt`` set to ``source``'s and its state in
    ``source_opt`` (each tensor the state has), on ``param``'s device: the next step starts
    from where the other side's did."""
    with torch.no_grad():
        param.copy_(source.to(param.device))
        state, other = opt.state[param], source_opt.state[source]
        for key, value in other.items():
            if isinstance(value, torch.Tensor) and key in state:
                state[key].copy_(value.to(state[key].device))


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


def _close(actual: torch.Tensor | None, expected: torch.Tensor | None, what: str,
           tolerance: tuple[float, float] | None = None) -> float:
    """``assert_close`` on the CPU; the largest absolute difference. A gradient present on one
    side only is a difference too."""
    if actual is None or expected is None:
        if actual is None and expected is None:
            return 0.0
        raise VerificationError(f"training check failed: {what} exists on one side only")
    actual, expected = actual.detach().to("cpu"), expected.detach().to("cpu")
    # The absolute tolerance scales with the tensor: a gradient of 1e-7 everywhere is not
    # "close" to zeros, as assert_close's fixed 1e-5 would have it.
    rtol, atol = tolerance or (RTOL, ATOL)
    # The scale is the finite elements' (an inf on both sides is equal, a nan is not).
    scale = (float(expected.abs().nan_to_num(nan=0.0, posinf=0.0).max()) if expected.numel()
             else 0.0)
    try:
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol * scale + 1e-12)
    except AssertionError as exc:
        raise VerificationError(f"training check failed: {what} differs from the original's: "
                                f"{' '.join(str(exc).splitlines()[:6])}") from None
    if not actual.numel():
        return 0.0
    both = torch.isfinite(actual) & torch.isfinite(expected)
    return float(torch.where(both, (actual.double() - expected.double()).abs(), 0.0).max())

"""Emit: ``MasterWeights``, the optimizer a training plan's emitted model is stepped with.

``train.graph.make_optimizer``'s optimizer, by name with torch's defaults, in the plan's
precision; the training check, the micro-batch step and ``autoplace run --train`` all step it.
In float32 it is that ``torch.optim`` optimizer over the parameters. Under mixed precision
(``train.precision``) it keeps a float32 *master* copy of each trained parameter on its device
and steps the optimizer over the masters: the half gradient copied into the master's ``.grad``,
the master updated, the half parameter set from it, tensor by tensor, so that one float32
gradient exists at a time (Micikevicius et al., "Mixed Precision Training", ICLR 2018, section
3.1; Megatron-LM's ``Float16OptimizerWithFloat16Params``).

float16 also scales the loss as ``torch.amp.GradScaler`` does by default (``init_scale`` 2**16,
``backoff_factor``, ``growth_factor``, ``growth_interval`` 2000): a step whose half gradients
hold an inf or a nan is skipped and the scale halved. bfloat16 has float32's range: no scaling.
"""

from __future__ import annotations

from collections.abc import Iterable

import torch

from autoplace.train.graph import make_optimizer
from autoplace.train.precision import check_dtype

__all__ = ["GROWTH_INTERVAL", "INIT_SCALE", "MasterWeights"]

# torch.amp.GradScaler's defaults.
INIT_SCALE, GROWTH_FACTOR, BACKOFF_FACTOR, GROWTH_INTERVAL = 2.0**16, 2.0, 0.5, 2000


class MasterWeights:
    """``optimizer`` (a name ``make_optimizer`` takes, with ``lr``) over ``params`` in
    ``dtype``'s way: directly for float32, through float32 master weights for a half dtype.
    A step: ``zero_grad()``, ``backward(loss)`` (or a backward seeded with ``loss_scale``),
    ``step()``."""

    def __init__(self, optimizer: str, params: Iterable[torch.Tensor], *, dtype: str = "float32",
                 lr: float | None = None) -> None:
        self.dtype = check_dtype(dtype)
        self.params = list(dict.fromkeys(params))  # a tied parameter once
        self.mixed = self.dtype != "float32"
        self.masters = [p.detach().to(torch.float32).clone().requires_grad_(True)
                        if self.mixed else p for p in self.params]
        self.optimizer = make_optimizer(optimizer, self.masters, lr)
        self.loss_scale = INIT_SCALE if self.dtype == "float16" else 1.0
        self.skipped = 0  # steps skipped for an inf or a nan
        self._finite_steps = 0

    def master(self, param: torch.Tensor) -> torch.Tensor:
        """The tensor the optimizer updates for ``param``: its master, or itself."""
        for p, m in zip(self.params, self.masters):
            if p is param:
                return m
        raise KeyError("not a parameter of this optimizer")

    def zero_grad(self) -> None:
        for p in self.params:
            p.grad = None

    def backward(self, loss: torch.Tensor) -> None:
        """``loss.backward()``, from ``loss_scale`` instead of 1."""
        (loss * self.loss_scale if self.loss_scale != 1.0 else loss).backward()

    def finite(self) -> bool:
        """Whether every gradient is finite; always under bfloat16 and float32, which are
        not scaled (an inf there is the model's, and the optimizer is left to meet it)."""
        return self.dtype != "float16" or all(
            bool(torch.isfinite(p.grad).all()) for p in self.params if p.grad is not None)

    def step(self) -> bool:
        """Update the parameters from their gradients; False where float16's step was skipped
        (a gradient held an inf or a nan)."""
        if not self.mixed:
            self.optimizer.step()
            return True
        if not self.finite():
            self.back_off()
            return False
        for p, m in zip(self.params, self.masters):
            if p.grad is None:
                continue
            m.grad = p.grad.to(torch.float32)
            if self.loss_scale != 1.0:
                m.grad.mul_(1.0 / self.loss_scale)
            self.optimizer.step()  # steps only the master with a gradient: this one
            m.grad = None
            with torch.no_grad():
                p.copy_(m)
        if self.dtype == "float16":
            self._finite_steps += 1
            if self._finite_steps == GROWTH_INTERVAL:
                self.loss_scale *= GROWTH_FACTOR
                self._finite_steps = 0
        return True

    def back_off(self) -> None:
        """Skip this step's update: the loss scale halves (float16; bfloat16 and float32 only
        count the skip)."""
        if self.dtype == "float16":
            self.loss_scale *= BACKOFF_FACTOR
        self._finite_steps, self.skipped = 0, self.skipped + 1

    def sync(self) -> None:
        """Set every half parameter from its master again (after a master was changed from
        outside: the check's ``_resync``)."""
        if self.mixed:
            with torch.no_grad():
                for p, m in zip(self.params, self.masters):
                    p.copy_(m)

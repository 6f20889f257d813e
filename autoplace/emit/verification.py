"""Emit: check an emitted model against the original with ``torch.testing.assert_close``.

``verify`` runs both models without gradients on the same inputs, brings the outputs to the CPU
and compares them (leaf by leaf when the emitted model returns a flat tuple); a mismatch raises
``VerificationError`` with the largest absolute difference.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch.utils import _pytree as pytree

from autoplace.errors import VerificationError

__all__ = ["VerifyResult", "verify"]


@dataclass(frozen=True)
class VerifyResult:
    """What ``verify`` found; it raises instead of returning a failure, so ``status`` is
    always ``"passed"``. ``detail`` is the line the report shows."""

    status: Literal["passed"]
    max_abs_diff: float
    detail: str


def verify(
    original: torch.nn.Module,
    emitted: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    rtol: float | None = None,
    atol: float | None = None,
) -> VerifyResult:
    """Run both models without gradients and compare their outputs on the CPU.

    ``rtol``/``atol`` go to ``torch.testing.assert_close`` (give both or neither). An emitted
    model saved with flat outputs is compared leaf by leaf.
    """
    if (rtol is None) != (atol is None):
        raise ValueError("pass both rtol and atol, or neither (as torch.testing.assert_close)")
    with torch.no_grad():
        expected = _to_cpu(original(*args, **kwargs))
        actual = _to_cpu(emitted(*args, **kwargs))
    expected_leaves, expected_spec = pytree.tree_flatten(expected)
    actual_leaves, actual_spec = pytree.tree_flatten(actual)
    how = "outputs"
    if expected_spec != actual_spec:
        if not isinstance(actual, tuple) or len(actual_leaves) != len(expected_leaves):
            raise VerificationError(
                f"the emitted model returns a different structure: expected {expected_spec}, "
                f"got {actual_spec}"
            )
        expected, actual, how = expected_leaves, actual_leaves, "flattened outputs"
    diff = _max_abs_diff(expected_leaves, actual_leaves)
    try:
        torch.testing.assert_close(actual, expected, rtol=rtol, atol=atol)
    except AssertionError as error:
        found = "; ".join(line.strip() for line in str(error).splitlines() if line.strip())
        raise VerificationError(
            f"the emitted model's {how} differ from the original's (max abs diff {diff:.3g}): "
            f"{found}. If the model is random at inference (sampling, added noise), its outputs "
            "cannot match: pass --no-verify (verify=False); otherwise this is an autoplace bug, "
            "please report it with the model"
        ) from error
    tensors = sum(isinstance(leaf, torch.Tensor) for leaf in expected_leaves)
    tolerance = "default tolerances" if rtol is None else f"rtol={rtol}, atol={atol}"
    detail = f"{tensors} tensor output(s) match with {tolerance}; max abs diff {diff:.3g}"
    return VerifyResult(status="passed", max_abs_diff=diff, detail=detail)


def _to_cpu(value: Any) -> Any:
    return pytree.tree_map(
        lambda x: x.detach().to("cpu") if isinstance(x, torch.Tensor) else x, value
    )


def _max_abs_diff(expected: list[Any], actual: list[Any]) -> float:
    largest = 0.0
    for a, b in zip(expected, actual):
        if not (isinstance(a, torch.Tensor) and isinstance(b, torch.Tensor)):
            continue
        if a.shape != b.shape or a.numel() == 0:
            continue
        if a.is_complex() or b.is_complex():
            delta = (a.to(torch.complex128) - b.to(torch.complex128)).abs()
        else:
            delta = (a.to(torch.float64) - b.to(torch.float64)).abs()
        largest = max(largest, float(delta.max()))
    return largest


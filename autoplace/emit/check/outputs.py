"""Emit: check an emitted model against the original with ``torch.testing.assert_close``.

``verify`` runs both models without gradients on the same inputs, brings the outputs to the CPU
and compares them (leaf by leaf when the emitted model returns a flat tuple); a mismatch raises
``VerificationError`` with the largest absolute difference. A match is the plan's
``Verification`` record, its memory still to be measured.

``check_peak`` compares the emitted model's measured peak bytes per planned device
(``check.memory``) with the plan's figure for that device: the plan's memory must be an
upper bound, so a measurement above it raises ``VerificationError`` (or, with ``enforce=False``,
is recorded as ``exceeded``).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from torch.utils import _pytree as pytree

from autoplace.errors import VerificationError
from autoplace.formats.plan import Verification

__all__ = ["ENFORCE_PEAK_DEFAULT", "PeakCheck", "check_peak", "max_abs_diff", "verify"]

# Whether a measured peak above the plan's figure fails verification by default: on, since the
# plan's figure is an upper bound (frees after last use, group and op workspace, the simulator's
# segment spans); ``--no-check-memory`` records the measurement without failing.
ENFORCE_PEAK_DEFAULT = True


@contextlib.contextmanager
def _full_precision() -> Iterator[None]:
    """TF32 off while verifying: cuDNN convolutions use it by default, so an emitted model on a
    GPU differs from the original on the CPU by TF32's rounding (Inception on an H200: 2.7e-5
    absolute, 0.5% relative), which says nothing about whether the split is right."""
    cudnn, matmul = torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32
    torch.backends.cudnn.allow_tf32 = torch.backends.cuda.matmul.allow_tf32 = False
    try:
        yield
    finally:
        torch.backends.cudnn.allow_tf32, torch.backends.cuda.matmul.allow_tf32 = cudnn, matmul


def verify(
    original: torch.nn.Module,
    emitted: torch.nn.Module,
    args: tuple[Any, ...],
    kwargs: dict[str, Any],
    *,
    rtol: float | None = None,
    atol: float | None = None,
) -> Verification:
    """Run both models without gradients and compare their outputs on the CPU: the plan's
    ``Verification``, ``passed`` (a mismatch raises), with the line the report shows.

    ``rtol``/``atol`` go to ``torch.testing.assert_close`` (give both or neither). An emitted
    model saved with flat outputs is compared leaf by leaf.
    """
    if (rtol is None) != (atol is None):
        raise ValueError("pass both rtol and atol, or neither (as torch.testing.assert_close)")
    with torch.no_grad(), _full_precision():
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
    diff = max_abs_diff(expected_leaves, actual_leaves)
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
    return Verification(status="passed", detail=detail, max_abs_diff=diff)


def _to_cpu(value: Any) -> Any:
    return pytree.tree_map(
        lambda x: x.detach().to("cpu") if isinstance(x, torch.Tensor) else x, value
    )


def max_abs_diff(expected: list[Any], actual: list[Any]) -> float:
    """The largest absolute difference between paired tensors of the same shape (in float64,
    or complex128), 0 where none compare."""
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



@dataclass(frozen=True)
class PeakCheck:
    """Measured against predicted peak bytes per plan device (``{"measured_bytes",
    "predicted_bytes"}``), measured by ``method``: ``within`` when no measurement exceeds its
    prediction, ``exceeded`` otherwise (only returned when not enforced), or ``not measured``
    (no ``method``, no ``peak_bytes``). ``detail`` is the line that says which."""

    status: Literal["within", "exceeded", "not measured"]
    detail: str
    peak_bytes: Mapping[str, Mapping[str, int]] = field(default_factory=dict)
    method: str | None = None


def check_peak(
    measured_bytes: Mapping[str, int],
    predicted_bytes: Mapping[str, int],
    *,
    method: str,
    enforce: bool = ENFORCE_PEAK_DEFAULT,
) -> PeakCheck:
    """Compare per device (plan device names); raise ``VerificationError`` when a measurement
    exceeds the plan's figure and ``enforce`` is on."""
    table = {d: {"measured_bytes": int(measured_bytes.get(d, 0)),
                 "predicted_bytes": int(predicted_bytes[d])} for d in predicted_bytes}
    over = {d: v for d, v in table.items() if v["measured_bytes"] > v["predicted_bytes"]}
    if not over:
        ratios = [v["predicted_bytes"] / v["measured_bytes"] for v in table.values()
                  if v["measured_bytes"]]
        worst = f"; predicted/measured at least {min(ratios):.2f}" if ratios else ""
        return PeakCheck(status="within", peak_bytes=table, method=method,
                         detail=f"measured peak memory within the plan on every device{worst}")
    listed = ", ".join(f"{d} measured {_size(v['measured_bytes'])} > planned "
                       f"{_size(v['predicted_bytes'])}" for d, v in over.items())
    message = (f"the emitted model needs more memory than the plan says ({method} measurement of "
               f"weights + live activations): {listed}. The plan's memory figure is not an "
               "upper bound here, so it could overflow a device; this is an autoplace bug, "
               "please report it with the model. Pass --no-check-memory (check_memory=False) "
               "to record the measurement without failing")
    if enforce:
        raise VerificationError(message)
    return PeakCheck(status="exceeded", peak_bytes=table, method=method,
                     detail=f"memory exceeds the plan (not enforced): {listed}")


def _size(nbytes: int) -> str:
    return f"{nbytes / 2**20:.2f} MiB" if nbytes >= 2**20 else f"{nbytes} B"

"""Train: the precision a plan runs in (``--dtype``), and what mixed precision costs.

``float32`` (the default) plans the model as given. ``bfloat16`` and ``float16`` plan it the
way Megatron-LM and ZeRO train in mixed precision (Micikevicius et al., "Mixed Precision
Training", ICLR 2018; Rajbhandari et al., "ZeRO", SC 2020, section 3.1): ``cast`` makes a copy
of the model whose floating parameters and buffers are in that dtype, and the floating example
inputs and targets too (so that the loss runs in the model's dtype), *before* tracing, so the
traced graph's dtypes, bytes and analytic costs are the half model's. Integer inputs and
targets (token ids, class labels) are left as they are. A training step keeps a float32
*master* copy of every trained parameter beside it, which the optimizer updates
(``emit.train.optimizer.MasterWeights``); ``Update`` says what that adds to each parameter's update,
in memory and traffic, for ``graph.py``.
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import Any

import torch
from torch.utils import _pytree as pytree

from autoplace.config.choices import DType, choice

__all__ = ["MASTER_BYTES", "Update", "cast", "cast_notes", "check_dtype",
           "element_bytes", "update_of"]

# The float32 master copy of a parameter under mixed precision (ZeRO, section 3.1: "fp32
# copy of the parameters", 4 bytes of its K = 12 for Adam; the other 8 are the moments).
MASTER_BYTES = 4


def check_dtype(dtype: str) -> str:
    """``dtype`` as a ``config.DType`` name (``fp32``, ``bf16``, ``fp16``, ``half`` and
    ``torch.bfloat16`` are accepted); a ``ConfigError`` listing them otherwise."""
    return choice(DType, dtype, "dtype").value


def element_bytes(dtype: str) -> int:
    """Bytes of one element of ``dtype`` (a ``config.DType`` name)."""
    return getattr(torch, check_dtype(dtype)).itemsize


def cast(model: torch.nn.Module, values: Any, dtype: str) -> tuple[torch.nn.Module, Any]:
    """A copy of ``model`` with its floating parameters and buffers in ``dtype``
    (``Module.to(dtype)`` casts only floating ones), and ``values`` (any pytree: the example
    inputs and targets) with every floating tensor in ``dtype``; the model itself as it is,
    and ``values`` too, for ``float32``."""
    if check_dtype(dtype) == "float32":
        return model, values
    to = getattr(torch, dtype)
    half = copy.deepcopy(model).to(to)

    def leaf(x: Any) -> Any:
        return x.to(to) if isinstance(x, torch.Tensor) and x.is_floating_point() else x

    return half, pytree.tree_map(leaf, values)


def cast_notes(dtype: str, *, training: bool) -> list[str]:
    """The plan's note on ``cast`` (none for float32)."""
    if dtype == "float32":
        return []
    return [f"{dtype}: the model's floating parameters and buffers and the floating example "
            "inputs and targets were cast to it before tracing"
            + (" (mixed precision: the optimizer updates float32 master weights"
               + (", the loss scaled as torch.amp.GradScaler does" if dtype == "float16" else "")
               + ")" if training else "")]


@dataclass(frozen=True)
class Update:
    """One optimizer update per trained parameter, in the plan's precision: the bytes the
    update node holds beside the gradients (``held``), its temporaries (``workspace``), its
    memory traffic and its arithmetic."""

    held_bytes_per_param: int
    workspace_bytes_per_param: int
    traffic_bytes_per_param: int
    flops_per_param: int


def update_of(optimizer: Any, dtype: str) -> Update:
    """``optimizer``'s (a ``graph.Optimizer``) update in ``dtype``. In float32 it is the
    optimizer's own. Under mixed precision (``MasterWeights.step``), per parameter of E bytes
    (2) and tensor by tensor:

    * held: the float32 master (``MASTER_BYTES``) and the optimizer's float32 state: Adam
      4 + 8 = 12, so that with the half parameter and gradient (2 + 2) a parameter costs the
      16 bytes of ZeRO's section 3.1; SGD 4 + 0 (8 in all), momentum 4 + 4 (12).
    * workspace: the master's float32 gradient, made for one tensor at a time (4), and the
      optimizer's temporaries.
    * traffic: the half gradient read and its float32 copy written (E + 4), the optimizer's
      own update of the master (``traffic_bytes_per_param``, all float32), and the master read
      and the half parameter written (4 + E); float16 also unscales the copy in place (read
      and write, 8) and checks the half gradient for inf and nan first (E)
      (``torch.amp.GradScaler``'s ``unscale_``).
    * arithmetic: the optimizer's, and float16's one multiplication by 1/scale."""
    if check_dtype(dtype) == "float32":
        return Update(optimizer.state_bytes_per_param, optimizer.workspace_bytes_per_param,
                      optimizer.traffic_bytes_per_param, optimizer.flops_per_param)
    half = element_bytes(dtype)
    scaled = dtype == "float16"
    return Update(
        held_bytes_per_param=MASTER_BYTES + optimizer.state_bytes_per_param,
        workspace_bytes_per_param=4 + optimizer.workspace_bytes_per_param,
        traffic_bytes_per_param=(half + 4 + optimizer.traffic_bytes_per_param + 4 + half
                                 + (8 + half if scaled else 0)),
        flops_per_param=optimizer.flops_per_param + (1 if scaled else 0))

"""Emit: DTensor's part of tensor parallelism, shared by every rank that runs a split model.

``shard_model`` makes each parameter of a model a DTensor on a mesh (split as
``tensor.column_row`` says, else replicated), and ``run_sharded`` runs it with its inputs
taken as replicated. ``dtensor_rules`` is DTensor's dispatcher with what it lacks on the CPU
and what Megatron-LM does: attention split by heads (``_attention_by_heads``), export's
``_assert_tensor_metadata`` skipped, and a row's partial sums reduced at once
(``_reduced_matmul``). ``tensor`` (a pass), ``tensor_train`` (a step), ``tensor_stages`` (a
pipeline stage) and ``solve.tensor`` (observing on fake ranks) run under it.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator, Mapping
from typing import Any

import torch
from torch.utils import _pytree as pytree

from autoplace.errors import EmitError

__all__ = ["dtensor_rules", "run_sharded", "shard_model"]

aten = torch.ops.aten


def shard_model(model: torch.nn.Module, mesh: Any, split: Mapping[str, tuple[str, int]], *,
                copy: bool = False) -> None:
    """Every parameter and buffer of ``model`` made a DTensor on ``mesh``: split as ``split``
    says (``Shard(d)``), else replicated (``copy``: of a copy of each, which a step may update
    in place without touching tensors the model shares). A split dimension the ranks do not
    divide is an ``EmitError`` naming it."""
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    ranks = mesh.size()
    for prefix, module in model.named_modules():
        for name, param in list(module.named_parameters(recurse=False)):
            full = f"{prefix}.{name}" if prefix else name
            kind, dim = split.get(full, (None, None))
            if dim is not None and param.shape[dim] % ranks:
                raise EmitError(f"{full} has {param.shape[dim]} along dimension {dim}, which "
                                f"{ranks} tensor-parallel ranks do not divide: choose a "
                                "degree that divides the heads and the hidden size")
            placement = [Shard(dim)] if dim is not None else [Replicate()]
            module.register_parameter(name, torch.nn.Parameter(
                distribute_tensor(param.detach().clone() if copy else param.detach(), mesh,
                                  placement),
                requires_grad=param.requires_grad))
        for name, buffer in list(module.named_buffers(recurse=False)):
            if buffer is not None:
                module.register_buffer(name, distribute_tensor(
                    buffer.clone() if copy else buffer, mesh, [Replicate()]))


def _reduced_matmul(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """A matmul as DTensor runs it, its partial sums (a row's: both operands split along the
    contraction) all-reduced at once, as Megatron-LM and ``RowwiseParallel`` do. Left to
    DTensor, the sum stays partial along the residual stream and is reduced again by each op
    that needs it whole (a norm's square, its scale, the next matmul); and where reducing the
    activation moves more bytes than gathering the next weight, DTensor gathers the weight
    (measured on a Llama-7B shape at 8 x 2048 tokens: 50 GB of collectives a pass, against
    one all-reduce a row)."""
    from torch.distributed.tensor import DTensor

    table = DTensor._op_dispatcher._custom_op_handlers
    mine = table.pop(op)  # DTensor's own rule for the op, then ours again
    try:
        out = op(*args, **kwargs)
    finally:
        table[op] = mine
    return _replicated(out)


def _replicated(value: Any) -> Any:
    """``value`` with its partial sums reduced (an all-reduce), or as it is."""
    from torch.distributed.tensor import DTensor, Replicate

    if not isinstance(value, DTensor) or not any(p.is_partial() for p in value.placements):
        return value
    return value.redistribute(value.device_mesh, [Replicate()] * value.device_mesh.ndim)


def run_sharded(model: torch.nn.Module, args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """``model`` (``shard_model``'s) on ``args``/``kwargs``, every plain tensor taken as
    replicated, without gradients; the outputs as whole tensors (``full_tensor``)."""
    from torch.distributed.tensor import DTensor
    from torch.distributed.tensor.experimental import implicit_replication

    with torch.no_grad(), implicit_replication(), dtensor_rules():
        out = model(*args, **kwargs)
    return pytree.tree_map(lambda x: x.full_tensor() if isinstance(x, DTensor) else x, out)


@contextlib.contextmanager
def dtensor_rules() -> Iterator[None]:
    """DTensor's dispatcher with two ops it has no rule for on the CPU, attention split by
    heads (``_attention_by_heads``) and ``_assert_tensor_metadata`` (a check of export's,
    skipped), and matmuls whose partial sums are reduced at once (``_reduced_matmul``).
    Restored on the way out."""
    from torch.distributed.tensor import DTensor

    table = DTensor._op_dispatcher._custom_op_handlers
    added = {aten._scaled_dot_product_flash_attention_for_cpu.default: _attention_by_heads,
             aten._scaled_dot_product_flash_attention_for_cpu_backward.default:
                 functools.partial(_attention_by_heads, heads=6),
             aten._assert_tensor_metadata.default: lambda op, args, kwargs: None,
             aten.mm.default: _reduced_matmul, aten.addmm.default: _reduced_matmul}
    before = {op: table.get(op) for op in added}
    table.update(added)
    try:
        yield
    finally:
        for op, handler in before.items():
            if handler is None:
                table.pop(op, None)
            else:
                table[op] = handler


def _attention_by_heads(op: Any, args: tuple[Any, ...], kwargs: dict[str, Any], *,
                        heads: int = 3) -> Any:
    """Scaled dot-product attention of DTensors (its forward; with ``heads=6``, its backward,
    whose first six arguments are the output's gradient, the query, key and value, the output
    and its log-sum-exp): each rank's heads alone where those are all split along the heads
    (dimension 1) and a mask, if any, is the same for every head; else on whole tensors,
    replicated. Attention never mixes heads."""
    from torch.distributed.tensor import DTensor, Replicate, Shard

    tensors = args[:heads]
    mesh = next(t.device_mesh for t in tensors if isinstance(t, DTensor))
    mask = kwargs.get("attn_mask")
    by_heads = (all(isinstance(t, DTensor) and tuple(t.placements) == (Shard(1),)
                    for t in tensors)
                and (mask is None or mask.dim() < 4 or mask.shape[1] == 1))

    def local(t: Any) -> Any:
        if not isinstance(t, DTensor):
            return t
        return (t if by_heads and t is not mask else t.redistribute(
            mesh, [Replicate()] * mesh.ndim)).to_local()

    out = op(*(local(t) for t in tensors), *args[heads:],
             **{key: local(value) for key, value in kwargs.items()})
    placement = [Shard(1)] if by_heads else [Replicate()]
    return tuple(DTensor.from_local(o, mesh, placement, run_check=False) for o in out)

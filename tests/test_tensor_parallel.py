"""Tensor parallelism of an emitted model (``emit.distributed.tensor``): Megatron's column and row
pairs found in the traced graph, and the model run split over gloo ranks by DTensor, its outputs
checked against the original's."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from autoplace.emit import emit_model
from autoplace.emit.distributed.tensor import COLUMN, ROW, column_row, verify_tensor_parallel
from autoplace.errors import EmitError
from autoplace.trace import trace_model


def _emitted(model: nn.Module, args: tuple, kwargs: dict | None = None):
    model.eval()
    traced = trace_model(model, args, kwargs or {})
    on_cpu = {n.name: "cpu" for n in traced.module.graph.nodes if n.op == "call_function"}
    return emit_model(traced.module, on_cpu)


def _mlp() -> tuple[nn.Module, tuple]:
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 16), nn.ReLU(),
                          nn.Linear(16, 8))
    return model, (torch.randn(4, 32),)


def _llama() -> tuple[nn.Module, dict]:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=128, hidden_size=64, intermediate_size=96,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=32, use_cache=False)
    return LlamaForCausalLM(config), {"input_ids": torch.randint(0, 128, (2, 8))}


def test_matmuls_pair_up_as_columns_then_rows() -> None:
    model, args = _mlp()
    split = column_row(_emitted(model, args))
    # 32->64 column (its bias too), 64->16 row (its bias whole), 16->8 column again
    assert split == {"seg0.0.weight": (COLUMN, 0), "seg0.0.bias": (COLUMN, 0),
                     "seg0.2.weight": (ROW, 1), "seg0.4.weight": (COLUMN, 0),
                     "seg0.4.bias": (COLUMN, 0)}


def test_a_llama_layer_splits_attention_by_heads_and_the_mlp_by_columns() -> None:
    model, kwargs = _llama()
    split = column_row(_emitted(model, (), kwargs))
    kinds = {name.removeprefix("seg0.model.layers.0.").removesuffix(".weight"): kind
             for name, (kind, _) in split.items() if ".layers.0." in name}
    assert kinds == {"self_attn.q_proj": COLUMN, "self_attn.k_proj": COLUMN,
                     "self_attn.v_proj": COLUMN, "self_attn.o_proj": ROW,
                     "mlp.gate_proj": COLUMN, "mlp.up_proj": COLUMN, "mlp.down_proj": ROW}
    assert split["seg0.lm_head.weight"] == (COLUMN, 0)  # the vocabulary split
    assert not any("norm" in name or "embed" in name for name in split)


def test_an_embedding_tied_to_the_output_layer_stays_whole() -> None:
    class Tied(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.embed = nn.Embedding(40, 16)
            self.mix = nn.Linear(16, 16)

        def forward(self, ids: torch.Tensor) -> torch.Tensor:
            return torch.relu(self.mix(self.embed(ids))) @ self.embed.weight.t()

    torch.manual_seed(0)
    split = column_row(_emitted(Tied(), (torch.randint(0, 40, (3,)),)))
    assert "seg0.embed.weight" not in split and split["seg0.mix.weight"] == (COLUMN, 0)


@pytest.mark.parametrize("build", [_mlp, _llama], ids=["mlp", "llama"])
def test_two_gloo_ranks_give_the_originals_outputs(build) -> None:
    model, inputs = build()
    args, kwargs = (inputs, {}) if isinstance(inputs, tuple) else ((), inputs)
    check = verify_tensor_parallel(_emitted(model, args, kwargs), model, args, kwargs, ranks=2)
    assert check["status"] == "passed" and check["rows"] >= 1
    assert check["max_abs_diff"] < 1e-4


def test_a_degree_that_does_not_divide_a_split_dimension_says_which() -> None:
    model, args = _mlp()
    with pytest.raises(EmitError, match=r"seg0.0.weight has 64 along dimension 0, which 3 "):
        verify_tensor_parallel(_emitted(model, args), model, args, {}, ranks=3)

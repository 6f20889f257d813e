"""Qwen2-MoE (routed experts plus a gated shared expert), random weights: 2 layers, width 64,
top-2 of 4 experts."""

import torch
from transformers import Qwen2MoeConfig, Qwen2MoeForCausalLM


def build():
    torch.manual_seed(0)
    config = Qwen2MoeConfig(vocab_size=1000, hidden_size=64, intermediate_size=128,
                            moe_intermediate_size=64, shared_expert_intermediate_size=128,
                            num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                            num_experts=4, num_experts_per_tok=2, max_position_embeddings=64,
                            use_cache=False)
    ids = torch.randint(0, config.vocab_size, (2, 32))
    return Qwen2MoeForCausalLM(config), {"input_ids": ids}

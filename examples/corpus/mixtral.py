"""Mixtral (sparse mixture of experts, top-2 of 4 experts per token), random weights: 2 layers,
width 64."""

import torch
from transformers import MixtralConfig, MixtralForCausalLM


def build():
    torch.manual_seed(0)
    config = MixtralConfig(vocab_size=1000, hidden_size=64, intermediate_size=128,
                           num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                           num_local_experts=4, num_experts_per_tok=2,
                           max_position_embeddings=64, use_cache=False)
    ids = torch.randint(0, config.vocab_size, (2, 32))
    return MixtralForCausalLM(config), {"input_ids": ids}

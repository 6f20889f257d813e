"""LLaMA-style decoder (RMSNorm, rotary embeddings, SwiGLU, grouped-query attention), random
weights: 2 layers, width 64, 4 query heads over 2 key/value heads."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def build():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=1000, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, use_cache=False)
    ids = torch.randint(0, config.vocab_size, (2, 32))
    return LlamaForCausalLM(config), {"input_ids": ids}

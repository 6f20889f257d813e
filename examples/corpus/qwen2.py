"""Qwen2-style decoder (biased q/k/v projections, tied embeddings), random weights: 2 layers,
width 64."""

import torch
from transformers import Qwen2Config, Qwen2ForCausalLM


def build():
    torch.manual_seed(0)
    config = Qwen2Config(vocab_size=1000, hidden_size=64, intermediate_size=128,
                         num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
                         max_position_embeddings=64, tie_word_embeddings=True, use_cache=False)
    ids = torch.randint(0, config.vocab_size, (2, 32))
    return Qwen2ForCausalLM(config), {"input_ids": ids}

"""A Llama-2-70B-shaped model on the meta device (nothing is allocated or downloaded): 80 layers,
width 8192, 64 query heads over 8 key/value heads, a 28,672-wide MLP, a 32,000-token vocabulary;
one sequence of 2,048 tokens. Built as a new user would, with transformers' default
``use_cache=True`` (autoplace plans one forward pass with the cache off and says so).
``benchmarks/llama70b.py`` times planning it on 8xA100-80GB. The plan is not emitted: there are
no weights to run."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def build(use_cache: bool = True):
    config = LlamaConfig(vocab_size=32000, hidden_size=8192, intermediate_size=28672,
                         num_hidden_layers=80, num_attention_heads=64, num_key_value_heads=8,
                         max_position_embeddings=4096)
    if not use_cache:
        config.use_cache = False
    with torch.device("meta"):
        model = LlamaForCausalLM(config)
    return model, {"input_ids": torch.randint(0, 32000, (1, 2048), device="meta")}

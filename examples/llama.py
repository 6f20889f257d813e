"""A Llama-style decoder (RMSNorm, rotary embeddings, SwiGLU, grouped-query attention) built from a
`transformers` config with random weights (nothing is downloaded): 4 layers, width 512, 8 query
heads over 4 key/value heads, a 16,000-token vocabulary, one sequence of 64 tokens. Weights
dominate its memory, as in real inference with short prompts."""

import torch
from transformers import LlamaConfig, LlamaForCausalLM


def build():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=16000, hidden_size=512, intermediate_size=1376,
                         num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                         max_position_embeddings=128, use_cache=False)
    input_ids = torch.randint(0, config.vocab_size, (1, 64))
    return LlamaForCausalLM(config), {"input_ids": input_ids}

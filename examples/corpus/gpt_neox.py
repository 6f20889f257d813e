"""GPT-NeoX (Pythia) decoder (parallel attention and MLP, partial rotary), random weights:
2 layers, width 64."""

import torch
from transformers import GPTNeoXConfig, GPTNeoXForCausalLM


def build():
    torch.manual_seed(0)
    config = GPTNeoXConfig(vocab_size=1000, hidden_size=64, intermediate_size=128,
                           num_hidden_layers=2, num_attention_heads=4,
                           max_position_embeddings=64, use_cache=False)
    ids = torch.randint(0, config.vocab_size, (2, 32))
    return GPTNeoXForCausalLM(config), {"input_ids": ids}

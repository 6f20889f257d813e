"""OPT decoder (learned positions, ReLU MLP), random weights: 2 layers, width 64."""

import torch
from transformers import OPTConfig, OPTForCausalLM


def build():
    torch.manual_seed(0)
    config = OPTConfig(vocab_size=1000, hidden_size=64, ffn_dim=128, num_hidden_layers=2,
                       num_attention_heads=4, max_position_embeddings=64, word_embed_proj_dim=64,
                       use_cache=False)
    ids = torch.randint(3, config.vocab_size, (2, 32))
    return OPTForCausalLM(config), {"input_ids": ids}

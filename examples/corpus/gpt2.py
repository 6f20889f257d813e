"""GPT-2 (decoder-only) language model, random weights: 2 layers, width 64, tied embeddings."""

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def build():
    torch.manual_seed(0)
    config = GPT2Config(n_layer=2, n_embd=64, n_head=4, vocab_size=1000, n_positions=64,
                        bos_token_id=0, eos_token_id=0, use_cache=False)
    ids = torch.randint(0, config.vocab_size, (2, 32))
    return GPT2LMHeadModel(config), {"input_ids": ids}

"""A GPT-2-style language model built from a `transformers` config with random weights (nothing
is downloaded): 6 layers, width 384, 6 heads, a 8,000-token vocabulary, tied input and output
embeddings (so the embedding and the LM head must share a device)."""

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def build():
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=6, n_embd=384, n_head=6, vocab_size=8000, n_positions=256,
        bos_token_id=0, eos_token_id=0, use_cache=False, tie_word_embeddings=True,
    )
    model = GPT2LMHeadModel(config)
    input_ids = torch.randint(0, config.vocab_size, (4, 128))
    return model, {"input_ids": input_ids}

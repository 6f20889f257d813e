"""A GPT-2-style language model built from a `transformers` config with random weights (nothing
is downloaded): 6 layers, width 384, 6 heads, a 8,000-token vocabulary, tied input and output
embeddings (so the embedding and the LM head must share a device), a batch of 4 sequences of 128
tokens. At that size its activations (the logits most of all) outweigh its 55 MB of weights.

``build`` takes the layer count, width, heads, batch and sequence length as keyword arguments
(benchmarks/accelerate_compare.py builds a deeper, weight-bound GPT-2 with them); with none it
builds the model above."""

import torch
from transformers import GPT2Config, GPT2LMHeadModel


def build(*, n_layer: int = 6, n_embd: int = 384, n_head: int = 6, batch: int = 4,
          seq: int = 128):
    torch.manual_seed(0)
    config = GPT2Config(
        n_layer=n_layer, n_embd=n_embd, n_head=n_head, vocab_size=8000,
        n_positions=max(256, seq), bos_token_id=0, eos_token_id=0, use_cache=False,
        tie_word_embeddings=True,
    )
    model = GPT2LMHeadModel(config)
    input_ids = torch.randint(0, config.vocab_size, (batch, seq))
    return model, {"input_ids": input_ids}

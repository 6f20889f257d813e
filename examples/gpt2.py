"""A GPT-2-style language model built from a `transformers` config with random weights (nothing
is downloaded): 6 layers, width 384, 6 heads, a 8,000-token vocabulary, tied input and output
embeddings (so the embedding and the LM head must share a device), a batch of 4 sequences of 128
tokens. At that size its activations (the logits most of all) outweigh its 55 MB of weights.

``build`` takes the layer count, width, heads, batch and sequence length as keyword arguments
(benchmarks/accelerate_compare.py builds a deeper, weight-bound GPT-2 with them); with none it
builds the model above. With `--mode training` it is trained on next-token prediction (``loss``
below)."""

import torch
import torch.nn.functional as F
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


def loss(outputs, labels: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy (what the model computes itself when given labels)."""
    logits = outputs.logits[:, :-1]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))


# The next tokens to predict for build()'s default batch (4 sequences of 128), random as the
# inputs are.
example_targets = (torch.randint(0, 8000, (4, 128), generator=torch.Generator().manual_seed(1)),)

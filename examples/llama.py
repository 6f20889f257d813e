"""A Llama-style decoder (RMSNorm, rotary embeddings, SwiGLU, grouped-query attention) built from a
`transformers` config with random weights (nothing is downloaded): 4 layers, width 512, 8 query
heads over 4 key/value heads, a 16,000-token vocabulary, one sequence of 64 tokens. Weights
dominate its memory, as in real inference with short prompts. With `--mode training` it is
trained on next-token prediction (``loss`` below)."""

import torch
import torch.nn.functional as F
from transformers import LlamaConfig, LlamaForCausalLM


def build():
    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=16000, hidden_size=512, intermediate_size=1376,
                         num_hidden_layers=4, num_attention_heads=8, num_key_value_heads=4,
                         max_position_embeddings=128, use_cache=False)
    input_ids = torch.randint(0, config.vocab_size, (1, 64))
    return LlamaForCausalLM(config), {"input_ids": input_ids}


def loss(outputs, labels: torch.Tensor) -> torch.Tensor:
    """Next-token cross-entropy (what the model computes itself when given labels)."""
    logits = outputs.logits[:, :-1]
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels[:, 1:].reshape(-1))


# The next tokens to predict for build()'s sequence, random as the inputs are.
example_targets = (torch.randint(0, 16000, (1, 64), generator=torch.Generator().manual_seed(1)),)

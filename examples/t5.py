"""A T5 encoder-decoder (relative position buckets) built from a `transformers` config with random
weights (nothing is downloaded): 4 + 4 layers, width 256, a 16,000-token vocabulary, one
64-token input and a 16-token decoder prefix. Weights dominate its memory. With `--mode
training` it is trained on the decoder's next tokens, given whole (teacher forcing: ``loss``
below)."""

import torch
import torch.nn.functional as F
from transformers import T5Config, T5ForConditionalGeneration


def build():
    torch.manual_seed(0)
    config = T5Config(vocab_size=16000, d_model=256, d_kv=32, d_ff=1024, num_layers=4,
                      num_decoder_layers=4, num_heads=8, decoder_start_token_id=0,
                      use_cache=False)
    input_ids = torch.randint(0, config.vocab_size, (1, 64))
    decoder_input_ids = torch.randint(0, config.vocab_size, (1, 16))
    return T5ForConditionalGeneration(config), {"input_ids": input_ids,
                                                "decoder_input_ids": decoder_input_ids}


def loss(outputs, labels: torch.Tensor) -> torch.Tensor:
    """Cross-entropy of the decoder's logits against ``labels``, one token per decoder
    position (what the model computes itself when given labels)."""
    logits = outputs.logits
    return F.cross_entropy(logits.reshape(-1, logits.shape[-1]), labels.reshape(-1))


# The tokens the decoder should give at its 16 positions, random as the inputs are.
example_targets = (torch.randint(0, 16000, (1, 16), generator=torch.Generator().manual_seed(1)),)

"""A T5 encoder-decoder (relative position buckets) built from a `transformers` config with random
weights (nothing is downloaded): 4 + 4 layers, width 256, a 16,000-token vocabulary, one
64-token input and a 16-token decoder prefix. Weights dominate its memory."""

import torch
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

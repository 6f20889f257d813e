"""T5 (encoder-decoder, relative position buckets), random weights: 2 + 2 layers, width 64."""

import torch
from transformers import T5Config, T5ForConditionalGeneration


def build():
    torch.manual_seed(0)
    config = T5Config(vocab_size=1000, d_model=64, d_kv=16, d_ff=128, num_layers=2,
                      num_decoder_layers=2, num_heads=4, decoder_start_token_id=0,
                      use_cache=False)
    ids = torch.randint(0, config.vocab_size, (2, 32))
    decoder_ids = torch.randint(0, config.vocab_size, (2, 16))
    return T5ForConditionalGeneration(config), {"input_ids": ids,
                                                "decoder_input_ids": decoder_ids}

"""BART (encoder-decoder), random weights: 2 + 2 layers, width 64."""

import torch
from transformers import BartConfig, BartForConditionalGeneration


def build():
    torch.manual_seed(0)
    config = BartConfig(vocab_size=1000, d_model=64, encoder_layers=2, decoder_layers=2,
                        encoder_attention_heads=4, decoder_attention_heads=4,
                        encoder_ffn_dim=128, decoder_ffn_dim=128, max_position_embeddings=64,
                        use_cache=False)
    ids = torch.randint(3, config.vocab_size, (2, 32))
    decoder_ids = torch.randint(3, config.vocab_size, (2, 16))
    return BartForConditionalGeneration(config), {"input_ids": ids,
                                                  "decoder_input_ids": decoder_ids}

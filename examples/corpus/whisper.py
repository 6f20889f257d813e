"""Whisper (speech encoder-decoder: convolutional front end over log-mel frames, then
transformer layers), random weights: 2 + 2 layers, width 64, 200 input frames."""

import torch
from transformers import WhisperConfig, WhisperForConditionalGeneration


def build():
    torch.manual_seed(0)
    config = WhisperConfig(vocab_size=1000, num_mel_bins=16, d_model=64, encoder_layers=2,
                           decoder_layers=2, encoder_attention_heads=4,
                           decoder_attention_heads=4, encoder_ffn_dim=128, decoder_ffn_dim=128,
                           max_source_positions=100, max_target_positions=64,
                           decoder_start_token_id=1, pad_token_id=0, bos_token_id=1,
                           eos_token_id=2, use_cache=False)
    features = torch.randn(2, config.num_mel_bins, 2 * config.max_source_positions)
    decoder_ids = torch.randint(2, config.vocab_size, (2, 16))
    return WhisperForConditionalGeneration(config), {"input_features": features,
                                                     "decoder_input_ids": decoder_ids}

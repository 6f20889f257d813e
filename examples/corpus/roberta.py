"""RoBERTa (encoder-only) with a masked-LM head, random weights: 2 layers, width 64."""

import torch
from transformers import RobertaConfig, RobertaForMaskedLM


def build():
    torch.manual_seed(0)
    config = RobertaConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2,
                           num_attention_heads=4, intermediate_size=128,
                           max_position_embeddings=66, pad_token_id=1)
    ids = torch.randint(3, config.vocab_size, (2, 32))
    return RobertaForMaskedLM(config), {"input_ids": ids}

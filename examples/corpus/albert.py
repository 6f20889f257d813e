"""ALBERT (encoder-only, one layer's weights shared by every layer), random weights: 3 layers,
width 64."""

import torch
from transformers import AlbertConfig, AlbertModel


def build():
    torch.manual_seed(0)
    config = AlbertConfig(vocab_size=1000, embedding_size=32, hidden_size=64,
                          num_hidden_layers=3, num_attention_heads=4, intermediate_size=128,
                          max_position_embeddings=64)
    ids = torch.randint(0, config.vocab_size, (2, 32))
    return AlbertModel(config), {"input_ids": ids}

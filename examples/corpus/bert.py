"""BERT (encoder-only), random weights from a tiny config: 2 layers, width 64, 4 heads."""

import torch
from transformers import BertConfig, BertModel


def build():
    torch.manual_seed(0)
    config = BertConfig(vocab_size=1000, hidden_size=64, num_hidden_layers=2,
                        num_attention_heads=4, intermediate_size=128, max_position_embeddings=64)
    ids = torch.randint(0, config.vocab_size, (2, 32))
    return BertModel(config), {"input_ids": ids, "attention_mask": torch.ones_like(ids)}

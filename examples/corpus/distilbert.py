"""DistilBERT (encoder-only) with a sequence-classification head, random weights: 2 layers,
width 64."""

import torch
from transformers import DistilBertConfig, DistilBertForSequenceClassification


def build():
    torch.manual_seed(0)
    config = DistilBertConfig(vocab_size=1000, dim=64, n_layers=2, n_heads=4, hidden_dim=128,
                              max_position_embeddings=64, num_labels=3)
    ids = torch.randint(0, config.vocab_size, (2, 32))
    return DistilBertForSequenceClassification(config), {"input_ids": ids}

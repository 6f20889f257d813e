"""RegNet (grouped convolutions, squeeze-and-excitation), random weights: 64x64 images,
4 stages of 1 block."""

import torch
from transformers import RegNetConfig, RegNetForImageClassification


def build():
    torch.manual_seed(0)
    config = RegNetConfig(embedding_size=16, hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 1, 1],
                          groups_width=8, layer_type="y", num_labels=10)
    return RegNetForImageClassification(config), {"pixel_values": torch.randn(2, 3, 64, 64)}

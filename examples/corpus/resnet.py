"""ResNet (bottleneck blocks, batch norm), random weights: 64x64 images, 4 stages of 1 block."""

import torch
from transformers import ResNetConfig, ResNetForImageClassification


def build():
    torch.manual_seed(0)
    config = ResNetConfig(embedding_size=16, hidden_sizes=[32, 64, 128, 256],
                          depths=[1, 1, 1, 1], layer_type="bottleneck", num_labels=10)
    return ResNetForImageClassification(config), {"pixel_values": torch.randn(2, 3, 64, 64)}

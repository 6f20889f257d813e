"""ConvNeXt (depthwise 7x7 convolutions, layer norm), random weights: 64x64 images, 4 stages."""

import torch
from transformers import ConvNextConfig, ConvNextForImageClassification


def build():
    torch.manual_seed(0)
    config = ConvNextConfig(hidden_sizes=[16, 32, 64, 128], depths=[1, 1, 2, 1], num_labels=10)
    return ConvNextForImageClassification(config), {"pixel_values": torch.randn(2, 3, 64, 64)}

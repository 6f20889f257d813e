"""ViT (vision transformer) image classifier, random weights: 32x32 images in 8x8 patches,
2 layers, width 64."""

import torch
from transformers import ViTConfig, ViTForImageClassification


def build():
    torch.manual_seed(0)
    config = ViTConfig(image_size=32, patch_size=8, hidden_size=64, num_hidden_layers=2,
                       num_attention_heads=4, intermediate_size=128, num_labels=10)
    return ViTForImageClassification(config), {"pixel_values": torch.randn(2, 3, 32, 32)}

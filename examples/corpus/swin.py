"""Swin transformer (shifted windows, patch merging), random weights: 32x32 images, two stages
of 2 blocks, width 32."""

import torch
from transformers import SwinConfig, SwinForImageClassification


def build():
    torch.manual_seed(0)
    config = SwinConfig(image_size=32, patch_size=2, embed_dim=32, depths=[2, 2],
                        num_heads=[2, 4], window_size=4, num_labels=10)
    return SwinForImageClassification(config), {"pixel_values": torch.randn(2, 3, 32, 32)}

"""MobileNetV2 (inverted residuals, depthwise convolutions, ReLU6), random weights: 64x64
images, width multiplier 0.35."""

import torch
from transformers import MobileNetV2Config, MobileNetV2ForImageClassification


def build():
    torch.manual_seed(0)
    config = MobileNetV2Config(image_size=64, depth_multiplier=0.35, num_labels=10)
    return MobileNetV2ForImageClassification(config), {
        "pixel_values": torch.randn(2, 3, 64, 64)}

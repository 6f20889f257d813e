"""The MLP 784 -> 256 -> 128 -> 10 that the TensorFlow model-parallel tutorial splits across two
GPUs by hand. A chain: on identical devices one device is best (a split only adds a transfer)."""

import torch
from torch import nn


def build():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(784, 256), nn.ReLU(),
        nn.Linear(256, 128), nn.ReLU(),
        nn.Linear(128, 10),
    )
    return model, (torch.randn(64, 784),)

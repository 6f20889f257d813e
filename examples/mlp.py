"""The MLP 784 -> 256 -> 128 -> 10 that the TensorFlow model-parallel tutorial splits across two
GPUs by hand (and trains with Adam: `autoplace plan examples/mlp.py --mode training`, with the
loss and the labels below). A chain: on identical devices one device is best (a split only adds
a transfer)."""

import torch
import torch.nn.functional as F
from torch import nn


def build():
    torch.manual_seed(0)
    model = nn.Sequential(
        nn.Linear(784, 256), nn.ReLU(),
        nn.Linear(256, 128), nn.ReLU(),
        nn.Linear(128, 10),
    )
    return model, (torch.randn(64, 784),)


def loss(outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(outputs, labels)


example_targets = (torch.randint(0, 10, (64,), generator=torch.Generator().manual_seed(1)),)

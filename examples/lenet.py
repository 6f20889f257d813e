"""A LeNet-style CNN: conv 1->20 (5x5), conv 20->50 (5x5), fc 800->500, fc 500->10, on 28x28
images (28 -> conv 24 -> pool 12 -> conv 8 -> pool 4, so 50 * 4 * 4 = 800 features). With
`--mode training` it is trained on the labels below with a cross-entropy loss."""

import torch
import torch.nn.functional as F
from torch import nn


class LeNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(1, 20, 5)
        self.conv2 = nn.Conv2d(20, 50, 5)
        self.fc1 = nn.Linear(800, 500)
        self.fc2 = nn.Linear(500, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = torch.max_pool2d(torch.relu(self.conv1(x)), 2)
        x = torch.max_pool2d(torch.relu(self.conv2(x)), 2)
        x = torch.relu(self.fc1(x.flatten(1)))
        return self.fc2(x)


def build():
    torch.manual_seed(0)
    return LeNet(), (torch.randn(32, 1, 28, 28),)


def loss(outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(outputs, labels)


example_targets = (torch.randint(0, 10, (32,), generator=torch.Generator().manual_seed(1)),)

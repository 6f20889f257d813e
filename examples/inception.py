"""An Inception-style multi-branch CNN: each block runs four branches on the same input (1x1;
1x1 -> 3x3; 1x1 -> 5x5; 3x3 max-pool -> 1x1) and concatenates them. The branches are independent,
so on two devices they can run at the same time: the plan should beat any single device."""

import torch
from torch import nn


def conv(cin: int, cout: int, k: int) -> nn.Sequential:
    return nn.Sequential(nn.Conv2d(cin, cout, k, padding=k // 2), nn.ReLU())


class InceptionBlock(nn.Module):
    def __init__(self, cin: int, width: int) -> None:
        super().__init__()
        self.branch1 = conv(cin, width, 1)
        self.branch3 = nn.Sequential(conv(cin, width, 1), conv(width, 2 * width, 3))
        self.branch5 = nn.Sequential(conv(cin, width // 2, 1), conv(width // 2, width, 5))
        self.branch_pool = nn.Sequential(nn.MaxPool2d(3, stride=1, padding=1), conv(cin, width, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return torch.cat([self.branch1(x), self.branch3(x), self.branch5(x),
                          self.branch_pool(x)], dim=1)


class InceptionNet(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.stem = conv(3, 64, 3)
        self.block1 = InceptionBlock(64, 64)       # 64 + 128 + 64 + 64 = 320 channels out
        self.block2 = InceptionBlock(320, 96)      # 96 + 192 + 96 + 96 = 480 channels out
        self.head = nn.Linear(480, 100)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.block2(self.block1(self.stem(x)))
        return self.head(x.mean(dim=(2, 3)))


def build():
    torch.manual_seed(0)
    return InceptionNet(), (torch.randn(4, 3, 32, 32),)

"""A small ResNet-style CNN with batch norm (He et al., "Deep Residual Learning for Image
Recognition", CVPR 2016; CIFAR's layout, section 4.2): a 3x3 stem conv 3->16, three stages of
basic blocks (two 3x3 convs, each followed by batch norm, and a shortcut; 1x1 conv and batch
norm where the stage halves the size or widens) of widths 16, 32 and 64 on 32x32 images
(32 -> 16 -> 8), global average pooling and a 64->10 classifier: 78,042 parameters, random
weights, nothing downloaded. With `--mode training` it is trained on the labels below with a
cross-entropy loss; in train() (`--layers train`, the default) every batch norm normalizes by
the batch and updates its running statistics."""

import torch
import torch.nn.functional as F
from torch import nn


class BasicBlock(nn.Module):
    def __init__(self, inputs: int, width: int, stride: int) -> None:
        super().__init__()
        self.conv1 = nn.Conv2d(inputs, width, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.conv2 = nn.Conv2d(width, width, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(width)
        self.shortcut = nn.Sequential()
        if stride != 1 or inputs != width:
            self.shortcut = nn.Sequential(nn.Conv2d(inputs, width, 1, stride=stride, bias=False),
                                          nn.BatchNorm2d(width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = torch.relu(self.bn1(self.conv1(x)))
        return torch.relu(self.bn2(self.conv2(out)) + self.shortcut(x))


class ResNet(nn.Module):
    def __init__(self, *, widths: tuple[int, ...] = (16, 32, 64), blocks: int = 1,
                 classes: int = 10) -> None:
        super().__init__()
        self.conv = nn.Conv2d(3, widths[0], 3, padding=1, bias=False)
        self.bn = nn.BatchNorm2d(widths[0])
        layers, inputs = [], widths[0]
        for stage, width in enumerate(widths):
            for block in range(blocks):
                stride = 2 if stage > 0 and block == 0 else 1
                layers.append(BasicBlock(inputs, width, stride))
                inputs = width
        self.layers = nn.Sequential(*layers)
        self.fc = nn.Linear(inputs, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.layers(torch.relu(self.bn(self.conv(x))))
        return self.fc(x.mean(dim=(2, 3)))


def build(*, widths: tuple[int, ...] = (16, 32, 64), blocks: int = 1, batch: int = 16):
    torch.manual_seed(0)
    return ResNet(widths=widths, blocks=blocks), (torch.randn(batch, 3, 32, 32),)


def loss(outputs: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return F.cross_entropy(outputs, labels)


example_targets = (torch.randint(0, 10, (16,), generator=torch.Generator().manual_seed(1)),)

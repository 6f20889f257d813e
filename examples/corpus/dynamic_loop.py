"""Data-dependent control flow in a loop: a refinement step applied until the update is small
(at most 4 times), the shape of adaptive-computation-time models. The number of iterations
depends on the values, so neither torch.export nor torch.fx can trace it."""

import torch
from torch import nn


class Refine(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.step = nn.Sequential(nn.Linear(32, 32), nn.Tanh())
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        for _ in range(4):
            update = self.step(x)
            x = x + update
            if update.abs().mean() < 1e-3:
                break
        return self.head(x)


def build():
    torch.manual_seed(0)
    return Refine(), (torch.randn(4, 32),)

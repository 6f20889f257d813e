"""Data-dependent control flow: an early-exit network that skips its second half when the first
half is already confident, decided by a Python `if` on a tensor's value. torch.export cannot
trace a branch on data, and torch.fx cannot either; autoplace must say so clearly."""

import torch
from torch import nn


class EarlyExit(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.first = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32))
        self.exit_head = nn.Linear(32, 10)
        self.second = nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 32))
        self.head = nn.Linear(32, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.first(x)
        early = self.exit_head(h)
        if early.softmax(-1).max() > 0.9:
            return early
        return self.head(self.second(h))


def build():
    torch.manual_seed(0)
    return EarlyExit(), (torch.randn(4, 32),)

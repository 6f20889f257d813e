"""Data-dependent control flow written with `torch.cond`, the form torch.export can capture:
both branches become subgraphs and the choice is made at run time from the tensor's value."""

import torch
from torch import nn


class CondBranch(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.encode = nn.Sequential(nn.Linear(32, 64), nn.GELU())
        self.big = nn.Sequential(nn.Linear(64, 128), nn.GELU(), nn.Linear(128, 64))
        self.small = nn.Linear(64, 64)
        self.head = nn.Linear(64, 10)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.encode(x)
        h = torch.cond(h.mean() > 0, lambda t: self.big(t), lambda t: self.small(t), (h,))
        return self.head(h)


def build():
    torch.manual_seed(0)
    return CondBranch(), (torch.randn(4, 32),)

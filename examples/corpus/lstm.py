"""A recurrent tagger in plain torch: embedding, a 2-layer bidirectional LSTM, and a linear
head per token. torch.export keeps each LSTM as one op."""

import torch
from torch import nn


class Tagger(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.embed = nn.Embedding(1000, 64)
        self.lstm = nn.LSTM(64, 64, num_layers=2, batch_first=True, bidirectional=True)
        self.head = nn.Linear(128, 12)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        states, _ = self.lstm(self.embed(ids))
        return self.head(states)


def build():
    torch.manual_seed(0)
    return Tagger(), (torch.randint(0, 1000, (4, 32)),)

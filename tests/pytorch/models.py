"""Models of the PyTorch adaptor's tests and benchmark: a ResNet-shaped CNN with BatchNorm and a
Transformer encoder classifier, small enough for the 2-core CI machine; and the training step
as a user writes it."""

from __future__ import annotations

from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn


class Block(nn.Module):
    def __init__(self, cin: int, cout: int, stride: int) -> None:
        super().__init__()
        self.c1 = nn.Conv2d(cin, cout, 3, stride, 1, bias=False)
        self.b1 = nn.BatchNorm2d(cout)
        self.c2 = nn.Conv2d(cout, cout, 3, 1, 1, bias=False)
        self.b2 = nn.BatchNorm2d(cout)
        self.sc = None
        if stride != 1 or cin != cout:
            self.sc = nn.Sequential(nn.Conv2d(cin, cout, 1, stride, bias=False),
                                    nn.BatchNorm2d(cout))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = self.b2(self.c2(F.relu(self.b1(self.c1(x)))))
        return F.relu(y + (x if self.sc is None else self.sc(x)))


class ResNet(nn.Module):
    """Stem (conv, BatchNorm, ReLU, max pool), two residual blocks, global average pool."""

    def __init__(self, classes: int = 10) -> None:
        super().__init__()
        self.stem = nn.Sequential(nn.Conv2d(3, 16, 3, 1, 1, bias=False), nn.BatchNorm2d(16),
                                  nn.ReLU(), nn.MaxPool2d(2))
        self.l1 = Block(16, 16, 1)
        self.l2 = Block(16, 32, 2)
        self.fc = nn.Linear(32, classes)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.l2(self.l1(self.stem(x)))
        return self.fc(torch.flatten(F.adaptive_avg_pool2d(x, 1), 1))


class Encoder(nn.Module):
    """Token embedding plus a learned position table, two nn.TransformerEncoderLayer (GELU),
    mean pool, linear classifier."""

    def __init__(self, vocab: int = 100, tokens: int = 16, width: int = 32,
                 classes: int = 10, dropout: float = 0.0) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, width)
        self.pos = nn.Parameter(torch.randn(tokens, width) * 0.02)
        layer = nn.TransformerEncoderLayer(width, 4, 2 * width, dropout=dropout,
                                           batch_first=True, activation="gelu")
        self.enc = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(width, classes)

    def forward(self, t: torch.Tensor) -> torch.Tensor:
        return self.head(self.enc(self.emb(t) + self.pos).mean(1))


def user_step(model: nn.Module, opt: torch.optim.Optimizer
              ) -> Callable[[torch.Tensor, torch.Tensor], torch.Tensor]:
    """An ordinary PyTorch training step over `model` and `opt`, nothing Salus in it."""

    def train_step(x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        opt.zero_grad()
        loss = F.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        return loss

    return train_step

"""Feed-forward layers: the GELU MLP (ViT-5) and SwiGLU (Shazeer, 2020; the paper's "over-gating" ablation).
At hidden ``8d/3`` SwiGLU has the parameters of a ``4d`` GELU MLP, the only fair comparison."""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

MlpKind = Literal["gelu", "swiglu"]


def swiglu_hidden_dim(dim: int, mlp_ratio: float = 4.0, multiple_of: int = 64) -> int:
    """Hidden width of a SwiGLU matching a GELU MLP of ``mlp_ratio * dim``: ``2/3`` of it, rounded up."""
    return multiple_of * math.ceil(2 * mlp_ratio * dim / 3 / multiple_of)


class Mlp(nn.Module):
    """``fc2(gelu(fc1(x)))`` with the exact (erf) GELU, as timm's ``Mlp``."""

    def __init__(self, dim: int, hidden_dim: int, bias: bool = True) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim, bias=bias)
        self.fc2 = nn.Linear(hidden_dim, dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc2(F.gelu(self.fc1(x)))


class SwiGLU(nn.Module):
    """``fc2(silu(gate) * up)``; ``fc1`` packs ``[gate | up]`` in timm's ``SwiGLUPacked`` order."""

    def __init__(self, dim: int, hidden_dim: int, bias: bool = False) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, 2 * hidden_dim, bias=bias)
        self.fc2 = nn.Linear(hidden_dim, dim, bias=bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.fc1(x).chunk(2, dim=-1)
        return self.fc2(F.silu(gate) * up)

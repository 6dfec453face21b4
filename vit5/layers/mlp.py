"""Feed-forward layers: the GELU MLP (ViT-5 default) and SwiGLU (the "over-gating" ablation).

SwiGLU (Shazeer, 2020) computes ``down(silu(gate(x)) * up(x))`` with three bias-free matrices.
At hidden ``8d/3`` it has the parameters of a ``4d`` two-matrix MLP, which is the only fair
comparison; ViT-5 finds it hurts on top of LayerScale (both filter channels), so it keeps GELU.
"""

from __future__ import annotations

import math
from typing import Literal

import torch
import torch.nn.functional as F
from torch import nn

MlpKind = Literal["gelu", "swiglu"]


def swiglu_hidden_dim(dim: int, mlp_ratio: float = 4.0, multiple_of: int = 64) -> int:
    """Hidden width of a SwiGLU matching a GELU MLP of ``mlp_ratio * dim``: ``2/3`` of it, rounded up."""
    hidden = 2 * mlp_ratio * dim / 3
    return multiple_of * math.ceil(hidden / multiple_of)


class Mlp(nn.Module):
    """``fc2(gelu(fc1(x)))`` with biases and the exact (erf) GELU, as timm's ``Mlp``."""

    def __init__(self, dim: int, hidden_dim: int, bias: bool = True, drop: float = 0.0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, hidden_dim, bias=bias)
        self.fc2 = nn.Linear(hidden_dim, dim, bias=bias)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.drop(self.fc2(self.drop(F.gelu(self.fc1(x)))))


class SwiGLU(nn.Module):
    """``fc2(silu(gate) * up)`` where ``fc1`` packs ``[gate | up]`` in one matrix (one matmul).

    The packing is timm's ``SwiGLUPacked`` order (gate first), so its weights load by name.
    """

    def __init__(self, dim: int, hidden_dim: int, bias: bool = False, drop: float = 0.0) -> None:
        super().__init__()
        self.fc1 = nn.Linear(dim, 2 * hidden_dim, bias=bias)
        self.fc2 = nn.Linear(hidden_dim, dim, bias=bias)
        self.drop = nn.Dropout(drop)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        gate, up = self.fc1(x).chunk(2, dim=-1)
        return self.drop(self.fc2(self.drop(F.silu(gate) * up)))

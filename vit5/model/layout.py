"""Where each kind of token sits in the sequence: the one source of truth for slicing. ViT-5 orders tokens
``[CLS | patches | registers]``, timm and DINOv2 ``[CLS | registers | patches]``; the patch grid is
``(H / p, W / p)`` row-major, never ``sqrt(N)``."""

from __future__ import annotations

from dataclasses import dataclass

import torch


@dataclass(frozen=True)
class TokenLayout:
    grid: tuple[int, int]  # patch rows, patch columns
    num_cls: int = 1
    num_registers: int = 0
    registers_first: bool = (
        False  # False: vit5 [CLS|patches|regs]; True: timm/DINOv2 [CLS|regs|patches]
    )

    @property
    def num_patches(self) -> int:
        return self.grid[0] * self.grid[1]

    @property
    def num_tokens(self) -> int:
        return self.num_cls + self.num_patches + self.num_registers

    @property
    def cls_index(self) -> int | None:
        return 0 if self.num_cls else None

    @property
    def patch_slice(self) -> slice:
        start = self.num_cls + (self.num_registers if self.registers_first else 0)
        return slice(start, start + self.num_patches)

    @property
    def register_slice(self) -> slice:
        start = self.num_cls if self.registers_first else self.num_cls + self.num_patches
        return slice(start, start + self.num_registers)

    def token_types(self) -> list[str]:
        """``"cls"``, ``"patch"`` or ``"register"`` for each position of the sequence."""
        types = ["patch"] * self.num_tokens
        types[: self.num_cls] = ["cls"] * self.num_cls
        types[self.register_slice] = ["register"] * self.num_registers
        return types

    def patches(self, x: torch.Tensor, dim: int = 1) -> torch.Tensor:
        return x.narrow(dim, self.patch_slice.start, self.num_patches)

    def registers(self, x: torch.Tensor, dim: int = 1) -> torch.Tensor:
        return x.narrow(dim, self.register_slice.start, self.num_registers)

    def prefix(self, x: torch.Tensor, dim: int = 1) -> torch.Tensor:
        """CLS then registers ``[B, num_cls + R, C]`` (timm's ``return_prefix_tokens`` order)."""
        return torch.cat([x.narrow(dim, 0, self.num_cls), self.registers(x, dim)], dim=dim)

    def to_grid(self, patch_values: torch.Tensor) -> torch.Tensor:
        """Per-patch values ``[..., h*w]`` to a map ``[..., h, w]`` (row-major)."""
        return patch_values.unflatten(-1, self.grid)

    def to_nchw(self, patch_tokens: torch.Tensor) -> torch.Tensor:
        """Patch tokens ``[B, h*w, C]`` to a feature map ``[B, C, h, w]``."""
        return patch_tokens.transpose(1, 2).unflatten(-1, self.grid)

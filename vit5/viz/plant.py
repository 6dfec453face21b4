"""Planted artifacts: a known, artificial high-norm token, to check the tools end to end.

A tiny model trained for minutes on a CPU is not expected to develop the high-norm artifacts of
Darcet et al. (arXiv 2309.16588, section 2), so the honest demonstration that metrics and figures
find them is to plant one. Inside :func:`plant_artifacts`, a forward hook multiplies the output of
one block at chosen patch positions by ``scale`` (every later block sees the planted tokens). Figures and
reports made inside it must say "planted"; the runner does.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

import torch
from torch import nn

from vit5.errors import InputError
from vit5.introspect import describe
from vit5.model import take_indices
from vit5.model.vit import unwrap


@dataclass(frozen=True)
class PlantSpec:
    layer: int
    positions: tuple[tuple[int, int], ...]  # (row, column) in the patch grid
    scale: float = 20.0

    def describe(self) -> str:
        where = ", ".join(f"({r},{c})" for r, c in self.positions)
        return (
            f"PLANTED artifacts (x{self.scale:g} norm) at layer {self.layer}, patches {where}: "
            "not a property of the model"
        )


@contextmanager
def plant_artifacts(model: nn.Module, spec: PlantSpec) -> Iterator[PlantSpec]:
    """Multiply block ``spec.layer``'s output tokens at ``spec.positions`` by ``spec.scale``."""
    info = describe(model)
    net = unwrap(model)
    layer = take_indices(info.depth, [spec.layer])[0]
    state: dict[str, tuple[int, int]] = {}

    def remember_size(module, args) -> None:
        state["hw"] = tuple(args[0].shape[-2:])

    def plant(module, inputs, output: torch.Tensor) -> torch.Tensor:
        layout = info.layout(state["hw"])
        h, w = layout.grid
        index = []
        for r, c in spec.positions:
            if not (0 <= r < h and 0 <= c < w):
                raise InputError(f"planted position ({r},{c}) is outside the {h}x{w} patch grid")
            index.append(layout.patch_slice.start + r * w + c)
        out = output.clone()
        out[:, index] = out[:, index] * spec.scale
        return out

    handles = [
        net.patch_embed.register_forward_pre_hook(remember_size),
        net.blocks[layer].register_forward_hook(plant),
    ]
    try:
        yield PlantSpec(layer, tuple(spec.positions), spec.scale)
    finally:
        for handle in handles:
            handle.remove()

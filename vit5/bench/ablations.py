"""The ViT-5 component ablations as data: each is a name, what it changes, and the training-config
overrides that make it (``key=value``, exactly what ``train.py`` takes on its command line).

Every ablation removes or swaps one component of the full ViT-5 (arXiv 2602.08071, Tab. 10), plus
the DeiT-III baseline the paper starts from. ``paper_delta`` is the paper's top-1 change on
ImageNet-1k against the full model, averaged over S/B/L, as read by third parties (UNVERIFIED,
``docs/vit5-reference.md`` §4.3); DeiT-III's is ViT-5-S 82.2 against DeiT-III-S 81.4 (§4.1).
"""

from __future__ import annotations

import difflib
from collections.abc import Sequence
from dataclasses import dataclass

from vit5.errors import InputError


@dataclass(frozen=True)
class Ablation:
    name: str
    what: str
    overrides: tuple[str, ...]  # dotted TrainConfig overrides applied on top of the base config
    paper_delta: float | None = None  # ImageNet top-1 change vs the full ViT-5 (UNVERIFIED)


_M = "model.overrides."  # any ViT5Config field, on top of the base config's model

ABLATIONS: dict[str, Ablation] = {
    a.name: a
    for a in (
        Ablation("full", "ViT-5 as configured: every component", ()),
        Ablation("no_layerscale", "without LayerScale", (f"{_M}layer_scale=null",), -0.29),
        Ablation(
            "no_rope",
            "without 2D RoPE (patches and registers; APE only)",
            (f"{_M}rope=false", f"{_M}register_rope=false"),
            -0.24,
        ),
        Ablation("no_registers", "without the 4 registers", (f"{_M}num_registers=0",), -0.17),
        Ablation(
            "layernorm",
            "LayerNorm instead of RMSNorm (blocks, final and QK-norm)",
            (f"{_M}norm=layernorm",),
            -0.15,
        ),
        Ablation("no_qk_norm", "without QK-norm", (f"{_M}qk_norm=false",), -0.12),
        Ablation("qkv_bias", "with a bias on the qkv projection", (f"{_M}qkv_bias=true",), -0.06),
        Ablation(
            "swiglu",
            "SwiGLU (hidden 8d/3, parameter-matched) instead of the GELU MLP: over-gating",
            (f"{_M}mlp=swiglu",),
            -0.42,
        ),
        Ablation(
            "deit3",
            "the DeiT-III baseline: LayerNorm, qkv bias; no RoPE, registers or QK-norm",
            (
                f"{_M}norm=layernorm",
                f"{_M}qkv_bias=true",
                f"{_M}rope=false",
                f"{_M}num_registers=0",
                f"{_M}qk_norm=false",
            ),
            -0.8,
        ),
    )
}

REFERENCE = "full"  # every delta is against this one


def select_ablations(only: Sequence[str] | None = None) -> list[Ablation]:
    """The ablations to run, in table order: all, or ``only`` plus the full model (the reference).

    Raises:
        ValueError: an unknown name, with the closest valid one and the full list.
    """
    if not only:
        return list(ABLATIONS.values())
    unknown = [name for name in only if name not in ABLATIONS]
    if unknown:
        hints = []
        for name in unknown:
            close = difflib.get_close_matches(name, ABLATIONS, n=1)
            hints.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise InputError(f"unknown ablation {', '.join(hints)}: choose from {', '.join(ABLATIONS)}")
    return [a for name, a in ABLATIONS.items() if name == REFERENCE or name in only]

"""The contenders of the speed comparison, built at one size and resolution.

- ``vit5``: this toolkit's ViT-5 (``vit5.create_model``; SDPA attention, one RoPE table per grid,
  QK-norm and RoPE on q and k in one pass each), eager.
- ``vit5_fused``: the same weights after ``vit5.fuse_for_inference`` (LayerScale and pre-norm
  gains folded into the linear layers); inference only, so it has no training-step row.
- ``vit5_regional``: the same model with each block compiled (``vit5.compile_blocks``, i.e.
  ``model.compile=regional``); the embedding and head run eagerly.
- ``timm_eva``: timm's closest equivalent, an ``Eva`` with 2D RoPE (theta 1e4, interleaved pairs),
  4 registers, RMSNorm (eps 1e-6), QK-Norm, LayerScale 1e-4, bias-free qkv, learned APE on patches
  and CLS pooling. Differences timm cannot express: its registers sit before the patches and get
  no RoPE of their own (ViT-5 appends them and rotates them on a 2x2 grid, theta 100).
- ``timm_eva_compiled``: that ``Eva`` under ``torch.compile`` (whole model).
- ``timm_vit``: timm's plain ``vit_{size}_patch16_224`` (LayerNorm, qkv bias, APE; none of the
  modern parts). Same width, depth and MLP; the yardstick of "free".
- ``reference``: :class:`vit5.reference.OfficialViT5`, the official code's way (explicit softmax
  attention, RoPE tables rebuilt in every block, square inputs only).

All have the same width, depth, heads and GELU MLP, so parameter counts agree within the few
thousand parameters of biases, registers and norms (reported alongside). Compiled contenders use
``ModelSpec.compile_backend`` and compile on their first call (the warm-up, not timed).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import partial

import timm
import torch
from timm.layers import RmsNorm
from timm.models.eva import Eva
from torch import nn

import vit5
from vit5.errors import InputError
from vit5.model.presets import SIZES
from vit5.reference import OfficialViT5

CONTENDERS: tuple[str, ...] = (
    "vit5",
    "vit5_fused",
    "vit5_regional",
    "timm_eva",
    "timm_eva_compiled",
    "timm_vit",
    "reference",
)
EAGER_CONTENDERS: tuple[str, ...] = ("vit5", "timm_eva", "timm_vit", "reference")  # one per implementation

# Each modern part of ViT-5 and the overrides that remove it (for the cost-of-the-modern-parts table).
MODERN_PARTS: dict[str, dict[str, object]] = {
    "rope": dict(rope=False, register_rope=False),
    "registers": dict(num_registers=0),
    "qk_norm": dict(qk_norm=False),
}


@dataclass(frozen=True)
class ModelSpec:
    """Which size to build and how: ``size`` is a ViT-5 size name (tiny, small, base, ...)."""

    size: str = "small"
    img_size: int = 224
    depth: int | None = None  # None: the size's depth; smaller for smoke tests
    compile_backend: str = "inductor"  # for the compiled contenders

    def __post_init__(self) -> None:
        if self.size not in SIZES:
            raise InputError(f"unknown size {self.size!r}: use one of {', '.join(SIZES)}")
        if self.img_size % 16 or self.img_size < 16:
            raise InputError(f"img_size must be a positive multiple of 16 (the patch), got {self.img_size}")

    @property
    def dims(self) -> dict[str, int]:
        dims = dict(SIZES[self.size])
        if self.depth is not None:
            dims["depth"] = self.depth
        return dims


def build_vit5(spec: ModelSpec, **overrides: object) -> nn.Module:
    return vit5.create_model(f"vit5_{spec.size}", img_size=spec.img_size, **{**spec.dims, **overrides})


def build_timm_eva(spec: ModelSpec) -> nn.Module:
    """timm ``Eva`` configured as close to ViT-5 as its options allow."""
    return Eva(
        img_size=spec.img_size,
        patch_size=16,
        num_classes=1000,
        global_pool="token",
        qkv_bias=False,
        qk_norm=True,
        mlp_ratio=4.0,
        norm_layer=partial(RmsNorm, eps=1e-6),
        init_values=1e-4,
        num_reg_tokens=4,
        no_embed_class=True,
        use_abs_pos_emb=True,
        use_rot_pos_emb=True,
        rope_temperature=10000.0,
        **spec.dims,
    )


def build_timm_vit(spec: ModelSpec) -> nn.Module:
    """timm's plain ViT at the same size (``vit_small_patch16_224`` for small)."""
    name = f"vit_{spec.size}_patch16_224"
    if name not in timm.list_models(name):
        raise InputError(f"timm has no {name}: pick a size timm ships (tiny, small, base, large)")
    return timm.create_model(name, img_size=spec.img_size, **({"depth": spec.depth} if spec.depth else {}))


def build_reference(spec: ModelSpec) -> nn.Module:
    return OfficialViT5(img_size=spec.img_size, **spec.dims)


def build_vit5_fused(spec: ModelSpec) -> nn.Module:
    return vit5.fuse_for_inference(build_vit5(spec))


def build_vit5_regional(spec: ModelSpec) -> nn.Module:
    return vit5.compile_blocks(build_vit5(spec), backend=spec.compile_backend)


def build_timm_eva_compiled(spec: ModelSpec) -> nn.Module:
    return torch.compile(build_timm_eva(spec), backend=spec.compile_backend)


BUILDERS: dict[str, Callable[[ModelSpec], nn.Module]] = {
    "vit5": build_vit5,
    "vit5_fused": build_vit5_fused,
    "vit5_regional": build_vit5_regional,
    "timm_eva": build_timm_eva,
    "timm_eva_compiled": build_timm_eva_compiled,
    "timm_vit": build_timm_vit,
    "reference": build_reference,
}


def build_contender(name: str, spec: ModelSpec) -> nn.Module:
    """One contender by name (see :data:`CONTENDERS`), in eval mode with a fixed seed."""
    if name not in BUILDERS:
        raise InputError(f"unknown contender {name!r}: use one of {', '.join(CONTENDERS)}")
    torch.manual_seed(0)
    return BUILDERS[name](spec).eval()


def modern_variants(parts: tuple[str, ...] = tuple(MODERN_PARTS)) -> dict[str, dict[str, object]]:
    """ViT-5 overrides: the full model, without each part, and without all of ``parts`` at once."""
    variants: dict[str, dict[str, object]] = {"full": {}}
    for part in parts:
        variants[f"no_{part}"] = MODERN_PARTS[part]
    variants["none"] = {k: v for part in parts for k, v in MODERN_PARTS[part].items()}
    return variants


def count_parameters(model: nn.Module) -> int:
    return sum(p.numel() for p in model.parameters())

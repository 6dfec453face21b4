"""Any model the tools accept, vit5 or timm: what it is (:func:`describe` -> :class:`ModelInfo`; vit5 tokens
``[CLS | patches | registers]``, timm ``VisionTransformer`` / ``Eva`` ``[CLS | registers | patches]``) and
how a command line names it (:mod:`vit5.introspect.spec`: a run directory, a preset, ``timm:NAME``, ...)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from torch import nn

from vit5.errors import InputError
from vit5.introspect.spec import LoadedModel, load_spec, parse_model_args
from vit5.layers.patch_embed import grid_of
from vit5.model.layout import TokenLayout
from vit5.model.vit import ViT5, unwrap

SUPPORTED = "vit5 models and timm VisionTransformer (DeiT-III, DINOv2, vit_*_reg4_*) or Eva (RoPE) models"
TEST_REGISTERS_ATTR = "_viz_test_registers"  # set on a model by vit5.viz.ttr while test-time registers are on


@dataclass(frozen=True)
class ModelInfo:
    """A vit5 or timm ViT as the tools see it."""

    family: Literal["vit5", "timm"]
    name: str
    depth: int
    embed_dim: int
    num_heads: int
    patch_size: int
    img_size: tuple[int, int]  # the size the model was built for
    dynamic_size: bool  # accepts any patch-multiple input size
    num_registers: int
    has_cls: bool
    registers_first: bool
    mean: tuple[float, ...]
    std: tuple[float, ...]
    test_registers: int = 0  # untrained tokens appended at the end by vit5.viz.ttr (model without registers)

    @property
    def num_cls(self) -> int:
        return int(self.has_cls)

    def grid(self, image_hw: Sequence[int], fix: str = "use --size {h}x{w}") -> tuple[int, int]:
        """The patch grid of ``image_hw``; an :class:`InputError` naming the fix for a size it cannot take."""
        grid = grid_of(image_hw, self.patch_size, fix, InputError)
        if not self.dynamic_size and tuple(image_hw) != tuple(self.img_size):
            raise InputError(
                f"this {self.name} was built for {self.img_size[0]}x{self.img_size[1]} inputs only "
                f"(dynamic_img_size=False): use --size {self.img_size[0]}x{self.img_size[1]}, or build it "
                "with dynamic_img_size=True (the eval and viz commands do this for timm model specs)"
            )
        return grid

    def layout(self, image_hw: Sequence[int]) -> TokenLayout:
        """The token layout inside the blocks; test-time registers (models without trained ones) come last."""
        grid = self.grid(image_hw)
        if self.test_registers:
            return TokenLayout(grid, self.num_cls, self.test_registers, registers_first=False)
        return TokenLayout(grid, self.num_cls, self.num_registers, self.registers_first)


def describe(model: nn.Module) -> ModelInfo:
    """The :class:`ModelInfo` of a (possibly wrapped) vit5 or timm ViT; an :class:`InputError` for others."""
    from timm.models.eva import Eva
    from timm.models.vision_transformer import VisionTransformer

    net = unwrap(model)
    if isinstance(net, ViT5):
        cfg, data_cfg = net.cfg, net.pretrained_cfg
        shape = (cfg.depth, cfg.embed_dim, cfg.num_heads, cfg.patch_size, tuple(cfg.img_size), True)
        tokens = ("vit5", cfg.num_registers, cfg.class_token, False)
    else:
        if not isinstance(net, (VisionTransformer, Eva)):
            raise InputError(f"cannot use a {type(net).__name__}: supported are {SUPPORTED}")
        patch = tuple(net.patch_embed.patch_size)
        if patch[0] != patch[1]:
            raise InputError(f"non-square patches {patch} are not supported")
        data_cfg = net.pretrained_cfg or {}
        img_size = net.patch_embed.img_size or tuple(data_cfg.get("input_size", (3, 224, 224))[1:])
        heads, has_cls = net.blocks[0].attn.num_heads, net.cls_token is not None
        shape = (len(net.blocks), net.embed_dim, heads, patch[0], tuple(img_size), bool(net.dynamic_img_size))
        tokens = ("timm", net.num_prefix_tokens - int(has_cls), has_cls, True)
    return ModelInfo(
        tokens[0],
        type(net).__name__,
        *shape,
        *tokens[1:],
        tuple(data_cfg.get("mean", IMAGENET_DEFAULT_MEAN)),
        tuple(data_cfg.get("std", IMAGENET_DEFAULT_STD)),
        getattr(net, TEST_REGISTERS_ATTR, 0),
    )


def patch_size_of(model: nn.Module) -> int | None:
    """The patch size of a vit5 or timm ViT; None for other models (e.g. a timm CNN)."""
    try:
        return describe(model).patch_size
    except InputError:
        return None


__all__ = ["LoadedModel", "ModelInfo", "describe", "load_spec", "parse_model_args", "patch_size_of"]

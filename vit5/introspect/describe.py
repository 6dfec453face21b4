"""What a model is, as the tools see it: :func:`describe` turns a vit5 model, a timm
``VisionTransformer`` / ``Eva`` or a transformers backbone (:class:`~vit5.introspect.hf.HFBackbone`)
into a :class:`ModelInfo`: its size, its token order (vit5: ``[CLS | patches | registers]``, timm
and transformers: ``[CLS | registers | patches]``, SigLIP: patches only), whether its attention
can be recorded and the preprocessing it expects. Describing a model imports no loader."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Literal

from torch import nn

from vit5.errors import InputError
from vit5.introspect.hf import BACKBONES, HEADS, HFBackbone
from vit5.layers.patch_embed import grid_of
from vit5.model.layout import TokenLayout
from vit5.model.vit import ViT5, unwrap

SUPPORTED = (
    "vit5 models and timm VisionTransformer (DeiT-III, DINOv2, vit_*_reg4_*) or Eva (RoPE) "
    f"models, and transformers {', '.join([*BACKBONES, *HEADS])}"
)
# set on a model by vit5.eval.registers while test-time registers are on
TEST_REGISTERS_ATTR = "_viz_test_registers"


@dataclass(frozen=True)
class Preprocessing:
    """The eval preprocessing a model expects: timm's data config
    (``timm.data.resolve_model_data_config``), which reads the model's ``pretrained_cfg``."""

    input_size: tuple[int, int]  # (height, width) the model was built for
    mean: tuple[float, ...]
    std: tuple[float, ...]
    crop_pct: float


@dataclass(frozen=True)
class ModelInfo:
    """A vit5 or timm ViT as the tools see it."""

    family: Literal["vit5", "timm", "transformers"]
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
    preprocessing: Preprocessing
    # why attention cannot be recorded; "" when it can (vit5, timm q_norm / k_norm hooks)
    unrecordable: str = ""
    # untrained tokens after the trained registers (vit5.eval.registers), while active
    test_registers: int = 0

    @property
    def num_cls(self) -> int:
        return int(self.has_cls)

    @property
    def mean(self) -> tuple[float, ...]:
        return self.preprocessing.mean

    @property
    def std(self) -> tuple[float, ...]:
        return self.preprocessing.std

    @property
    def recordable(self) -> bool:
        return not self.unrecordable

    def grid(self, image_hw: Sequence[int], fix: str = "use --size {h}x{w}") -> tuple[int, int]:
        """The patch grid of ``image_hw``; an :class:`InputError` naming the fix for a size it
        cannot take."""
        grid = grid_of(image_hw, self.patch_size, fix, InputError)
        if not self.dynamic_size and tuple(image_hw) != tuple(self.img_size):
            height = self.img_size[0]
            width = self.img_size[1]
            raise InputError(
                f"this {self.name} was built for {height}x{width} inputs only "
                f"(dynamic_img_size=False): use --size {height}x{width}, or build it with "
                "dynamic_img_size=True (the eval and viz commands do this for timm model specs)",
            )
        return grid

    def layout(self, image_hw: Sequence[int]) -> TokenLayout:
        """The token layout inside the blocks; test-time registers follow the trained ones
        (vit5: at the end; timm: before the patches)."""
        grid = self.grid(image_hw)
        registers = self.num_registers + self.test_registers
        return TokenLayout(grid, self.num_cls, registers, self.registers_first)


def preprocessing_of(model: nn.Module) -> Preprocessing:
    """The :class:`Preprocessing` of any timm-style model (a timm CNN too)."""
    from timm.data import resolve_model_data_config

    data = resolve_model_data_config(unwrap(model))
    return Preprocessing(
        input_size=tuple(data["input_size"][1:]),
        mean=tuple(data["mean"]),
        std=tuple(data["std"]),
        crop_pct=float(data.get("crop_pct", 1.0)),
    )


def describe(model: nn.Module) -> ModelInfo:
    """The :class:`ModelInfo` of a (possibly wrapped) vit5 or timm ViT; an
    :class:`InputError` for other models."""
    net = unwrap(model)
    if isinstance(net, ViT5):
        return _describe_vit5(net)
    if isinstance(net, HFBackbone):
        return _describe_transformers(net)
    return _describe_timm(net)


def _describe_vit5(net: ViT5) -> ModelInfo:
    cfg = net.cfg
    return ModelInfo(
        family="vit5",
        name=type(net).__name__,
        depth=cfg.depth,
        embed_dim=cfg.embed_dim,
        num_heads=cfg.num_heads,
        patch_size=cfg.patch_size,
        img_size=tuple(cfg.img_size),
        dynamic_size=True,
        num_registers=cfg.num_registers,
        has_cls=cfg.class_token,
        registers_first=False,
        preprocessing=preprocessing_of(net),
        test_registers=getattr(net, TEST_REGISTERS_ATTR, 0),
    )


def _describe_transformers(net: HFBackbone) -> ModelInfo:
    """A transformers backbone: every family takes any patch-multiple size (DINOv2
    interpolates its position embedding, ViT and SigLIP are called with
    ``interpolate_pos_encoding=True``, SigLIP 2 resizes its own, DINOv3 uses RoPE)."""
    return ModelInfo(
        family="transformers",
        name=net.arch,
        depth=net.depth,
        embed_dim=net.embed_dim,
        num_heads=net.num_heads,
        patch_size=net.patch_size,
        img_size=net.img_size,
        dynamic_size=True,
        num_registers=net.num_registers,
        has_cls=net.has_cls,
        registers_first=True,
        preprocessing=preprocessing_of(net),
        unrecordable=net.unrecordable,
        test_registers=getattr(net, TEST_REGISTERS_ATTR, 0),
    )


def _describe_timm(net: nn.Module) -> ModelInfo:
    from timm.models.eva import Eva
    from timm.models.vision_transformer import VisionTransformer

    if not isinstance(net, (VisionTransformer, Eva)):
        raise InputError(f"cannot use a {type(net).__name__}: supported are {SUPPORTED}")
    patch = tuple(net.patch_embed.patch_size)
    if patch[0] != patch[1]:
        raise InputError(f"non-square patches {patch} are not supported")
    preprocessing = preprocessing_of(net)
    has_cls = net.cls_token is not None
    return ModelInfo(
        family="timm",
        name=type(net).__name__,
        depth=len(net.blocks),
        embed_dim=net.embed_dim,
        num_heads=net.blocks[0].attn.num_heads,
        patch_size=patch[0],
        img_size=tuple(net.patch_embed.img_size or preprocessing.input_size),
        dynamic_size=bool(net.dynamic_img_size),
        num_registers=net.num_prefix_tokens - int(has_cls),
        has_cls=has_cls,
        registers_first=True,
        preprocessing=preprocessing,
        unrecordable=_unrecordable(net),
        test_registers=getattr(net, TEST_REGISTERS_ATTR, 0),
    )


def _unrecordable(net: nn.Module) -> str:
    """Why the attention of a timm model cannot be recorded: a block without timm's ``q_norm``
    / ``k_norm`` modules and ``scale`` (which :mod:`vit5.viz.collect` hooks for q and k)."""
    for i, block in enumerate(net.blocks):
        attn = getattr(block, "attn", None)
        norms = [getattr(attn, name, None) for name in ("q_norm", "k_norm")]
        hooked = all(isinstance(norm, nn.Module) for norm in norms)
        if not (hooked and hasattr(attn, "scale")):
            return (
                f"block {i} of this {type(net).__name__} has an attention module "
                f"({type(attn).__name__}) without timm's q_norm / k_norm modules and scale; "
                "its attention cannot be recorded"
            )
    return ""


def patch_size_of(model: nn.Module) -> int | None:
    """The patch size of a vit5 or timm ViT; None for other models (e.g. a timm CNN)."""
    try:
        return describe(model).patch_size
    except InputError:
        return None

"""State-dict converters of the official ViT-5 code (``wangf3014/ViT-5`` ``models_vit5.py``: LayerScale
renamed, RoPE buffers verified and dropped) and of timm ``VisionTransformer`` (same names; a CLS row of the
APE folded into ``cls_token``, exact), and :func:`infer_config`, the architecture read off the shapes."""

from __future__ import annotations

import math
import re
from typing import Any, Literal

import torch

from vit5.errors import Vit5Error
from vit5.layers import rope_frequencies
from vit5.model.config import ConfigError, ViT5Config

Source = Literal["vit5", "official", "timm"]

_OFFICIAL_RENAMES = {"gamma_1": "ls1.gamma", "gamma_2": "ls2.gamma"}
_OFFICIAL_ROPE_BUFFERS = {"attn.rope.freqs": "rope", "attn.rope_reg.freqs": "register"}  # rebuilt at run time
_BLOCK_KEY = re.compile(r"^blocks\.(\d+)\.(.+)$")


class CheckpointError(Vit5Error, ValueError):
    """A checkpoint cannot be loaded as asked; the message lists what does not fit and how to fix it."""


class HeadMismatchError(CheckpointError):
    """The checkpoint's classifier head is for another number of classes (fine-tuning: start a new head)."""


def detect_source(state_dict: dict[str, torch.Tensor]) -> Source:
    """``"official"`` when the ViT-5 code's LayerScale names are present, else timm-style names."""
    return "official" if any(k.endswith(".gamma_1") for k in state_dict) else "timm"


def from_official(state_dict: dict[str, torch.Tensor], cfg: ViT5Config) -> dict[str, torch.Tensor]:
    """Map an official ViT-5 state dict (``torch.load(path)["model"]``) to our names."""
    out = {}
    for key, value in state_dict.items():
        match = _BLOCK_KEY.match(key)
        rest = match.group(2) if match else None
        if rest in _OFFICIAL_RENAMES:
            out[f"blocks.{match.group(1)}.{_OFFICIAL_RENAMES[rest]}"] = value
        elif rest in _OFFICIAL_ROPE_BUFFERS:
            _check_rope_buffer(key, value, cfg, _OFFICIAL_ROPE_BUFFERS[rest])
        else:
            out[key] = value
    return out


def _check_rope_buffer(key: str, freqs: torch.Tensor, cfg: ViT5Config, kind: str) -> None:
    enabled = cfg.rope if kind == "rope" else (cfg.register_rope and cfg.num_registers > 0)
    theta = cfg.rope_theta if kind == "rope" else cfg.register_rope_theta
    if not enabled:
        switch = "rope=True" if kind == "rope" else "register_rope=True"
        raise CheckpointError(f"checkpoint has {key} (a RoPE model) but this model has it off: set {switch}")
    expected = rope_frequencies(cfg.head_dim, theta).float()
    if freqs.shape != expected.shape or not torch.allclose(
        freqs.float().cpu(), expected, rtol=1e-4, atol=1e-7
    ):
        raise CheckpointError(
            f"{key} holds RoPE frequencies {freqs.flatten()[:3].tolist()}... that differ from this model's "
            f"(head_dim {cfg.head_dim}, theta {theta}): {expected[:3].tolist()}...; check head sizes and "
            f"{'rope_theta' if kind == 'rope' else 'register_rope_theta'}"
        )


def from_timm(state_dict: dict[str, torch.Tensor], cfg: ViT5Config) -> dict[str, torch.Tensor]:
    """Map a timm ``VisionTransformer`` state dict; folds a CLS row of the APE into ``cls_token``."""
    out = dict(state_dict)
    pos = out.get("pos_embed")
    n_patches = cfg.grid_size[0] * cfg.grid_size[1]
    if pos is not None and "cls_token" in out and _has_class_row(pos.shape[1], n_patches):
        out["cls_token"] = out["cls_token"] + pos[:, :1]
        out["pos_embed"] = pos[:, 1:]
    return out


def _has_class_row(rows: int, n_patches: int) -> bool:
    """Whether an APE of ``rows`` rows has a leading CLS row (rows = 1 + square grid)."""
    if rows in (n_patches, n_patches + 1):
        return rows == n_patches + 1
    return _is_square(rows - 1) and not _is_square(rows)


def _is_square(n: int) -> bool:
    return n > 0 and math.isqrt(n) ** 2 == n


def convert(state_dict: dict[str, torch.Tensor], source: Source, cfg: ViT5Config) -> dict[str, torch.Tensor]:
    converters = {"official": from_official, "timm": from_timm, "vit5": lambda sd, _: dict(sd)}
    if source not in converters:
        raise CheckpointError(f"unknown checkpoint source {source!r}: use one of {tuple(converters)}")
    return converters[source](state_dict, cfg)


def infer_config(state_dict: dict[str, torch.Tensor], source: Source) -> dict[str, Any]:
    """Architecture fields read off the tensor shapes of an official or timm state dict: sizes, depth,
    heads (from QK-Norm or RoPE shapes, else 64-dim heads when the width allows), registers, classes, norm,
    biases and the (square) APE grid."""
    sd = state_dict
    try:
        weight = sd["patch_embed.proj.weight"]
    except KeyError:
        raise CheckpointError("not a ViT state dict: it has no 'patch_embed.proj.weight'") from None
    dim, in_chans, patch = weight.shape[0], weight.shape[1], weight.shape[-1]
    blocks = [int(m.group(1)) for k in sd if (m := _BLOCK_KEY.match(k))]
    if not blocks or "blocks.0.mlp.fc1.weight" not in sd:
        raise CheckpointError(
            "not a ViT / ViT-5 state dict this loader understands: it needs blocks.N.* with a GELU MLP "
            "(blocks.0.mlp.fc1.weight); for other timm models use timm.create_model and load_state_dict"
        )
    depth = 1 + max(blocks)
    official = source == "official"
    head_dim = _infer_head_dim(sd, official)
    out: dict[str, Any] = dict(
        patch_size=patch,
        in_chans=in_chans,
        embed_dim=dim,
        depth=depth,
        num_classes=sd["head.weight"].shape[0] if "head.weight" in sd else 0,
        norm="layernorm" if "norm.bias" in sd else "rmsnorm",
        qkv_bias="blocks.0.attn.qkv.bias" in sd,
        qk_norm="blocks.0.attn.q_norm.weight" in sd,
        class_token="cls_token" in sd,
        num_registers=sd["reg_token"].shape[1] if "reg_token" in sd else 0,
        ape="pos_embed" in sd,
        layer_scale=1e-4 if ("blocks.0.gamma_1" in sd or "blocks.0.ls1.gamma" in sd) else None,
        mlp_ratio=sd["blocks.0.mlp.fc1.weight"].shape[0] / dim,
        rope="blocks.0.attn.rope.freqs" in sd if official else False,
        register_rope="blocks.0.attn.rope_reg.freqs" in sd if official else False,
    )
    if head_dim is not None:
        out["num_heads"] = dim // head_dim
    if not out["class_token"]:
        out["global_pool"] = "avg"
    if "pos_embed" in sd:
        rows = sd["pos_embed"].shape[1]
        if not official and out["class_token"] and _has_class_row(rows, -1):
            rows -= 1
        if not _is_square(rows):
            raise CheckpointError(
                f"cannot infer the image size from a position embedding of {rows} rows (not a square grid): "
                "create the model by preset name with img_size=... and pass pretrained=PATH"
            )
        out["img_size"] = math.isqrt(rows) * patch
    return out


def _infer_head_dim(sd: dict[str, torch.Tensor], official: bool) -> int | None:
    """From the QK-Norm or RoPE shapes; else the standard 64 when the width allows; else unknown."""
    if "blocks.0.attn.q_norm.weight" in sd:
        return sd["blocks.0.attn.q_norm.weight"].shape[0]
    if official and "blocks.0.attn.rope.freqs" in sd:
        return 4 * sd["blocks.0.attn.rope.freqs"].shape[0]
    return 64 if sd["patch_embed.proj.weight"].shape[0] % 64 == 0 else None


def config_from_checkpoint(
    state_dict: dict[str, torch.Tensor], source: Source, **overrides: Any
) -> ViT5Config:
    inferred = infer_config(state_dict, source)
    if "num_heads" not in inferred and "num_heads" not in overrides:
        raise CheckpointError(
            f"cannot infer the number of attention heads of this {source} checkpoint (width "
            f"{inferred['embed_dim']}, no QK-Norm or RoPE shapes to read it from): pass num_heads=..."
        )
    try:
        return ViT5Config.from_dict({**inferred, **overrides})
    except ConfigError as err:
        raise CheckpointError(
            f"the inferred architecture is invalid ({err}); pass the preset name instead"
        ) from err

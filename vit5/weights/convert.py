"""State-dict converters and the architecture of a state dict's shapes.

The official ViT-5 code (``wangf3014/ViT-5`` ``models_vit5.py``): LayerScale renamed, RoPE buffers
verified and dropped. timm ``VisionTransformer``: the same names; a CLS row of the APE is folded
into ``cls_token``, exactly. :func:`config_from_checkpoint` reads the architecture off the shapes.
"""

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
_OFFICIAL_ROPE = {
    "attn.rope.freqs": ("rope", "rope_theta"),
    "attn.rope_reg.freqs": ("register_rope", "register_rope_theta"),
}
_BLOCK_KEY = re.compile(r"^blocks\.(\d+)\.(.+)$")


class CheckpointError(Vit5Error, ValueError):
    """A checkpoint cannot be loaded as asked; the message lists what does not fit and how to fix
    it."""


class HeadMismatchError(CheckpointError):
    """The checkpoint's classifier head is for another number of classes (fine-tuning: start a new
    head)."""


class OverrideMismatchError(CheckpointError):
    """Settings the model was built with (config overrides) that the checkpoint's weights cannot
    take, such as another width or depth: ``settings`` maps each to ``(asked, held)``, so that a
    caller can name where the setting came from (the training config says
    ``model.overrides.NAME``)."""

    def __init__(self, message: str, settings: dict[str, tuple[Any, Any]]):
        super().__init__(message)
        self.settings = settings

    def dotlist(self, prefix: str) -> str:
        """The values the weights hold as ``key=value`` overrides of a YAML config, e.g.
        ``"model.overrides.embed_dim=384 model.overrides.norm=layernorm"``."""
        pairs = [f"{prefix}{k}={_yaml_value(held)}" for k, (_, held) in self.settings.items()]
        return " ".join(pairs)


def _yaml_value(value: Any) -> str:
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    return str(value)


def detect_source(state_dict: dict[str, torch.Tensor]) -> Source:
    """``"official"`` when the ViT-5 code's LayerScale names are present, else timm-style
    names."""
    official = any(k.endswith(".gamma_1") for k in state_dict)
    return "official" if official else "timm"


StateDict = dict[str, torch.Tensor]


def from_official(state_dict: StateDict, cfg: ViT5Config) -> StateDict:
    """An official ViT-5 state dict (``torch.load(path)["model"]``) in our names; its RoPE
    frequency buffers (rebuilt at run time) must be the ones ``cfg`` computes."""
    out = {}
    for key, value in state_dict.items():
        match = _BLOCK_KEY.match(key)
        rest = match.group(2) if match else None
        if rest in _OFFICIAL_RENAMES:
            out[f"blocks.{match.group(1)}.{_OFFICIAL_RENAMES[rest]}"] = value
        elif rest in _OFFICIAL_ROPE:
            _check_rope_buffer(key, value, cfg, *_OFFICIAL_ROPE[rest])
        else:
            out[key] = value
    return out


def _check_rope_buffer(
    key: str,
    value: torch.Tensor,
    cfg: ViT5Config,
    switch: str,
    theta: str,
) -> None:
    """An official RoPE ``freqs`` buffer must be the frequencies ``cfg`` builds at run time."""
    off = not getattr(cfg, switch)
    if switch == "register_rope" and cfg.num_registers == 0:
        off = True
    if off:
        raise CheckpointError(
            f"checkpoint has {key} (a RoPE model) but this model has it off: set {switch}=True"
        )
    base = getattr(cfg, theta)
    expected = rope_frequencies(cfg.head_dim, base).float()
    same = value.shape == expected.shape
    same = same and torch.allclose(value.float().cpu(), expected, rtol=1e-4, atol=1e-7)
    if not same:
        held = value.flatten()[:3].tolist()
        raise CheckpointError(
            f"{key} holds RoPE frequencies {held}... that differ from this model's "
            f"(head_dim {cfg.head_dim}, theta {base}): "
            f"{expected[:3].tolist()}...; check head sizes and {theta}"
        )


def from_timm(state_dict: StateDict, cfg: ViT5Config) -> StateDict:
    """Map a timm ``VisionTransformer`` state dict; folds a CLS row of the APE into
    ``cls_token``."""
    out = dict(state_dict)
    pos = state_dict.get("pos_embed")
    if pos is None or "cls_token" not in out:
        return out
    if _has_class_row(pos.shape[1], math.prod(cfg.grid_size)):
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


def convert(state_dict: StateDict, source: Source, cfg: ViT5Config) -> StateDict:
    """``state_dict`` of ``source`` in vit5's names."""
    converters = {
        "official": from_official,
        "timm": from_timm,
        "vit5": lambda sd, _: dict(sd),
    }
    if source not in converters:
        known = tuple(converters)
        raise CheckpointError(f"unknown checkpoint source {source!r}: use one of {known}")
    return converters[source](state_dict, cfg)


def config_from_checkpoint(sd: StateDict, source: Source, **overrides: Any) -> ViT5Config:
    """The architecture of an official or timm state dict, read off its shapes (heads from QK-Norm
    or RoPE shapes, else 64-dim heads when the width allows; the image size from a square APE),
    with ``overrides``."""
    if "patch_embed.proj.weight" not in sd:
        raise CheckpointError("not a ViT state dict: it has no 'patch_embed.proj.weight'")
    weight = sd["patch_embed.proj.weight"]
    official = source == "official"
    dim = weight.shape[0]
    patch = weight.shape[-1]
    blocks = [int(m.group(1)) for k in sd if (m := _BLOCK_KEY.match(k))]
    if not blocks or "blocks.0.mlp.fc1.weight" not in sd:
        raise CheckpointError(
            "not a ViT / ViT-5 state dict this loader understands: "
            "it needs blocks.N.* with a GELU MLP (blocks.0.mlp.fc1.weight); "
            "for other timm models use timm.create_model and load_state_dict"
        )
    q_norm = sd.get("blocks.0.attn.q_norm.weight")
    freqs = sd.get("blocks.0.attn.rope.freqs")
    head_dim = 0
    if q_norm is not None:
        head_dim = q_norm.shape[0]
    elif official and freqs is not None:
        head_dim = 4 * freqs.shape[0]
    if head_dim or dim % 64 == 0:  # else the standard 64 when the width allows
        overrides.setdefault("num_heads", dim // (head_dim or 64))
    elif "num_heads" not in overrides:
        raise CheckpointError(
            f"cannot infer the number of attention heads of this {source} checkpoint "
            f"(width {dim}, no QK-Norm or RoPE shapes to read it from): pass num_heads=..."
        )
    out: dict[str, Any] = dict(
        patch_size=patch,
        in_chans=weight.shape[1],
        embed_dim=dim,
        depth=1 + max(blocks),
        num_classes=sd["head.weight"].shape[0] if "head.weight" in sd else 0,
        norm="layernorm" if "norm.bias" in sd else "rmsnorm",
        qkv_bias="blocks.0.attn.qkv.bias" in sd,
        qk_norm=q_norm is not None,
        class_token="cls_token" in sd,
        num_registers=sd["reg_token"].shape[1] if "reg_token" in sd else 0,
        ape="pos_embed" in sd,
        layer_scale=1e-4 if _has_layer_scale(sd) else None,
        mlp_ratio=sd["blocks.0.mlp.fc1.weight"].shape[0] / dim,
        rope=official and freqs is not None,
        register_rope=official and "blocks.0.attn.rope_reg.freqs" in sd,
        **({} if "cls_token" in sd else {"global_pool": "avg"}),
    )
    if "pos_embed" in sd:
        rows = sd["pos_embed"].shape[1]
        if not official and out["class_token"] and _has_class_row(rows, -1):
            rows -= 1
        if not _is_square(rows):
            raise CheckpointError(
                f"cannot infer the image size from a position embedding of {rows} rows "
                "(not a square grid): create the model by preset name with img_size=... "
                "and pass pretrained=PATH"
            )
        out["img_size"] = math.isqrt(rows) * patch
    try:
        return ViT5Config.from_dict({**out, **overrides})
    except ConfigError as err:
        raise CheckpointError(
            f"the inferred architecture is invalid ({err}); pass the preset name instead"
        ) from err


def _has_layer_scale(sd: StateDict) -> bool:
    return "blocks.0.gamma_1" in sd or "blocks.0.ls1.gamma" in sd

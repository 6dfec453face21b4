"""Model presets as data: a family of switches times a table of sizes.

``vit5_*`` are the official ViT-5 models (sizes and parameter counts as the official code),
``deit3_*`` the DeiT-III baselines of the same file (LayerNorm, qkv bias, LayerScale, APE; no RoPE,
registers or QK-Norm) and ``vanilla_vit_*`` the 2020 ViT (no LayerScale, linear drop path).
``vit5_tiny`` / ``deit3_tiny`` / ``vanilla_vit_tiny`` (dim 192, 3 heads) are for CPU work.
``vit5_{small,base,large}_patch16_{224,384}`` are the architectures of the official released weights
under timm's naming (a size at the resolution it was trained for); see :mod:`vit5.weights.hub`.
"""

from __future__ import annotations

import difflib
from typing import Any

from vit5.model.config import ConfigError, ViT5Config

SIZES: dict[str, dict[str, int]] = {
    "tiny": dict(embed_dim=192, depth=12, num_heads=3),
    "small": dict(embed_dim=384, depth=12, num_heads=6),
    "base": dict(embed_dim=768, depth=12, num_heads=12),
    "large": dict(embed_dim=1024, depth=24, num_heads=16),
    "xlarge": dict(embed_dim=1152, depth=28, num_heads=16),
}

_NO_MODERN_POSITIONS = dict(rope=False, num_registers=0, qk_norm=False)
FAMILIES: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "vit5": ({}, ("tiny", "small", "base", "large", "xlarge")),
    "deit3": (
        dict(norm="layernorm", qkv_bias=True, **_NO_MODERN_POSITIONS),
        ("tiny", "small", "base", "large"),
    ),
    "vanilla_vit": (
        dict(
            norm="layernorm",
            qkv_bias=True,
            layer_scale=None,
            drop_path_schedule="linear",
            **_NO_MODERN_POSITIONS,
        ),
        ("tiny", "small", "base"),
    ),
}

PRESETS: dict[str, dict[str, Any]] = {
    f"{family}_{size}": {**switches, **SIZES[size]}
    for family, (switches, sizes) in FAMILIES.items()
    for size in sizes
}
# (size, resolution) of the official ViT-5 weights (github.com/wangf3014/ViT-5 README, commit b7b0796)
RELEASED: tuple[tuple[str, int], ...] = (
    ("small", 224),
    ("base", 224),
    ("base", 384),
    ("large", 224),
    ("large", 384),
)
PRESETS.update(
    {f"vit5_{size}_patch16_{res}": {**PRESETS[f"vit5_{size}"], "img_size": res} for size, res in RELEASED}
)


def list_presets() -> list[str]:
    return sorted(PRESETS)


def closest_preset(cfg: ViT5Config) -> str:
    """The preset whose config differs from ``cfg`` in the fewest fields (the first on ties).

    Names a saved model for timm (``config.json`` ``architecture``); the full config travels
    alongside, so the choice affects readability only, never the model that is rebuilt.
    """
    values = cfg.to_dict()

    def distance(name: str) -> int:
        preset = preset_config(name).to_dict()
        return sum(preset[k] != v for k, v in values.items())

    return min(PRESETS, key=distance)


def preset_config(name: str, **overrides: Any) -> ViT5Config:
    """The :class:`ViT5Config` of preset ``name`` with ``overrides`` applied (validated)."""
    if name not in PRESETS:
        close = difflib.get_close_matches(name, PRESETS, n=3)
        hint = f"did you mean {', '.join(close)}?" if close else f"available: {', '.join(list_presets())}"
        raise ConfigError(f"unknown model {name!r}: {hint}")
    return ViT5Config().replace(**{**PRESETS[name], **overrides})

"""Model presets as data, a family of switches times a table of sizes: ``vit5_*`` (official ViT-5),
``deit3_*`` (the DeiT-III baselines of the same code) and ``vanilla_vit_*`` (the 2020 ViT); ``*_tiny`` are for
CPU work and ``vit5_{size}_patch16_{res}`` are the released weights' architectures under timm's naming."""

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

_DEIT3 = dict(norm="layernorm", qkv_bias=True, rope=False, num_registers=0, qk_norm=False)
FAMILIES: dict[str, tuple[dict[str, Any], tuple[str, ...]]] = {
    "vit5": ({}, ("tiny", "small", "base", "large", "xlarge")),
    "deit3": (_DEIT3, ("tiny", "small", "base", "large")),
    "vanilla_vit": (
        {**_DEIT3, "layer_scale": None, "drop_path_schedule": "linear"},
        ("tiny", "small", "base"),
    ),
}

PRESETS: dict[str, dict[str, Any]] = {
    f"{family}_{size}": {**switches, **SIZES[size]}
    for family, (switches, sizes) in FAMILIES.items()
    for size in sizes
}
# (size, resolution) of the official ViT-5 weights (github.com/wangf3014/ViT-5 README, commit b7b0796)
RELEASED = (("small", 224), ("base", 224), ("base", 384), ("large", 224), ("large", 384))
PRESETS.update(
    {
        f"vit5_{size}_patch16_{res}": {**PRESETS[f"vit5_{size}"], "img_size": res}
        for size, res in RELEASED
    }
)


def list_presets() -> list[str]:
    return sorted(PRESETS)


def closest_preset(cfg: ViT5Config) -> str:
    """The preset whose config differs from ``cfg`` in the fewest fields (the first on ties): a readable
    ``architecture`` name for timm; the full config travels alongside."""
    values = cfg.to_dict()

    def distance(name: str) -> int:
        preset = preset_config(name).to_dict()
        return sum(preset[k] != v for k, v in values.items())

    return min(PRESETS, key=distance)


def preset_config(name: str, **overrides: Any) -> ViT5Config:
    """The :class:`ViT5Config` of preset ``name`` with ``overrides`` applied (validated)."""
    if name not in PRESETS:
        close = difflib.get_close_matches(name, PRESETS, n=3)
        hint = (
            f"did you mean {', '.join(close)}?"
            if close
            else f"available: {', '.join(list_presets())}"
        )
        raise ConfigError(f"unknown model {name!r}: {hint}")
    return ViT5Config().replace(**{**PRESETS[name], **overrides})

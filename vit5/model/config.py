"""``ViT5Config``: every architectural switch of the backbone, typed and validated at construction.

Defaults are the official ViT-5 (arXiv 2602.08071) at ViT-S size, so the paper's ablations are config changes.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import types
import typing
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Literal

from vit5.errors import Vit5Error
from vit5.layers import AttentionConfig, BlockConfig, swiglu_hidden_dim


class ConfigError(Vit5Error, ValueError):
    """A configuration value or key is invalid; the message says which and how to fix it."""


def _finite(value: float | None) -> bool:
    return value is not None and math.isfinite(value) and value > 0


_FIELD_RULES: dict[
    str, tuple[Callable[[Any], bool], tuple[str, ...]]
] = {  # requirement: (check, fields)
    "must be positive": (
        lambda v: v >= 1,
        ("patch_size", "in_chans", "embed_dim", "depth", "num_heads", "swiglu_multiple_of"),
    ),
    "must be positive or None (as many as num_heads)": (
        lambda v: v is None or v >= 1,
        ("num_kv_heads",),
    ),
    "must be >= 0": (lambda v: v >= 0, ("num_classes", "num_registers")),
    "must be in [0, 1)": (lambda v: 0.0 <= v < 1.0, ("drop_path_rate", "drop_rate")),
    "must be a positive finite number": (
        _finite,
        ("mlp_ratio", "norm_eps", "rope_theta", "register_rope_theta"),
    ),
    "must be a positive finite number or None (off)": (
        lambda v: v is None or _finite(v),
        ("layer_scale",),
    ),
    "sides must be positive": (lambda v: v is None or min(v) >= 1, ("rope_ref_grid",)),
}


@dataclass(frozen=True)
class ViT5Config:
    # input and output
    img_size: int | tuple[int, int] = 224
    patch_size: int = 16
    in_chans: int = 3
    num_classes: int = 1000
    # trunk
    embed_dim: int = 384
    depth: int = 12
    num_heads: int = 6
    num_kv_heads: int | None = None  # None: MHA; 1: MQA; in between: GQA
    mlp: Literal["gelu", "swiglu"] = "gelu"
    mlp_ratio: float = 4.0
    swiglu_multiple_of: int = 64  # SwiGLU hidden = 2/3 * mlp_ratio * dim, rounded up to this
    mlp_bias: bool | None = None  # None: True for GELU, False for SwiGLU
    norm: Literal["rmsnorm", "layernorm"] = "rmsnorm"
    norm_eps: float = 1e-6
    qk_norm: bool = True
    qkv_bias: bool = False
    layer_scale: float | None = 1e-4  # None: no LayerScale
    pre_norm: bool = True
    attn_backend: Literal["sdpa", "flash_attn", "eager"] = "sdpa"
    # regularisation
    drop_path_rate: float = 0.0
    drop_path_schedule: Literal["uniform", "linear"] = "uniform"
    drop_rate: float = 0.0  # dropout before the head
    # positions
    ape: bool = True
    rope: bool = True
    rope_theta: float = 10000.0
    rope_layout: Literal["interleaved", "half"] = "interleaved"
    rope_axis_order: Literal["yx", "xy"] = "yx"
    rope_positions: Literal["integer", "rescaled"] = "integer"
    rope_ref_grid: tuple[int, int] | None = (
        None  # for "rescaled"; None: the img_size grid at construction
    )
    # extra tokens and pooling
    class_token: bool = True
    num_registers: int = 4
    register_rope: bool = True
    register_rope_theta: float = 100.0
    global_pool: Literal["token", "avg"] = "token"

    def __post_init__(self) -> None:
        _check_types(self)
        size = self.img_size
        object.__setattr__(self, "img_size", (size, size) if isinstance(size, int) else tuple(size))
        if self.rope_ref_grid is not None:
            object.__setattr__(self, "rope_ref_grid", tuple(self.rope_ref_grid))
        self._validate()
        if self.rope_positions == "rescaled" and self.rope_ref_grid is None:
            # pinned to the training grid now, so replace(img_size=...) and the saved config keep it
            object.__setattr__(self, "rope_ref_grid", self.grid_size)

    def _validate(self) -> None:
        for requirement, (ok, names) in _FIELD_RULES.items():
            for name in names:
                if not ok(value := getattr(self, name)):
                    raise ConfigError(f"{name} {requirement}, got {value!r}")
        h, w = self.img_size
        p = self.patch_size
        heads = self.num_heads
        kv = self.num_kv_heads
        if h % p or w % p or h < p or w < p:
            raise ConfigError(
                f"img_size {h}x{w} is not a multiple of patch_size {p}: use e.g. {max(p, h // p * p)}"
            )
        if self.embed_dim % heads:
            raise ConfigError(f"embed_dim {self.embed_dim} is not divisible by num_heads {heads}")
        if heads % (kv or heads):
            raise ConfigError(f"num_heads {heads} is not divisible by num_kv_heads {kv}")
        if (self.rope or (self.register_rope and self.num_registers > 0)) and self.head_dim % 4:
            raise ConfigError(
                f"2D RoPE needs head_dim divisible by 4, but embed_dim {self.embed_dim} / num_heads "
                f"{heads} = {self.head_dim}: change the sizes or set rope=False, register_rope=False"
            )
        if self.register_rope and math.isqrt(self.num_registers) ** 2 != self.num_registers:
            raise ConfigError(
                f"register RoPE places registers on a sqrt(R) x sqrt(R) grid, so num_registers must be a "
                f"perfect square, got {self.num_registers}: use 1, 4, 9, ... or register_rope=False"
            )
        if self.global_pool == "token" and not self.class_token:
            raise ConfigError(
                "global_pool='token' needs class_token=True: use global_pool='avg' without a CLS token"
            )
        if (
            self.mlp_hidden_dim < 1
        ):  # 0 would be read as "4 x embed_dim" by BlockConfig: another model
            raise ConfigError(
                f"mlp_ratio {self.mlp_ratio} gives an MLP hidden width of int({self.embed_dim} x "
                f"{self.mlp_ratio}) = 0 at embed_dim {self.embed_dim}: use mlp_ratio >= "
                f"{1 / self.embed_dim:.3g}"
            )

    # derived quantities
    @property
    def head_dim(self) -> int:
        return self.embed_dim // self.num_heads

    @property
    def grid_size(self) -> tuple[int, int]:
        return self.img_size[0] // self.patch_size, self.img_size[1] // self.patch_size

    @property
    def num_prefix_tokens(self) -> int:
        return int(self.class_token)

    @property
    def mlp_hidden_dim(self) -> int:
        if self.mlp == "swiglu":
            return swiglu_hidden_dim(self.embed_dim, self.mlp_ratio, self.swiglu_multiple_of)
        return int(self.embed_dim * self.mlp_ratio)

    def block_configs(self) -> list[BlockConfig]:
        attn = AttentionConfig(
            dim=self.embed_dim,
            num_heads=self.num_heads,
            num_kv_heads=self.num_kv_heads,
            qkv_bias=self.qkv_bias,
            qk_norm=self.qk_norm,
            norm=self.norm,
            norm_eps=self.norm_eps,
            backend=self.attn_backend,
            rope_layout=self.rope_layout,
        )
        return [
            BlockConfig(
                attn=attn,
                mlp=self.mlp,
                mlp_hidden_dim=self.mlp_hidden_dim,
                mlp_bias=self.mlp == "gelu" if self.mlp_bias is None else self.mlp_bias,
                norm=self.norm,
                norm_eps=self.norm_eps,
                layer_scale=self.layer_scale,
                pre_norm=self.pre_norm,
                drop_path=rate,
            )
            for rate in self.drop_path_rates()
        ]

    def drop_path_rates(self) -> list[float]:
        """Per-block rates: ``"uniform"`` (ViT-5, DeiT-III) or ``"linear"`` (0 to ``drop_path_rate``)."""
        if self.drop_path_schedule == "uniform":
            return [self.drop_path_rate] * self.depth
        return [self.drop_path_rate * i / max(self.depth - 1, 1) for i in range(self.depth)]

    # (de)serialisation
    def to_dict(self) -> dict[str, Any]:
        return {
            k: list(v) if isinstance(v, tuple) else v for k, v in dataclasses.asdict(self).items()
        }

    @classmethod
    def from_dict(cls, values: dict[str, Any]) -> ViT5Config:
        """A config from :meth:`to_dict` output (a ``config.json``); anything else is a ConfigError."""
        if not isinstance(values, dict):
            raise ConfigError(
                f"a {cls.__name__} must be a mapping of field names to values, not {type(values).__name__}"
            )
        check_keys(values, cls)
        return cls(**values)

    def replace(self, **changes: Any) -> ViT5Config:
        check_keys(changes, type(self))
        return dataclasses.replace(self, **changes)


def check_keys(values: dict[str, Any], cls: type) -> None:
    """Fail on keys that are not fields of dataclass ``cls``, suggesting the closest field."""
    fields = [f.name for f in dataclasses.fields(cls)]
    for key in values:
        if key not in fields:
            close = difflib.get_close_matches(key, fields, n=1)
            hint = f"did you mean {close[0]!r}?" if close else f"valid keys: {', '.join(fields)}"
            raise ConfigError(f"unknown {cls.__name__} key {key!r}: {hint}")


def _check_types(cfg: Any) -> None:
    hints = typing.get_type_hints(type(cfg))
    for field in dataclasses.fields(cfg):
        value = getattr(cfg, field.name)
        hint = hints[field.name]
        if not _matches(value, hint):
            expected = hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")
            if typing.get_origin(hint) is Literal:
                expected = "one of " + ", ".join(map(repr, typing.get_args(hint)))
            raise ConfigError(
                f"{type(cfg).__name__}.{field.name} = {value!r} has the wrong type: expected {expected}"
            )


def _matches(value: Any, hint: Any) -> bool:
    origin = typing.get_origin(hint)
    if origin is Literal:
        return value in typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(_matches(value, arg) for arg in typing.get_args(hint))
    if origin is tuple:
        args = typing.get_args(hint)
        return (
            isinstance(value, (tuple, list))
            and len(value) == len(args)
            and all(map(_matches, value, args))
        )
    if hint in (int, float):  # an int is a float, a bool is neither
        return isinstance(value, (int, hint)) and not isinstance(value, bool)
    return isinstance(value, hint)

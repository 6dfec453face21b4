"""How big a :class:`ViT5Config` is, from the config alone, before anything is allocated: the exact
parameter count, lower bounds of activation memory (to refuse work that cannot fit, not to predict it),
and :func:`check_size`, which stops a crafted ``config.json`` (depth 1e9) before it allocates."""

from __future__ import annotations

import math
from dataclasses import dataclass

from vit5.model.config import ConfigError, ViT5Config
from vit5.runtime import format_bytes

# 4x the largest preset; raised by max_params=, --max-params or model.max_params
DEFAULT_MAX_PARAMS = 2_000_000_000
BIG_TOKEN_COUNT = 16_384  # tokens per image beyond which a forward takes long (attention is quadratic)


def _norm_params(cfg: ViT5Config, dim: int) -> int:
    return dim * (2 if cfg.norm == "layernorm" else 1)


def _linear_params(fan_in: int, fan_out: int, bias: bool) -> int:
    return fan_in * fan_out + (fan_out if bias else 0)


def parameter_count(cfg: ViT5Config) -> int:
    """The exact number of parameters of ``ViT5(cfg)`` (Python integers: no overflow)."""
    d, p = cfg.embed_dim, cfg.patch_size
    kv = cfg.num_kv_heads if cfg.num_kv_heads is not None else cfg.num_heads
    rows, cols = cfg.grid_size
    total = _linear_params(cfg.in_chans * p * p, d, bias=True)  # patch embedding
    total += d * int(cfg.class_token) + cfg.num_registers * d + (rows * cols * d if cfg.ape else 0)
    hidden = cfg.mlp_hidden_dim
    mlp_bias = cfg.mlp == "gelu" if cfg.mlp_bias is None else cfg.mlp_bias
    fc1_out = 2 * hidden if cfg.mlp == "swiglu" else hidden
    block = 2 * _norm_params(cfg, d)
    block += _linear_params(d, (cfg.num_heads + 2 * kv) * cfg.head_dim, cfg.qkv_bias)
    block += 2 * _norm_params(cfg, cfg.head_dim) if cfg.qk_norm else 0
    block += _linear_params(d, d, bias=True)  # attention output projection
    block += 2 * d if cfg.layer_scale is not None else 0
    block += _linear_params(d, fc1_out, mlp_bias) + _linear_params(hidden, d, mlp_bias)
    total += cfg.depth * block + _norm_params(cfg, d)
    return total + (_linear_params(d, cfg.num_classes, bias=True) if cfg.num_classes else 0)


def num_tokens(cfg: ViT5Config, input_hw: tuple[int, int] | None = None) -> int:
    """Sequence length for an input of ``input_hw`` (default: the config's image size)."""
    h, w = input_hw if input_hw is not None else cfg.img_size
    return (h // cfg.patch_size) * (w // cfg.patch_size) + int(cfg.class_token) + cfg.num_registers


def activation_bytes(
    cfg: ViT5Config,
    batch: int = 1,
    input_hw: tuple[int, int] | None = None,
    *,
    training: bool = False,
    bytes_per_value: int = 4,
    materialised_attention: bool = False,
) -> int:
    """A lower bound of a forward's activations: one block's residual, normed input, q/k/v, attention
    output and MLP hidden layer; ``training`` keeps those of every block; ``materialised_attention`` adds
    one block's ``[B, heads, N, N]`` scores and probabilities (eager or recorded attention)."""
    n = num_tokens(cfg, input_hw)
    kv = cfg.num_kv_heads if cfg.num_kv_heads is not None else cfg.num_heads
    hidden = cfg.mlp_hidden_dim
    fc1_out = 2 * hidden if cfg.mlp == "swiglu" else hidden
    per_token = 3 * cfg.embed_dim + (cfg.num_heads + 2 * kv) * cfg.head_dim + fc1_out
    per_block = batch * n * per_token * bytes_per_value
    total = per_block * (cfg.depth if training else 1)
    if materialised_attention:
        total += attention_bytes(batch, cfg.num_heads, n, bytes_per_value)
    return total


def forward_bytes(batch: int, tokens: int, width: int, bytes_per_value: int = 4) -> int:
    """A lower bound of one block's activations for any ViT of ``width`` (MLP ratio 4), e.g. a timm one."""
    return batch * tokens * 10 * width * bytes_per_value


def attention_bytes(batch: int, heads: int, tokens: int, bytes_per_value: int = 4) -> int:
    """One block's ``[B, heads, N, N]`` scores plus fp32 probabilities (eager path, recording)."""
    return batch * heads * tokens * tokens * (bytes_per_value + 4)


def training_bytes(
    cfg: ViT5Config, batch: int, bytes_per_value: int = 4, grad_checkpointing: bool = False, ema: bool = True
) -> int:
    """A lower bound of a training step after the first: fp32 weights, two optimizer moments and the EMA
    copy next to the activations kept for the backward pass."""
    copies = 3 + int(ema)
    acts = activation_bytes(cfg, batch, training=not grad_checkpointing, bytes_per_value=bytes_per_value)
    return copies * 4 * parameter_count(cfg) + acts


@dataclass(frozen=True)
class SizeEstimate:
    params: int
    param_bytes: int  # float32 weights

    def describe(self) -> str:
        count = f"{self.params / 1e9:.3g}e9" if self.params < 1e12 else f"{self.params:.3g}"  # not 8.8e+03e9
        return f"{count} parameters ({format_bytes(self.param_bytes)} in float32)"


def check_size(cfg: ViT5Config, max_params: float = DEFAULT_MAX_PARAMS, source: str = "") -> SizeEstimate:
    """Refuse a config larger than ``max_params`` parameters (ConfigError naming the size and the fix)."""
    if not (isinstance(max_params, (int, float)) and max_params > 0 and not math.isnan(max_params)):
        raise ConfigError(f"max_params must be a positive number, got {max_params!r}")
    params = parameter_count(cfg)
    size = SizeEstimate(params, 4 * params)
    if size.params > max_params:
        where = f"{source} describes" if source else "this config describes"
        raise ConfigError(
            f"{where} a model of {size.describe()} (depth {cfg.depth}, width {cfg.embed_dim}, image "
            f"{cfg.img_size[0]}x{cfg.img_size[1]}, mlp_ratio {cfg.mlp_ratio}, {cfg.num_registers} registers, "
            f"{cfg.num_classes} classes), more than the limit of {max_params:.3g} parameters. If that is "
            f"intended, raise the limit: max_params= in Python, --max-params on the command line, "
            f"model.max_params in a training config"
        )
    return size

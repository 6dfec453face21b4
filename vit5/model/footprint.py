"""How big a :class:`ViT5Config` is, from the config alone, before anything is allocated: the exact
parameter count, lower bounds of activation memory (to refuse work that cannot fit, not to predict it),
and :func:`check_size`, which stops a crafted ``config.json`` (depth 1e9) before it allocates."""

from __future__ import annotations

import math

from vit5.model.capture import CHUNK_ARRAYS, query_chunk
from vit5.model.config import ConfigError, ViT5Config
from vit5.runtime import format_bytes

# 4x the largest preset; raised by max_params=, --max-params or model.max_params
DEFAULT_MAX_PARAMS = 2_000_000_000
BIG_TOKEN_COUNT = (
    16_384  # tokens per image beyond which a forward takes long (attention is quadratic)
)


def parameter_count(cfg: ViT5Config) -> int:
    """The exact number of parameters of ``ViT5(cfg)`` (Python integers: no overflow)."""
    d = cfg.embed_dim
    p = cfg.patch_size
    norm = 2 if cfg.norm == "layernorm" else 1  # LayerNorm has a bias

    def linear(fan_in: int, fan_out: int, bias: bool = True) -> int:
        return fan_in * fan_out + (fan_out if bias else 0)

    tokens = int(cfg.class_token) + cfg.num_registers + (math.prod(cfg.grid_size) if cfg.ape else 0)
    total = linear(cfg.in_chans * p * p, d) + tokens * d  # patch embedding, CLS, registers, APE
    mlp_bias = cfg.mlp == "gelu" if cfg.mlp_bias is None else cfg.mlp_bias
    block = (
        2 * norm * d + linear(d, _qkv_width(cfg), cfg.qkv_bias) + linear(d, d)
    )  # norms, attention
    block += 2 * norm * cfg.head_dim if cfg.qk_norm else 0
    block += 2 * d if cfg.layer_scale is not None else 0
    block += linear(d, _fc1_width(cfg), mlp_bias) + linear(cfg.mlp_hidden_dim, d, mlp_bias)
    total += cfg.depth * block + norm * d
    return total + (linear(d, cfg.num_classes) if cfg.num_classes else 0)


def _qkv_width(cfg: ViT5Config) -> int:
    return (cfg.num_heads + 2 * (cfg.num_kv_heads or cfg.num_heads)) * cfg.head_dim


def _fc1_width(cfg: ViT5Config) -> int:
    return cfg.mlp_hidden_dim * (2 if cfg.mlp == "swiglu" else 1)


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
    per_block = (
        batch * n * (3 * cfg.embed_dim + _qkv_width(cfg) + _fc1_width(cfg)) * bytes_per_value
    )
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


def recording_bytes(
    batch: int,
    heads: int,
    tokens: int,
    width: int,
    depth: int,
    kept_rows: int,
    *,
    rollout: bool,
    chunk: int | None = None,
) -> int:
    """A lower bound of recording every block's attention leanly (``vit5 viz``'s
    :func:`vit5.viz.collect.figure_keep`), in float32: one block's forward
    (:func:`forward_bytes`), one query chunk's scores, probabilities and a temporary
    ``[heads, chunk, N]`` (images run one at a time; ``chunk`` None: as many rows as
    :func:`vit5.model.capture.query_chunk` fits), with ``rollout`` q and k of every block
    ``[B, N, width]`` each (kept only for the rollout), and what every block keeps:
    ``kept_rows`` rows and 4 vectors per head ``[B, heads, N]`` (received, mass on registers,
    entropy, peak)."""
    forward = forward_bytes(batch, tokens, width)
    rows = min(chunk or query_chunk(heads, tokens), tokens)
    chunk_arrays = CHUNK_ARRAYS * heads * rows * tokens * 4
    queries_keys = depth * 2 * batch * tokens * width * 4 if rollout else 0
    kept = depth * (kept_rows + 4) * batch * heads * tokens * 4
    return forward + chunk_arrays + queries_keys + kept


def training_bytes(
    cfg: ViT5Config,
    batch: int,
    bytes_per_value: int = 4,
    grad_checkpointing: bool = False,
    ema: bool = True,
) -> int:
    """A lower bound of a training step after the first: fp32 weights, two optimizer moments and the EMA
    copy next to the activations kept for the backward pass."""
    copies = 3 + int(ema)
    acts = activation_bytes(
        cfg, batch, training=not grad_checkpointing, bytes_per_value=bytes_per_value
    )
    return copies * 4 * parameter_count(cfg) + acts


def check_size(cfg: ViT5Config, max_params: float = DEFAULT_MAX_PARAMS, source: str = "") -> int:
    """The parameter count of ``cfg``; ConfigError naming the size and the fix above ``max_params``."""
    if not (isinstance(max_params, (int, float)) and max_params > 0 and not math.isnan(max_params)):
        raise ConfigError(f"max_params must be a positive number, got {max_params!r}")
    params = parameter_count(cfg)
    if params > max_params:
        count = f"{params / 1e9:.3g}e9" if params < 1e12 else f"{params:.3g}"  # not 8.8e+03e9
        raise ConfigError(
            f"{source or 'this config'} describes a model of {count} parameters ({format_bytes(4 * params)} "
            f"in float32) (depth {cfg.depth}, width {cfg.embed_dim}, image {cfg.img_size[0]}x"
            f"{cfg.img_size[1]}, mlp_ratio {cfg.mlp_ratio}, {cfg.num_registers} registers, {cfg.num_classes} "
            f"classes), more than the limit of {max_params:.3g} parameters. If that is intended, raise the "
            f"limit: max_params= in Python, --max-params on the command line, model.max_params in a training "
            "config"
        )
    return params

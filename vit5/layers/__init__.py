"""Building blocks of a modern ViT, pure torch: one concept per module."""

from .attention import ATTENTION_BACKENDS, Attention, AttentionConfig, causal_mask, eager_attention
from .block import Block, BlockConfig, LayerScale
from .drop import DropPath, drop_path, drop_path_rates
from .kv_cache import KVCache, LayerKVCache
from .mlp import Mlp, SwiGLU, swiglu_hidden_dim
from .norm import RMSNorm, make_norm
from .patch_embed import PatchEmbed
from .pos_embed import resample_pos_embed
from .rope import Rope2D, apply_rope, rope_angles_2d, rope_cos_sin, rope_frequencies, rotate_pairs

__all__ = [
    "ATTENTION_BACKENDS", "Attention", "AttentionConfig", "Block", "BlockConfig", "DropPath", "KVCache",
    "LayerKVCache", "LayerScale", "Mlp", "PatchEmbed", "RMSNorm", "Rope2D", "SwiGLU", "apply_rope",
    "causal_mask", "drop_path", "drop_path_rates", "eager_attention", "make_norm", "resample_pos_embed",
    "rope_angles_2d", "rope_cos_sin", "rope_frequencies", "rotate_pairs", "swiglu_hidden_dim",
]

"""Building blocks of a modern ViT on torch (MLPs and stochastic depth from timm): one concept per module."""
# ruff: noqa: F401 (the re-exports are the public names)

from vit5.layers.attention import ATTENTION_BACKENDS, Attention, AttentionConfig, eager_attention
from vit5.layers.block import Block, BlockConfig, LayerScale, Mlp, SwiGLU, swiglu_hidden_dim
from vit5.layers.norm import RMSNorm, make_norm
from vit5.layers.patch_embed import PatchEmbed
from vit5.layers.pos_embed import resample_pos_embed
from vit5.layers.rope import (
    Rope2D,
    RopeTable,
    apply_rope,
    rope_angles_2d,
    rope_cos_sin,
    rope_frequencies,
    rotate_pairs,
)

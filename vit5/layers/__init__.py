"""Building blocks of a modern ViT, pure torch: one concept per module."""
# ruff: noqa: F401 (the re-exports are the public names)

from vit5.layers.attention import (
    ATTENTION_BACKENDS,
    Attention,
    AttentionConfig,
    causal_mask,
    eager_attention,
)
from vit5.layers.block import (
    Block,
    BlockConfig,
    DropPath,
    LayerScale,
    Mlp,
    SwiGLU,
    add_branch,
    swiglu_hidden_dim,
)
from vit5.layers.kv_cache import KVCache, LayerKVCache
from vit5.layers.norm import RMSNorm, make_norm, rms_norm
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

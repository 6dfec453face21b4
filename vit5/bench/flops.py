"""Forward FLOPs of a ViT: counted by ``FlopCounterMode`` and derived analytically from the config.

Only matrix products count (patch-embed conv, linears, the two attention matmuls); norms, softmax
and elementwise ops are a few percent of the total and are left out by both methods, as usual for
MFU. One multiply-add is 2 FLOPs. The analytic formula is the independent check of the counter.
"""

from __future__ import annotations

import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from vit5 import ViT5Config

aten = torch.ops.aten


def _cpu_sdpa_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """PyTorch counts its CUDA attention kernels but not the CPU flash kernel; same formula."""
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def counted_forward_flops(model: nn.Module, images: torch.Tensor) -> int:
    """FLOPs of one forward of ``model`` on ``images`` as counted by ``FlopCounterMode``."""
    cpu_attention = {aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa_flops}
    counter = FlopCounterMode(display=False, custom_mapping=cpu_attention)
    with counter, torch.no_grad():
        model(images)
    return counter.get_total_flops()


def analytic_forward_flops(cfg: ViT5Config, batch: int = 1, img_hw: tuple[int, int] | None = None) -> int:
    """FLOPs of a ViT-5 forward from its config: ``2 * (multiply-adds of every matrix product)``."""
    h, w = img_hw if img_hw is not None else cfg.img_size
    patches = (h // cfg.patch_size) * (w // cfg.patch_size)
    tokens = patches + int(cfg.class_token) + cfg.num_registers
    d, hd = cfg.embed_dim, cfg.head_dim
    kv_heads = cfg.num_kv_heads or cfg.num_heads
    mlp_mats = 3 if cfg.mlp == "swiglu" else 2
    per_block = (
        tokens * d * (cfg.num_heads + 2 * kv_heads) * hd  # qkv
        + 2 * cfg.num_heads * tokens * tokens * hd  # q k^T and p v
        + tokens * d * d  # output projection
        + mlp_mats * tokens * d * cfg.mlp_hidden_dim
    )
    macs = patches * d * cfg.in_chans * cfg.patch_size**2 + cfg.depth * per_block + d * cfg.num_classes
    return 2 * batch * macs

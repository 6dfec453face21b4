"""Tiny models, images and an independent planting hook for the tests of vit5.viz (test_viz_*.py)."""

from __future__ import annotations

import cv2
import numpy as np
import timm
import torch

import vit5
from vit5.viz import LoadedImage


def sharpen(model: torch.nn.Module, scale: float = 6.0) -> torch.nn.Module:
    """Scale the qkv weights so attention is far from uniform (a weak test passes on uniform maps)."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("qkv.weight"):
                p.mul_(scale)
            elif "norm" in name and p.ndim == 1 and name.endswith("weight"):
                p.uniform_(0.5, 1.5)
    return model.eval()


def tiny_vit5(**overrides) -> torch.nn.Module:
    cfg = dict(depth=2, img_size=32, patch_size=8, num_classes=0)
    return sharpen(vit5.create_model("vit5_tiny", **{**cfg, **overrides}))


def tiny_timm(reg_tokens: int = 4, **overrides) -> torch.nn.Module:
    cfg = dict(depth=2, embed_dim=64, num_heads=2, img_size=32, patch_size=8, num_classes=0, reg_tokens=reg_tokens,
               no_embed_class=True, dynamic_img_size=True, qk_norm=True)
    return sharpen(timm.create_model("vit_small_patch16_224", pretrained=False, **{**cfg, **overrides}))


def smooth_rgb(height: int, width: int, seed: int) -> np.ndarray:
    noise = np.random.default_rng(seed).random((height, width, 3)).astype(np.float32)
    blurred = cv2.GaussianBlur(noise, (0, 0), sigmaX=3)
    return np.rint((blurred - blurred.min()) / (blurred.max() - blurred.min()) * 255).astype(np.uint8)


def smooth_images(count: int, height: int = 32, width: int = 48) -> list[LoadedImage]:
    return [LoadedImage(f"img{i}", smooth_rgb(height, width, i)) for i in range(count)]


def write_png(path, rgb: np.ndarray):
    path.parent.mkdir(parents=True, exist_ok=True)
    assert cv2.imwrite(str(path), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    return path


def multiply_tokens(block: torch.nn.Module, token_indices: list[int], scale: float):
    """A forward hook (written here, independent of vit5.viz.plant) scaling chosen tokens of a block's output."""

    def hook(module, inputs, output):
        out = output.clone()
        out[:, token_indices] *= scale
        return out

    return block.register_forward_hook(hook)

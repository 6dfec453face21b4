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
    cfg = dict(
        depth=2,
        embed_dim=64,
        num_heads=2,
        img_size=32,
        patch_size=8,
        num_classes=0,
        reg_tokens=reg_tokens,
        no_embed_class=True,
        dynamic_img_size=True,
        qk_norm=True,
    )
    return sharpen(
        timm.create_model("vit_small_patch16_224", pretrained=False, **{**cfg, **overrides})
    )


def smooth_rgb(height: int, width: int, seed: int) -> np.ndarray:
    noise = np.random.default_rng(seed).random((height, width, 3)).astype(np.float32)
    blurred = cv2.GaussianBlur(noise, (0, 0), sigmaX=3)
    return np.rint((blurred - blurred.min()) / (blurred.max() - blurred.min()) * 255).astype(
        np.uint8
    )


def smooth_images(count: int, height: int = 32, width: int = 48) -> list[LoadedImage]:
    return [LoadedImage(f"img{i}", smooth_rgb(height, width, i)) for i in range(count)]


def write_png(path, rgb: np.ndarray):
    path.parent.mkdir(parents=True, exist_ok=True)
    assert cv2.imwrite(str(path), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    return path


def multiply_tokens(block: torch.nn.Module, token_indices: list[int], scale: float):
    """A forward hook (written here, independent of vit5.viz.plant) scaling chosen tokens of a block's
    output."""

    def hook(module, inputs, output):
        out = output.clone()
        out[:, token_indices] *= scale
        return out

    return block.register_forward_hook(hook)


def bright_patch_images(
    count: int, bright: list[tuple[int, int]], height: int = 32, width: int = 48, patch: int = 8
):
    """Smooth dark images (pixels <= 100) with pure white patches at ``bright`` (row, col) grid positions."""
    images = []
    for i in range(count):
        rgb = (
            (smooth_rgb(height, width, 100 + i).astype(np.float32) * (100 / 255))
            .round()
            .astype(np.uint8)
        )
        for r, c in bright:
            rgb[r * patch : (r + 1) * patch, c * patch : (c + 1) * patch] = 255
        images.append(LoadedImage(f"bright{i}", rgb))
    return images


def mlp_input(model: torch.nn.Module, layer: int, images) -> torch.Tensor:
    """``[B, N, C]`` input of block ``layer``'s ``mlp.fc1`` (after its norm), recorded with a plain hook."""
    from vit5.viz import describe, to_batch

    info = describe(model)
    seen = {}
    handle = model.blocks[layer].mlp.fc1.register_forward_pre_hook(
        lambda m, a: seen.__setitem__("h", a[0].detach())
    )
    with torch.no_grad():
        model.forward_features(to_batch(images, info.mean, info.std))
    handle.remove()
    return seen["h"]


def plant_outlier_neuron(
    model, layer: int, neuron: int, images, token_indices: list[int], boost: float = 30.0
) -> None:
    """Weight planting (written here, independent of vit5.viz.ttr): hidden unit ``neuron`` of block
    ``layer``'s GELU MLP fires only on the tokens ``token_indices`` of ``images`` and writes a large
    vector there.

    Its fc1 row reads the direction separating those tokens' MLP inputs from all others, with the bias
    half-way between the two groups, so GELU is ~0 elsewhere; its fc2 column points along a random unit
    vector, scaled so the planted tokens' norms grow by about ``boost`` times the median token norm.
    """
    h = mlp_input(model, layer, images)
    mask = torch.zeros(h.shape[1], dtype=torch.bool)
    mask[token_indices] = True
    direction = h[:, mask].mean(dim=(0, 1)) - h[:, ~mask].mean(dim=(0, 1))
    direction = direction / direction.norm()
    s = h @ direction
    low, high = s[:, ~mask].max(), s[:, mask].min()
    assert high > low, "the planted tokens are not linearly separable from the others"
    gain = 40.0 / float(high - low)
    mlp = model.blocks[layer].mlp
    with torch.no_grad():
        mlp.fc1.weight[neuron] = gain * direction
        mlp.fc1.bias[neuron] = -gain * (low + high) / 2
        fired = torch.nn.functional.gelu(gain * (s[:, mask] - (low + high) / 2)).mean()
        from vit5.viz import describe, to_batch

        info = describe(model)
        with torch.no_grad():
            tokens = model.forward_intermediates(
                to_batch(images, info.mean, info.std),
                indices=[layer],
                output_fmt="NLC",
                intermediates_only=True,
            )[0]
        median = tokens.norm(dim=-1).median()
        block = model.blocks[layer]
        # LayerScale: vit5 / timm ViT ``ls2.gamma``, timm Eva ``gamma_2`` (None without it)
        gamma = getattr(getattr(block, "ls2", None), "gamma", getattr(block, "gamma_2", None))
        gamma = torch.ones(1) if gamma is None else gamma.abs().mean()
        u = torch.nn.functional.normalize(
            torch.randn(h.shape[-1], generator=torch.Generator().manual_seed(7)), dim=0
        )
        mlp.fc2.weight[:, neuron] = u * boost * median / (fired * gamma)

"""Shared pieces of the evaluation tests: a tiny ViT-5 trained on the digits for a few seconds
(cached once per test session) and small image folders."""

from __future__ import annotations

import atexit
import functools
import shutil
import tempfile
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import torch

import vit5
from vit5.data import IMAGENET_MEAN, IMAGENET_STD, export_digits_imagefolder, load_digits_split

TINY = dict(depth=2, embed_dim=64, num_heads=2, img_size=32, patch_size=8, num_classes=10)


def tiny_model(**overrides) -> vit5.ViT5:
    return vit5.create_model("vit5_tiny", **{**TINY, **overrides})


@contextmanager
def single_thread():
    """Tiny models run fastest on one thread, and it keeps timings sane on a shared 2-core box."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        yield
    finally:
        torch.set_num_threads(before)


def _digits_tensors(split: str) -> tuple[torch.Tensor, torch.Tensor]:
    data = load_digits_split(split, size=32)
    x = torch.from_numpy(data.images).permute(0, 3, 1, 2).float() / 255.0
    x = (x - torch.tensor(IMAGENET_MEAN)[:, None, None]) / torch.tensor(IMAGENET_STD)[:, None, None]
    return x, torch.from_numpy(data.targets)


def train_tiny(
    steps: int = 150, seed: int = 0, ema_decay: float = 0.9
) -> tuple[vit5.ViT5, dict[str, torch.Tensor]]:
    """Plain AdamW on the digits at 32 px (about 5 s on one core); returns the model and EMA weights."""
    images, targets = _digits_tensors("train")
    torch.manual_seed(seed)
    model = tiny_model()
    ema = {k: v.detach().clone() for k, v in model.state_dict().items()}
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.05)
    generator = torch.Generator().manual_seed(seed)
    with single_thread():
        for _ in range(steps):
            idx = torch.randint(0, len(targets), (64,), generator=generator)
            loss = torch.nn.functional.cross_entropy(model(images[idx]), targets[idx])
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            with torch.no_grad():
                for k, v in model.state_dict().items():
                    ema[k].lerp_(v, 1.0 - ema_decay)
    return model.eval(), ema


def _scratch() -> Path:
    path = Path(tempfile.mkdtemp(prefix="vit5-eval-tests-"))
    atexit.register(shutil.rmtree, path, ignore_errors=True)
    return path


@functools.cache
def trained_checkpoint() -> Path:
    """A vit5 checkpoint directory (raw + EMA weights) of the tiny digits model, made once per session."""
    model, ema = train_tiny()
    return vit5.save_pretrained(model, _scratch() / "tiny-digits", ema_state_dict=ema)


@functools.cache
def digits_folder() -> Path:
    """The digits as an ImageFolder tree (train 1438 / val 359 PNGs at 32 px)."""
    root = _scratch() / "digits"
    export_digits_imagefolder(root, size=32)
    return root


def random_rgb(height: int, width: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (height, width, 3), dtype=np.uint8)

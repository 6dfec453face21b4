"""``vit5 bench data-pipeline``: OpenCV + albumentations (``vit5.data``) against torchvision's PIL pipeline.

Both sides decode the **same JPEG files** (ImageNet-like sizes, cut from scikit-learn's sample
photos) and apply the **same transforms** to a normalised 224 px float tensor: ``train`` is the
ViT-5 pre-training 3-Augment (DeiT-III ``augment.py``: random-resized crop, flip, one of
{grayscale, solarize, blur}, colour jitter 0.3), ``eval`` resize + centre crop. Each round runs
both over all files, one core each, side by side (:func:`vit5.bench.measure.measure`); the eval
outputs are compared to show they compute the same thing.
"""

from __future__ import annotations

import random
import tempfile
import time
from pathlib import Path
from typing import Any

import cv2
import numpy as np
from PIL import Image, ImageFilter, ImageOps
from sklearn.datasets import load_sample_images
from torchvision import transforms as T

from vit5.bench.measure import TimingConfig, measure, num_threads, speedup
from vit5.bench.report import Section, Table
from vit5.data import IMAGENET_MEAN, IMAGENET_STD, decode_image, eval_transform, three_augment

SIZE = 224
IMAGENET_LIKE_SIZES = ((375, 500), (500, 375), (333, 500), (500, 333), (480, 640), (427, 640))  # (H, W)
CONTENDERS = ("opencv_albumentations", "torchvision_pil")


def make_jpegs(directory: Path, count: int, seed: int = 0) -> list[Path]:
    """``count`` JPEGs (quality 90) cut and resized from scikit-learn's two 427 x 640 sample photos."""
    rng = np.random.default_rng(seed)
    photos = load_sample_images().images
    paths = []
    for i in range(count):
        height, width = IMAGENET_LIKE_SIZES[i % len(IMAGENET_LIKE_SIZES)]
        crop_h, crop_w = int(rng.integers(280, 428)), int(rng.integers(380, 641))
        y, x = int(rng.integers(0, 428 - crop_h)), int(rng.integers(0, 641 - crop_w))
        patch = photos[i % len(photos)][y : y + crop_h, x : x + crop_w]
        patch = cv2.resize(patch, (width, height), interpolation=cv2.INTER_AREA)
        paths.append(directory / f"{i:04d}.jpg")
        cv2.imwrite(str(paths[-1]), cv2.cvtColor(patch, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 90])
    return paths


def vit5_pipelines() -> dict[str, Any]:
    train, val = three_augment(SIZE, color_jitter=0.3), eval_transform(SIZE, crop_ratio=1.0)
    return {"train": lambda p: train(decode_image(p)), "eval": lambda p: val(decode_image(p))}


def torchvision_pipelines() -> dict[str, Any]:
    """The official DeiT-III / ViT-5 transforms on PIL (``augment.py``; ``datasets.py`` for eval)."""
    finish = [T.ToTensor(), T.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
    blur = T.Lambda(lambda im: im.filter(ImageFilter.GaussianBlur(radius=random.uniform(0.1, 2.0))))
    train = T.Compose(
        [
            T.RandomResizedCrop(SIZE, interpolation=T.InterpolationMode.BICUBIC),
            T.RandomHorizontalFlip(),
            T.RandomChoice([T.Grayscale(3), T.Lambda(ImageOps.solarize), blur]),
            T.ColorJitter(0.3, 0.3, 0.3),
            *finish,
        ]
    )
    val = T.Compose([T.Resize(SIZE, interpolation=T.InterpolationMode.BICUBIC), T.CenterCrop(SIZE), *finish])
    return {"train": lambda p: train(_pil_open(p)), "eval": lambda p: val(_pil_open(p))}


def _pil_open(path: Path) -> Image.Image:
    with Image.open(path) as image:
        return image.convert("RGB")


def measure_pipelines(paths: list[Path], rounds: int) -> dict[str, dict[str, float]]:
    """Per kind (``train``, ``eval``): images/s per core of each contender and the ``speedup`` of
    OpenCV + albumentations (median of per-round ratios)."""
    sides = dict(zip(CONTENDERS, (vit5_pipelines(), torchvision_pipelines())))
    results = {}
    threads = cv2.getNumThreads()
    cv2.setNumThreads(1)
    try:
        with num_threads(1):
            for kind in ("train", "eval"):
                calls = {name: (lambda f=side[kind]: [f(p) for p in paths]) for name, side in sides.items()}
                s = measure(calls, TimingConfig(warmup=1, rounds=rounds))
                results[kind] = {name: len(paths) / s[name].median for name in CONTENDERS}
                results[kind]["speedup"] = speedup(s[CONTENDERS[0]], s[CONTENDERS[1]]).median
    finally:
        cv2.setNumThreads(threads)
    return results


def eval_agreement(paths: list[Path]) -> float:
    """Mean absolute difference of the two deterministic eval pipelines' outputs."""
    ours, theirs = vit5_pipelines()["eval"], torchvision_pipelines()["eval"]
    return float(np.mean([(ours(p) - theirs(p)).abs().mean().item() for p in paths]))


def run(quick: bool = False) -> Section:
    """Run the benchmark: both pipelines side by side over the same files, and their eval agreement."""
    start = time.perf_counter()
    files, rounds = (16, 3) if quick else (64, 7)
    with tempfile.TemporaryDirectory() as tmp:
        paths = make_jpegs(Path(tmp), files)
        pipelines = measure_pipelines(paths, rounds)
        agreement = eval_agreement(paths)
    rows = tuple(
        (k, *(f"{r[c]:.1f}" for c in CONTENDERS), f"{r['speedup']:.2f}x") for k, r in pipelines.items()
    )
    columns = ("transform", "OpenCV + albumentations", "torchvision + PIL", "speed-up")
    return Section(
        "data_pipeline",
        "Data pipeline: OpenCV + albumentations vs torchvision/PIL",
        f"images/s per core decoding {files} JPEGs (ImageNet-like sizes) to {SIZE} px tensors, side by side",
        tables=[Table(f"Pipeline images/s per core ({files} JPEGs, {SIZE} px output)", columns, rows)],
        notes=[
            f"The eval outputs of the two pipelines differ by {agreement:.3f} on average (normalised units; "
            "the resampling kernels differ slightly): they compute the same transform. A training run "
            "needs (its images/s) / (images/s per core) loader cores.",
        ],
        data={"pipelines": pipelines, "eval_mean_abs_diff": agreement},
        seconds=time.perf_counter() - start,
    )

"""Data-pipeline benchmark: OpenCV + albumentations (``vit5.data``) against torchvision's PIL pipeline.

Both sides decode the **same JPEG files** (generated at ImageNet-like sizes from scikit-learn's
sample photos) and apply the **same transforms** to a normalised 224 px float tensor:

* ``train``: the ViT-5 pre-training 3-Augment (DeiT-III ``augment.py``): random-resized crop
  (bicubic) + flip, one of {grayscale, solarize, Gaussian blur}, colour jitter 0.3;
* ``eval``: resize the shorter side to 224 (bicubic) + centre crop.

Each round runs every contender over all files, in rotating order, one core each (OpenCV and torch
single-threaded; PIL is single-threaded anyway); rates are medians over rounds, the ratio the median of
per-round ratios, so background load on a shared machine cancels. The eval outputs of the two sides
are compared to show they compute the same thing. Then it measures training throughput (forward,
backward, AdamW step; bf16 autocast on GPU) of ``vit5_tiny`` and ``vit5_small`` at 224 px and how many
loader cores each needs.

    vit5 bench data-pipeline [--quick] [--out results.json]
"""

from __future__ import annotations

import random
import statistics
import tempfile
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch
from PIL import Image, ImageFilter, ImageOps
from sklearn.datasets import load_sample_images
from torchvision import transforms as T

import vit5
from vit5.data import IMAGENET_MEAN, IMAGENET_STD, decode_image, eval_transform, three_augment
from vit5.runtime import resolve_device

SIZE = 224
IMAGENET_LIKE_SIZES = ((375, 500), (500, 375), (333, 500), (500, 333), (480, 640), (427, 640))  # (H, W)
Pipeline = Callable[[Path], torch.Tensor]


def run(quick: bool = False) -> dict[str, Any]:
    """Run the benchmark; returns tables (title / columns / rows), raw numbers and notes."""
    start = time.perf_counter()
    files, rounds = (16, 3) if quick else (64, 7)
    with tempfile.TemporaryDirectory() as tmp:
        paths = make_jpegs(Path(tmp), files)
        pipelines = _per_core(lambda: measure_pipelines(paths, rounds))
        agreement = eval_agreement(paths)
    training = measure_training(quick)
    tables = [_pipeline_table(pipelines, len(paths)), _training_table(training, pipelines)]
    return {
        "key": "data_pipeline",
        "title": "Data pipeline: OpenCV + albumentations vs torchvision/PIL",
        "what": f"images/s per core decoding {len(paths)} JPEGs (ImageNet-like sizes) to {SIZE} px tensors, "
        f"and training images/s of vit5_tiny / vit5_small",
        "tables": tables,
        "notes": [
            f"eval outputs of the two pipelines differ by {agreement:.3f} on average (normalised units; "
            "resampling kernels differ slightly), i.e. they compute the same transform",
            "training runs on random tensors; "
            "'loader cores' = training images/s / pipeline images/s per core",
        ],
        "data": {"pipelines": pipelines, "eval_mean_abs_diff": agreement, "training": training},
        "seconds": time.perf_counter() - start,
    }


# ---------------------------------------------------------------------------------- files
def make_jpegs(directory: Path, count: int, seed: int = 0) -> list[Path]:
    """``count`` JPEGs (quality 90) cut and resized from scikit-learn's two sample photos."""
    rng = np.random.default_rng(seed)
    photos = load_sample_images().images  # two 427 x 640 RGB photos
    paths = []
    for i in range(count):
        photo = photos[i % len(photos)]
        height, width = IMAGENET_LIKE_SIZES[i % len(IMAGENET_LIKE_SIZES)]
        crop_h, crop_w = int(rng.integers(280, 428)), int(rng.integers(380, 641))
        y, x = int(rng.integers(0, 428 - crop_h)), int(rng.integers(0, 641 - crop_w))
        patch = cv2.resize(
            photo[y : y + crop_h, x : x + crop_w], (width, height), interpolation=cv2.INTER_AREA
        )
        path = directory / f"{i:04d}.jpg"
        cv2.imwrite(str(path), cv2.cvtColor(patch, cv2.COLOR_RGB2BGR), [cv2.IMWRITE_JPEG_QUALITY, 90])
        paths.append(path)
    return paths


# ---------------------------------------------------------------------------------- pipelines
def vit5_pipelines() -> dict[str, Pipeline]:
    train, val = three_augment(SIZE, color_jitter=0.3), eval_transform(SIZE, crop_ratio=1.0)
    return {"train": lambda p: train(decode_image(p)), "eval": lambda p: val(decode_image(p))}


def torchvision_pipelines() -> dict[str, Pipeline]:
    """The official DeiT-III / ViT-5 transforms on PIL (``augment.py``; ``datasets.py`` for eval)."""
    finish = [T.ToTensor(), T.Normalize(IMAGENET_MEAN, IMAGENET_STD)]
    train = T.Compose(
        [
            T.RandomResizedCrop(SIZE, interpolation=T.InterpolationMode.BICUBIC),
            T.RandomHorizontalFlip(),
            T.RandomChoice([T.Grayscale(3), T.Lambda(ImageOps.solarize), T.Lambda(_pil_blur)]),
            T.ColorJitter(0.3, 0.3, 0.3),
            *finish,
        ]
    )
    val = T.Compose([T.Resize(SIZE, interpolation=T.InterpolationMode.BICUBIC), T.CenterCrop(SIZE), *finish])
    return {"train": lambda p: train(_pil_open(p)), "eval": lambda p: val(_pil_open(p))}


def _pil_open(path: Path) -> Image.Image:
    with Image.open(path) as image:
        return image.convert("RGB")


def _pil_blur(image: Image.Image) -> Image.Image:
    return image.filter(ImageFilter.GaussianBlur(radius=random.uniform(0.1, 2.0)))


def measure_pipelines(paths: list[Path], rounds: int) -> dict[str, dict[str, float]]:
    """Per kind (``train``, ``eval``): images/s of ``opencv_albumentations`` and ``torchvision_pil``,
    and the ``speedup`` of the former (median of per-round ratios)."""
    ours, theirs = vit5_pipelines(), torchvision_pipelines()
    results: dict[str, dict[str, float]] = {}
    for kind in ("train", "eval"):
        contenders = {
            "opencv_albumentations": lambda f=ours[kind]: [f(p) for p in paths],
            "torchvision_pil": lambda f=theirs[kind]: [f(p) for p in paths],
        }
        seconds = _interleaved(contenders, rounds)
        a, b = seconds["opencv_albumentations"], seconds["torchvision_pil"]
        results[kind] = {
            "opencv_albumentations": len(paths) / statistics.median(a),
            "torchvision_pil": len(paths) / statistics.median(b),
            "speedup": statistics.median(tb / ta for ta, tb in zip(a, b, strict=True)),
        }
    return results


def eval_agreement(paths: list[Path]) -> float:
    """Mean absolute difference of the two deterministic eval pipelines' outputs."""
    ours, theirs = vit5_pipelines()["eval"], torchvision_pipelines()["eval"]
    return float(np.mean([(ours(p) - theirs(p)).abs().mean().item() for p in paths]))


def _interleaved(contenders: Mapping[str, Callable[[], object]], rounds: int) -> dict[str, list[float]]:
    names = list(contenders)
    for name in names:  # warm-up: caches, lazy imports
        contenders[name]()
    seconds: dict[str, list[float]] = {name: [] for name in names}
    for r in range(rounds):
        for name in names[r % len(names) :] + names[: r % len(names)]:
            start = time.perf_counter()
            contenders[name]()
            seconds[name].append(time.perf_counter() - start)
    return seconds


def _per_core(fn: Callable[[], Any]) -> Any:
    threads, cv_threads = torch.get_num_threads(), cv2.getNumThreads()
    torch.set_num_threads(1)
    cv2.setNumThreads(1)
    try:
        return fn()
    finally:
        torch.set_num_threads(threads)
        cv2.setNumThreads(cv_threads)


# ---------------------------------------------------------------------------------- training
def measure_training(quick: bool) -> dict[str, dict[str, Any]]:
    """Training images/s (forward + backward + AdamW step) at 224 px on the default device."""
    device = resolve_device("auto")
    batch = (64 if quick else 128) if device.type == "cuda" else (4 if quick else 16)
    steps = 3 if quick else 10
    return {name: _training_rate(name, device, batch, steps) for name in ("vit5_tiny", "vit5_small")}


def _training_rate(name: str, device: torch.device, batch: int, steps: int) -> dict[str, Any]:
    model = vit5.create_model(name, num_classes=1000).to(device).train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    images = torch.randn(batch, 3, SIZE, SIZE, device=device)
    labels = torch.randint(0, 1000, (batch,), device=device)

    def step() -> None:
        with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
            loss = torch.nn.functional.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize()

    seconds = _interleaved({name: step}, steps)[name]
    return {
        "images_per_s": batch / statistics.median(seconds),
        "batch": batch,
        "device": str(device),
        "precision": "bf16 autocast" if device.type == "cuda" else "fp32",
        "threads": torch.get_num_threads(),
    }


# ---------------------------------------------------------------------------------- report
def _pipeline_table(results: Mapping[str, Mapping[str, float]], files: int) -> dict[str, Any]:
    rows = [
        [kind, round(r["opencv_albumentations"], 1), round(r["torchvision_pil"], 1), round(r["speedup"], 2)]
        for kind, r in results.items()
    ]
    return {
        "title": f"Pipeline images/s per core ({files} JPEGs, 224 px output)",
        "columns": ["transform", "OpenCV + albumentations", "torchvision + PIL", "speed-up (x)"],
        "rows": rows,
    }


def _training_table(
    training: Mapping[str, Mapping[str, Any]], pipelines: Mapping[str, Mapping[str, float]]
) -> dict[str, Any]:
    per_core = pipelines["train"]["opencv_albumentations"]
    rows = [
        [
            name,
            r["device"],
            r["precision"],
            r["batch"],
            round(r["images_per_s"], 1),
            float(f"{r['images_per_s'] / per_core:.2g}"),
        ]
        for name, r in training.items()
    ]
    return {
        "title": "Training images/s at 224 px (forward + backward + AdamW)",
        "columns": ["model", "device", "precision", "batch", "images/s", "loader cores needed (3-Augment)"],
        "rows": rows,
    }


def format_tables(result: Mapping[str, Any]) -> str:
    lines = [result["title"]]
    for table in result["tables"]:
        lines += ["", table["title"], " | ".join(table["columns"])]
        lines += [" | ".join(str(v) for v in row) for row in table["rows"]]
    lines += ["", *(f"note: {n}" for n in result["notes"]), f"({result['seconds']:.0f} s)"]
    return "\n".join(lines)

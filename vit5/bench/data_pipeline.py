"""``vit5 bench data-pipeline``: OpenCV + albumentations (``vit5.data``) against torchvision's PIL pipeline,
on the same JPEGs (ImageNet-like sizes, cut from scikit-learn's sample photos) and the same transforms
(``train``: the DeiT-III 3-Augment of ``augment.py``; ``eval``: resize + centre crop), one core each, side
by side; and the ``data_index`` section of ``vit5 bench``: indexing trees and reading shards."""

from __future__ import annotations

import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import cv2
import numpy as np
from PIL import Image, ImageFilter, ImageOps
from sklearn.datasets import load_sample_images
from torchvision import transforms as T

from vit5 import data
from vit5.bench.measure import BenchContext, Samples, TimingConfig, measure, num_threads, speedup
from vit5.bench.report import Section, Table, Target

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
    train, val = data.three_augment(SIZE, color_jitter=0.3), data.eval_transform(SIZE, crop_ratio=1.0)
    return {"train": lambda p: train(data.decode_image(p)), "eval": lambda p: val(data.decode_image(p))}


def torchvision_pipelines() -> dict[str, Any]:
    """The official DeiT-III / ViT-5 transforms on PIL (``augment.py``; ``datasets.py`` for eval)."""
    finish = [T.ToTensor(), T.Normalize(data.IMAGENET_MEAN, data.IMAGENET_STD)]
    blur = T.Lambda(lambda im: im.filter(ImageFilter.GaussianBlur(radius=random.uniform(0.1, 2.0))))
    bicubic = T.InterpolationMode.BICUBIC
    three = T.RandomChoice([T.Grayscale(3), T.Lambda(ImageOps.solarize), blur])  # 3-Augment
    crop, jitter = T.RandomResizedCrop(SIZE, interpolation=bicubic), T.ColorJitter(0.3, 0.3, 0.3)
    train = T.Compose([crop, T.RandomHorizontalFlip(), three, jitter, *finish])
    val = T.Compose([T.Resize(SIZE, interpolation=bicubic), T.CenterCrop(SIZE), *finish])
    rgb = lambda path: Image.open(path).convert("RGB")  # noqa: E731 - PIL closes the file once loaded
    return {"train": lambda p: train(rgb(p)), "eval": lambda p: val(rgb(p))}


def measure_pipelines(paths: list[Path], rounds: int) -> dict[str, dict[str, float]]:
    """Per kind (``train``, ``eval``): images/s per core of each contender and the ``speedup`` of
    OpenCV + albumentations (median of per-round ratios)."""
    sides = dict(zip(CONTENDERS, (vit5_pipelines(), torchvision_pipelines())))
    results = {}
    for kind in ("train", "eval"):
        calls = {name: (lambda f=side[kind]: [f(p) for p in paths]) for name, side in sides.items()}
        s = measure_one_core(calls, rounds)
        results[kind] = {name: len(paths) / s[name].median for name in CONTENDERS}
        results[kind]["speedup"] = speedup(s[CONTENDERS[0]], s[CONTENDERS[1]]).median
    return results


def measure_one_core(calls: dict[str, Callable[[], object]], rounds: int) -> dict[str, Samples]:
    """:func:`~vit5.bench.measure.measure` with OpenCV and torch on one thread each."""
    threads = cv2.getNumThreads()
    cv2.setNumThreads(1)
    try:
        with num_threads(1):
            return measure(calls, TimingConfig(warmup=1, rounds=rounds))
    finally:
        cv2.setNumThreads(threads)


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


_INDEXERS = {  # the class each contender lists a tree ROOT/<class>/<file> with; run in a fresh process
    "vit5": "from vit5.data import ImageFolderDataset as F",
    "torchvision": "from torchvision.datasets import ImageFolder as F",
    "timm": "from timm.data.readers.reader_image_folder import ReaderImageFolder as F",
}
INDEX_COLUMNS = ("files", "indexer", "found", "seconds", "vs torchvision", "peak MiB", "vs torchvision")
_INDEX_PROBE = """
import json, sys, time
{setup}
def status(field):  # bytes, from /proc/self/status (Linux)
    with open("/proc/self/status") as f:
        return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))
before = status("VmRSS")
with open("/proc/self/clear_refs", "w") as f:
    f.write("5")  # reset the peak (VmHWM) to the current size: imports do not count
start = time.perf_counter()
n = len(F(sys.argv[1]))
seconds = time.perf_counter() - start
print(json.dumps(dict(files=n, seconds=seconds, peak_bytes=status("VmHWM") - before)))
"""


def index_cost(sizes: Sequence[int], rounds: int = 3) -> dict[int, dict[str, Any]]:
    """Median seconds and peak memory (resident set above the process's after imports; Linux) of each of
    :data:`_INDEXERS`, in a fresh process, on a warm synthetic ImageFolder of ``size`` empty JPEG files."""
    results: dict[int, dict[str, Any]] = {}
    for size in sizes:
        with tempfile.TemporaryDirectory(prefix="vit5-index-") as tmp:
            classes = max(1, min(1000, size // 100))
            for i in range(size):
                if i < classes:
                    os.mkdir(os.path.join(tmp, f"n{i:08d}"))
                open(os.path.join(tmp, f"n{i % classes:08d}", f"img_{i:08d}.JPEG"), "wb").close()
            sum(len(files) for _, _, files in os.walk(tmp))  # warm the directory cache
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name in _INDEXERS}
            probes = {n: lambda n=n, r=runs, t=tmp: r[n].append(_probe(_INDEXERS[n], t)) for n in _INDEXERS}
            measure(probes, TimingConfig(warmup=0, rounds=rounds))  # rotating order, fresh process each
            for name, found in runs.items():
                medians = {k: statistics.median(m[k] for m in found) for k in ("seconds", "peak_bytes")}
                results.setdefault(size, {})[name] = {"files": found[0]["files"], **medians}
    return results


def _probe(setup: str, root: str) -> dict[str, Any]:
    code = [sys.executable, "-c", _INDEX_PROBE.format(setup=setup), root]
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    done = subprocess.run(code, capture_output=True, text=True, env=env, check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


def folder_vs_shards(count: int, rounds: int = 3) -> dict[str, float]:
    """Images/s on one core decoding and 3-Augmenting ``count`` photos from an ImageFolder and from
    WebDataset shards of the same files (main process, shuffle buffer 256); medians over rounds."""
    transform = data.three_augment(SIZE, color_jitter=0.3)
    with tempfile.TemporaryDirectory() as tmp:
        split, shard_dir = Path(tmp) / "train", Path(tmp) / "shards"
        for c in range(4):
            (split / f"c{c}").mkdir(parents=True)
            make_jpegs(split / f"c{c}", count // 4, seed=c)
        data.write_shards(split, shard_dir, shard_size=max(1, count // 8), split="train")
        folder = data.ImageFolderDataset(split, transform=transform)
        shards = data.ShardDataset(shard_dir, transform, batch_size=1, train=True, shuffle_buffer=256)
        contenders = {
            "folder": lambda: [folder[i] for i in range(len(folder))],
            "shards": lambda: list(data.shard_loader(shards, pin_memory=False)),
        }
        seconds = measure_one_core(contenders, rounds)
    return {name: len(folder) / s.median for name, s in seconds.items()}


def run_data_index(ctx: BenchContext) -> Section:
    """The ``data_index`` section: :func:`index_cost` at ``cfg.index_sizes`` and :func:`folder_vs_shards`."""
    cfg = ctx.cfg
    ctx.log(f"data_index: indexing trees of {', '.join(f'{n:,}' for n in cfg.index_sizes)} files")
    cost = index_cost(cfg.index_sizes, rounds=cfg.index_rounds)
    rows = []
    for size, found in cost.items():
        tv = found["torchvision"]
        for name, m in found.items():
            t, b = m["seconds"] / tv["seconds"], m["peak_bytes"] / max(tv["peak_bytes"], 1)
            mib = f"{m['peak_bytes'] / 2**20:.1f}"
            rows.append((f"{size:,}", name, m["files"], f"{m['seconds']:.3f}", f"{t:.2f}x", mib, f"{b:.2f}x"))
    ctx.log("data_index: decode + 3-Augment, folder against shards")
    rates = folder_vs_shards(cfg.decode_images, rounds=cfg.index_rounds)
    ours, theirs, at = cost[max(cost)]["vit5"], cost[max(cost)]["torchvision"], f"at {max(cost):,} files"
    targets = [
        Target(f"vit5 index {what} {at} vs torchvision", ours[k] / max(theirs[k], 1e-9), 1.2, False)
        for what, k in (("time", "seconds"), ("peak memory", "peak_bytes"))
    ]
    decode = tuple((name, f"{rate:.1f}") for name, rate in rates.items())
    title = f"Decode + 3-Augment to {SIZE} px, images/s on one core"
    return Section(
        "data_index",
        "Data set indexing and reading: folders against torchvision, timm and shards",
        "Seconds and peak memory to index a synthetic ImageFolder of empty .JPEG files (fresh process each, "
        "warm directory cache, medians), and decode + 3-Augment images/s on one core from a folder and "
        f"from WebDataset shards of the same {cfg.decode_images} JPEGs at ImageNet-like sizes.",
        tables=[
            Table("Indexing a tree", INDEX_COLUMNS, tuple(rows)),
            Table(title, ("source", "images/s"), decode),
        ],
        targets=targets,
        notes=[
            "vit5 checks what the others do not: links leading outside the tree, link loops, FIFOs and "
            "devices named like images, two paths to one file",
        ],
        data={"index": {str(k): v for k, v in cost.items()}, "decode_images_per_s": rates},
    )

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
# (height, width)
IMAGENET_LIKE_SIZES = ((375, 500), (500, 375), (333, 500), (500, 333), (480, 640), (427, 640))
CONTENDERS = ("opencv_albumentations", "torchvision_pil")


def make_jpegs(directory: Path, count: int, seed: int = 0) -> list[Path]:
    """``count`` JPEGs (quality 90) cut and resized from scikit-learn's two 427 x 640 sample photos."""
    rng = np.random.default_rng(seed)
    photos = load_sample_images().images
    paths = []
    for i in range(count):
        height, width = IMAGENET_LIKE_SIZES[i % len(IMAGENET_LIKE_SIZES)]
        crop_h = int(rng.integers(280, 428))
        crop_w = int(rng.integers(380, 641))
        y = int(rng.integers(0, 428 - crop_h))
        x = int(rng.integers(0, 641 - crop_w))
        patch = photos[i % len(photos)][y : y + crop_h, x : x + crop_w]
        patch = cv2.resize(patch, (width, height), interpolation=cv2.INTER_AREA)
        paths.append(directory / f"{i:04d}.jpg")
        bgr = cv2.cvtColor(patch, cv2.COLOR_RGB2BGR)
        cv2.imwrite(str(paths[-1]), bgr, [cv2.IMWRITE_JPEG_QUALITY, 90])
    return paths


def vit5_pipelines() -> dict[str, Any]:
    train = data.three_augment(SIZE, color_jitter=0.3)
    val = data.eval_transform(SIZE, crop_ratio=1.0)
    return {
        "train": lambda p: train(data.decode_image(p)),
        "eval": lambda p: val(data.decode_image(p)),
    }


def torchvision_pipelines() -> dict[str, Any]:
    """The official DeiT-III / ViT-5 transforms on PIL (``augment.py``; ``datasets.py`` for eval)."""
    finish = [T.ToTensor(), T.Normalize(data.IMAGENET_MEAN, data.IMAGENET_STD)]

    def gaussian_blur(im: Image.Image) -> Image.Image:
        return im.filter(ImageFilter.GaussianBlur(radius=random.uniform(0.1, 2.0)))

    blur = T.Lambda(gaussian_blur)
    bicubic = T.InterpolationMode.BICUBIC
    three = T.RandomChoice([T.Grayscale(3), T.Lambda(ImageOps.solarize), blur])  # 3-Augment
    crop = T.RandomResizedCrop(SIZE, interpolation=bicubic)
    jitter = T.ColorJitter(0.3, 0.3, 0.3)
    train = T.Compose([crop, T.RandomHorizontalFlip(), three, jitter, *finish])
    val = T.Compose([T.Resize(SIZE, interpolation=bicubic), T.CenterCrop(SIZE), *finish])

    def rgb(path: Path) -> Image.Image:
        # PIL closes the file once loaded
        return Image.open(path).convert("RGB")

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
    ours = vit5_pipelines()["eval"]
    theirs = torchvision_pipelines()["eval"]
    return float(np.mean([(ours(p) - theirs(p)).abs().mean().item() for p in paths]))


def run(quick: bool = False) -> Section:
    """Run the benchmark: both pipelines side by side over the same files, and their eval agreement."""
    start = time.perf_counter()
    files = 16 if quick else 64
    rounds = 3 if quick else 7
    with tempfile.TemporaryDirectory() as tmp:
        paths = make_jpegs(Path(tmp), files)
        pipelines = measure_pipelines(paths, rounds)
        agreement = eval_agreement(paths)
    rows = []
    for kind, rates in pipelines.items():
        per_core = [f"{rates[c]:.1f}" for c in CONTENDERS]
        rows.append((kind, *per_core, f"{rates['speedup']:.2f}x"))
    columns = ("transform", "OpenCV + albumentations", "torchvision + PIL", "speed-up")
    table = Table(
        title=f"Pipeline images/s per core ({files} JPEGs, {SIZE} px output)",
        columns=columns,
        rows=tuple(rows),
    )
    return Section(
        key="data_pipeline",
        title="Data pipeline: OpenCV + albumentations vs torchvision/PIL",
        what=(
            f"images/s per core decoding {files} JPEGs (ImageNet-like sizes) "
            f"to {SIZE} px tensors, side by side"
        ),
        tables=[table],
        notes=[
            f"The eval outputs of the two pipelines differ by {agreement:.3f} on average "
            "(normalised units; the resampling kernels differ slightly): they compute the same "
            "transform. A training run needs (its images/s) / (images/s per core) loader cores.",
        ],
        data={"pipelines": pipelines, "eval_mean_abs_diff": agreement},
        seconds=time.perf_counter() - start,
    )


# the class each contender lists a tree ROOT/<class>/<file> with; run in a fresh process
_INDEXERS = {
    "vit5": "from vit5.data import ImageFolderDataset as F",
    "torchvision": "from torchvision.datasets import ImageFolder as F",
    "timm": "from timm.data.readers.reader_image_folder import ReaderImageFolder as F",
}
INDEX_COLUMNS = (
    "files",
    "indexer",
    "found",
    "seconds",
    "vs torchvision",
    "peak MiB",
    "vs torchvision",
)
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
            # warm the directory cache
            sum(len(files) for _, _, files in os.walk(tmp))
            runs: dict[str, list[dict[str, Any]]] = {name: [] for name in _INDEXERS}
            # rotating order, a fresh process each
            measure(_probes(runs, tmp), TimingConfig(warmup=0, rounds=rounds))
            for name, found in runs.items():
                seconds = statistics.median(m["seconds"] for m in found)
                peak = statistics.median(m["peak_bytes"] for m in found)
                row = {"files": found[0]["files"], "seconds": seconds, "peak_bytes": peak}
                results.setdefault(size, {})[name] = row
    return results


def _probes(runs: dict[str, list[dict[str, Any]]], root: str) -> dict[str, Callable[[], None]]:
    """One call per indexer, each appending the result of a fresh process to ``runs[name]``."""

    def probe(name: str) -> None:
        runs[name].append(_probe(_INDEXERS[name], root))

    return {name: lambda name=name: probe(name) for name in _INDEXERS}


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
        split = Path(tmp) / "train"
        shard_dir = Path(tmp) / "shards"
        for c in range(4):
            (split / f"c{c}").mkdir(parents=True)
            make_jpegs(split / f"c{c}", count // 4, seed=c)
        data.write_shards(split, shard_dir, shard_size=max(1, count // 8), split="train")
        folder = data.ImageFolderDataset(split, transform=transform)
        shards = data.ShardDataset(
            shard_dir,
            transform,
            batch_size=1,
            train=True,
            shuffle_buffer=256,
        )
        contenders = {
            "folder": lambda: [folder[i] for i in range(len(folder))],
            "shards": lambda: list(data.shard_loader(shards, pin_memory=False)),
        }
        seconds = measure_one_core(contenders, rounds)
    return {name: len(folder) / s.median for name, s in seconds.items()}


def run_data_index(ctx: BenchContext) -> Section:
    """The ``data_index`` section: :func:`index_cost` at ``cfg.index_sizes`` and
    :func:`folder_vs_shards`."""
    cfg = ctx.cfg
    sizes = ", ".join(f"{n:,}" for n in cfg.index_sizes)
    ctx.log(f"data_index: indexing trees of {sizes} files")
    cost = index_cost(cfg.index_sizes, rounds=cfg.index_rounds)
    rows = []
    for size, found in cost.items():
        tv = found["torchvision"]
        for name, m in found.items():
            time_ratio = m["seconds"] / tv["seconds"]
            memory_ratio = m["peak_bytes"] / max(tv["peak_bytes"], 1)
            mib = f"{m['peak_bytes'] / 2**20:.1f}"
            seconds = f"{m['seconds']:.3f}"
            row = (f"{size:,}", name, m["files"], seconds, f"{time_ratio:.2f}x", mib)
            rows.append((*row, f"{memory_ratio:.2f}x"))
    ctx.log("data_index: decode + 3-Augment, folder against shards")
    rates = folder_vs_shards(cfg.decode_images, rounds=cfg.index_rounds)
    largest = max(cost)
    ours = cost[largest]["vit5"]
    theirs = cost[largest]["torchvision"]
    targets = [
        Target(
            name=f"vit5 index {what} at {largest:,} files vs torchvision",
            measured=ours[k] / max(theirs[k], 1e-9),
            threshold=1.2,
            higher_is_better=False,
        )
        for what, k in (("time", "seconds"), ("peak memory", "peak_bytes"))
    ]
    decode = tuple((name, f"{rate:.1f}") for name, rate in rates.items())
    title = f"Decode + 3-Augment to {SIZE} px, images/s on one core"
    return Section(
        key="data_index",
        title="Data set indexing and reading: folders against torchvision, timm and shards",
        what=(
            "Seconds and peak memory to index a synthetic ImageFolder of empty .JPEG files "
            "(fresh process each, warm directory cache, medians), and decode + 3-Augment images/s "
            "on one core from a folder and from WebDataset shards of the same "
            f"{cfg.decode_images} JPEGs at ImageNet-like sizes."
        ),
        tables=[
            Table(title="Indexing a tree", columns=INDEX_COLUMNS, rows=tuple(rows)),
            Table(title=title, columns=("source", "images/s"), rows=decode),
        ],
        targets=targets,
        notes=[
            "vit5 checks what the others do not: links leading outside the tree, link loops, "
            "FIFOs and devices named like images, two paths to one file",
        ],
        data={"index": {str(k): v for k, v in cost.items()}, "decode_images_per_s": rates},
    )

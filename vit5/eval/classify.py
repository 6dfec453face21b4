"""Classification on an ImageFolder split: top-1, top-5, loss, per-class accuracy, confusion, speed, and
accuracy against input resolution (ViT-5 resamples its APE and builds 2D RoPE for any patch grid); top-k
predictions for a folder of images with class names (the model's ``label_names``, else timm's ImageNet
names for an ImageNet-size head, else the output index), as timm's ``inference.py``.

Preprocessing is the official ViT-5 eval recipe (``datasets.py:101-105`` of github.com/wangf3014/ViT-5 at
b7b0796): resize by ``1 / crop_ratio`` (bicubic), centre crop, normalise. Under ``accelerate launch`` each
process evaluates a shard and ``gather_for_metrics`` drops the padding; unreadable files are skipped."""

from __future__ import annotations

import os
import time
import warnings
from collections.abc import Iterator, Sequence
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from accelerate import Accelerator
from tqdm.auto import tqdm

from vit5 import plotstyle as S
from vit5.data import ImageFolderDataset, ImageFolderError, class_names_change
from vit5.errors import InputError, Rule, name_list
from vit5.eval.common import (
    EVAL_FIX,
    LoadedModel,
    Size,
    bad_file_reason,
    check_forward_memory,
    check_settings,
    confusion_matrix,
    labelled_loader,
    list_images,
)
from vit5.introspect import patch_size_of
from vit5.layers.patch_embed import grid_of, round_to_patch
from vit5.model.vit import unwrap
from vit5.outputs import format_table, write_csv
from vit5.runtime import default_workers, fit_threads, fit_workers
from vit5.train.loop import evaluate as evaluate_batches

DEFAULT_SCALES = ("0.5", "0.75", "1", "1.25", "1.5", "2", "1x2", "2x1")
RECORD_KEYS = (
    "model",
    "weights",
    "size",
    "crop_ratio",
    "num_images",
    "top1",
    "top5",
    "loss",
    "images_per_s",
)


_CLASSIFY_RULES = (
    Rule("size", lambda v: len(v) == 2 and min(v) > 0, "a positive (height, width) pair or null"),
    Rule("crop_ratio", lambda v: 0 < v <= 1, "in (0, 1] (1 = ViT-5 eval, 0.875 = classic) or null"),
    Rule("batch_size", lambda v: v >= 1, ">= 1"),
    Rule("num_workers", lambda v: v >= 0, ">= 0 or null"),
)


@dataclass(frozen=True)
class ClassifySettings:
    """``size`` (H, W) and ``crop_ratio`` default to the model's own (vit5: its img_size and 1.0)."""

    size: tuple[int, int] | None = None
    crop_ratio: float | None = None
    batch_size: int = 64
    num_workers: int | None = None  # None: vit5.runtime.default_workers() (min(4, CPUs - 1))

    def __post_init__(self) -> None:
        check_settings(self, _CLASSIFY_RULES)


@dataclass(frozen=True)
class ClassificationScores:
    num_images: int
    top1: float  # fractions in [0, 1]
    top5: float  # top-k with k = min(5, num_classes)
    loss: float  # mean cross-entropy
    confusion: np.ndarray  # rows: true classes, as scikit-learn

    @property
    def per_class_accuracy(self) -> np.ndarray:
        """Recall of each class; NaN for a class with no images."""
        counts = self.confusion.sum(axis=1)
        return np.diag(self.confusion) / np.where(counts > 0, counts, np.nan)


class ClassificationMeter:
    """Accumulates top-1/top-5 hits, summed cross-entropy and the confusion matrix batch by batch."""

    def __init__(self, num_classes: int) -> None:
        self.num_classes = num_classes
        self.k = min(5, num_classes)  # top-k with k = min(5, classes)
        self.topk = 0
        self.loss_sum = 0.0
        self.confusion = torch.zeros(num_classes, num_classes, dtype=torch.int64)

    def update(self, logits: torch.Tensor, targets: torch.Tensor) -> None:
        logits = logits.detach().float().cpu()
        targets = targets.detach().long().cpu()
        ranked = logits.topk(self.k, dim=1).indices
        self.topk += int((ranked == targets[:, None]).any(dim=1).sum())
        self.loss_sum += float(F.cross_entropy(logits, targets, reduction="sum"))
        self.confusion += confusion_matrix(targets, ranked[:, 0], self.num_classes)

    def compute(self) -> ClassificationScores:
        count = int(self.confusion.sum())
        n = max(count, 1)
        top1 = int(self.confusion.trace())
        confusion = self.confusion.numpy().copy()
        return ClassificationScores(count, top1 / n, self.topk / n, self.loss_sum / n, confusion)


@dataclass
class ClassifyResult:
    model: str
    weights: str
    data: str
    size: tuple[int, int]
    crop_ratio: float
    class_names: list[str]
    scores: ClassificationScores
    seconds: float
    num_processes: int
    skipped: list[dict[str, str]] = field(default_factory=list)
    note: str = ""  # how folder labels were matched to the model's outputs, when not one to one

    @property
    def images_per_s(self) -> float:
        return self.scores.num_images / self.seconds if self.seconds > 0 else float("nan")

    def to_dict(self) -> dict[str, Any]:
        """The JSON record of ``vit5 eval classify``: settings, scores, per-class accuracy, confusion."""
        doc = {k: v for k, v in asdict(self).items() if k not in ("scores", "note")}
        scores = self.scores
        per_class = scores.per_class_accuracy.tolist()
        return {
            **doc,
            **{k: getattr(scores, k) for k in ("num_images", "top1", "top5", "loss")},
            "images_per_s": self.images_per_s,
            "per_class_accuracy": dict(zip(self.class_names, per_class)),
            "confusion_matrix": scores.confusion,
            "label_mapping": self.note,
        }


def open_split(root: str | os.PathLike[str], split: str | None) -> ImageFolderDataset:
    """The ImageFolder split to evaluate (``root/split/<class>/...``; ``split=None``: root is the split)."""
    try:
        return ImageFolderDataset(root, split)
    except ImageFolderError as err:
        raise InputError(str(err)) from err


def evaluate(
    loaded: LoadedModel,
    dataset: ImageFolderDataset,
    settings: ClassifySettings = ClassifySettings(),
    accelerator: Accelerator | None = None,
    progress: bool = True,
) -> ClassifyResult:
    """Evaluate ``loaded`` on ``dataset`` (its files and class names; its own transform is unused)."""
    accelerator = accelerator or Accelerator()
    labels, class_names, note = label_map(loaded, dataset)
    size = tuple(settings.size or loaded.input_size)
    patch = patch_size_of(loaded.model)
    if patch is not None:
        grid_of(size, patch, EVAL_FIX, InputError)
        width = getattr(loaded.model, "embed_dim", None) or getattr(loaded.model, "num_features", 0)
        check_forward_memory(patch, int(width), settings.batch_size, size, accelerator.device)
    workers = default_workers() if settings.num_workers is None else settings.num_workers
    workers, clamped = fit_workers(workers, "--workers")
    if clamped:
        warnings.warn(clamped, stacklevel=2)
    fit_threads(workers, accelerator.device)  # the CPUs the workers leave free, on a CPU device
    crop = settings.crop_ratio or loaded.crop_pct
    loader = labelled_loader(loaded, dataset.samples, size, crop, settings.batch_size, workers)
    loader = accelerator.prepare(loader)
    model = loaded.model.to(accelerator.device).eval()
    meter = ClassificationMeter(len(class_names))
    bad: list[int] = []
    outputs = labels.to(accelerator.device)  # the model's output index of each folder label

    def batches() -> Iterator[tuple[torch.Tensor, torch.Tensor, torch.Tensor]]:
        """``(images, output index or -1 for an unreadable file, sample index)``."""
        desc = f"{loaded.label} @ {size[0]}x{size[1]}"
        shown = progress and accelerator.is_main_process
        for images, targets, indices, ok in tqdm(loader, desc=desc, disable=not shown):
            readable = ok.to(accelerator.device).bool()
            mapped = outputs[targets.to(outputs.device)]
            yield images, torch.where(readable, mapped, -1), indices

    def score(logits: torch.Tensor, targets: torch.Tensor, extra: list[torch.Tensor]) -> None:
        readable = targets >= 0
        meter.update(logits[readable], targets[readable])
        bad.extend(extra[0][~readable].tolist())

    start = time.perf_counter()
    with torch.inference_mode():
        evaluate_batches(model, batches(), accelerator, on_batch=score)
    accelerator.wait_for_everyone()
    paths = [dataset.samples[i][0] for i in sorted(set(bad))]
    return ClassifyResult(
        model=loaded.label,
        weights=loaded.weights,
        data=str(Path(dataset.root)),
        size=size,
        crop_ratio=crop,
        class_names=class_names,
        scores=meter.compute(),
        seconds=time.perf_counter()
        - start,  # before the bad files are decoded again for their reasons
        num_processes=accelerator.num_processes,
        skipped=[{"path": p, "reason": bad_file_reason(p)} for p in paths],
        note=note,
    )


def label_map(
    loaded: LoadedModel, dataset: ImageFolderDataset
) -> tuple[torch.Tensor, list[str], str]:
    """``(output index per folder label, class names of the outputs, a note)``: matched by name when the
    model records its class names (folders that are some of them, or in another order, are mapped; others
    refused), else the folders must be as many as the outputs, in sorted order (InputError otherwise)."""
    folders = list(dataset.class_names)
    outputs = getattr(loaded.model, "num_classes", None)
    names = loaded.class_names
    if names is None or list(names) == folders:
        if outputs != len(folders):
            raise InputError(
                f"{loaded.label} has {outputs} outputs but {dataset.root} has {len(folders)} classes; "
                "evaluate on the data set it was trained for (class folders in the same sorted order)"
            )
        return torch.arange(len(folders)), folders, ""
    index = {name: i for i, name in enumerate(names)}
    if not set(folders) <= set(index):
        raise InputError(
            f"{loaded.label} was trained on {len(names)} classes ({name_list(names)}) but {dataset.root} "
            f"has {len(folders)} ({name_list(folders)}); {class_names_change(names, folders)}. Its outputs "
            "would be scored against other classes: evaluate on class folders named as the model's "
            "(label_names in its config.json)"
        )
    how = f"{len(folders)} of the model's {len(names)} classes"
    if len(folders) == len(names):
        how = "the model's classes in another order"
    note = f"{loaded.label}: the class folders of {dataset.root} are {how}; labels mapped by class name"
    return torch.tensor([index[n] for n in folders]), list(names), note


def summary_table(results: list[ClassifyResult]) -> str:
    rows = [
        (
            r.model,
            r.weights,
            f"{r.size[0]}x{r.size[1]}",
            r.crop_ratio,
            r.scores.num_images,
            100 * r.scores.top1,
            100 * r.scores.top5,
            r.scores.loss,
            f"{r.images_per_s:.1f}",
            len(r.skipped),
        )
        for r in results
    ]
    headers = (
        "model",
        "weights",
        "size",
        "crop",
        "images",
        "top-1 %",
        "top-5 %",
        "loss",
        "img/s",
        "skipped",
    )
    return format_table(headers, rows, title="classification")


def per_class_table(result: ClassifyResult, limit: int = 20) -> str:
    """Per-class accuracy; with more than ``limit`` classes only the ``limit`` worst."""
    acc = result.scores.per_class_accuracy
    counts = result.scores.confusion.sum(axis=1)
    rank = np.nan_to_num(acc, nan=np.inf)  # classes without images last
    order = (
        sorted(range(len(acc)), key=lambda i: (rank[i], i)) if len(acc) > limit else range(len(acc))
    )
    rows = [(result.class_names[i], int(counts[i]), 100 * acc[i]) for i in list(order)[:limit]]
    worst = f" ({limit} worst of {len(acc)})" if len(acc) > limit else ""
    return format_table(
        ("class", "images", "accuracy %"), rows, f"per-class accuracy, {result.model}{worst}"
    )


def parse_scale(text: str) -> tuple[float, float]:
    """``"1.5"`` -> (1.5, 1.5); ``"1x2"`` -> height x1, width x2."""
    try:
        values = [float(p) for p in text.lower().split("x")]
    except ValueError:
        values = []
    if len(values) not in (1, 2) or min(values, default=0) <= 0:
        raise InputError(
            f"scale {text!r} is not S or SHxSW with positive numbers (e.g. 0.5, 2 or 1x2)"
        )
    return (values[0], values[-1])


def sizes_from_scales(scales: Sequence[str], base: Size, patch_size: int) -> list[Size]:
    """Scales of ``base`` (H, W), rounded to patch multiples, duplicates dropped, order kept."""
    sizes = [
        round_to_patch((base[0] * sh, base[1] * sw), patch_size)
        for sh, sw in map(parse_scale, scales)
    ]
    return list(dict.fromkeys(sizes))


def run_sweep(
    models: Sequence[LoadedModel],
    dataset: ImageFolderDataset,
    sizes: Sequence[Size],
    settings: ClassifySettings | None = None,
    accelerator: Accelerator | None = None,
    progress: bool = True,
) -> list[ClassifyResult]:
    """One :func:`evaluate` per (model, size), same data and crop ratio (0.5x to 2x, non-square too)."""
    if not sizes:
        raise InputError("the sweep needs at least one size")
    accelerator = accelerator or Accelerator()
    settings = settings or ClassifySettings()
    return [
        evaluate(loaded, dataset, replace(settings, size=tuple(size)), accelerator, progress)
        for loaded in models
        for size in sizes
    ]


def sweep_table(results: Sequence[ClassifyResult], metric: str = "top1") -> str:
    """Rows: input sizes; columns: models; cells: top-1 (or top-5) in %."""
    labels = list(dict.fromkeys(r.model for r in results))
    cell = {(r.model, r.size): 100 * getattr(r.scores, metric) for r in results}
    sizes = dict.fromkeys(r.size for r in results)
    rows = [(f"{h}x{w}", *(cell.get((m, (h, w))) for m in labels)) for h, w in sizes]
    return format_table(("size", *labels), rows, title=f"{metric} % against input size")


def sweep_records(results: Sequence[ClassifyResult]) -> list[dict]:
    """Compact JSON rows (no confusion matrices)."""
    return [{k: r.to_dict()[k] for k in RECORD_KEYS} for r in results]


def plot_confusion(
    confusion: np.ndarray, class_names: Sequence[str], path: str | os.PathLike[str], title: str = ""
) -> Path:
    """Row-normalised confusion matrix (each row: where the images of one true class went); class names
    up to 40 classes, counts in the cells up to 15."""
    confusion = np.asarray(confusion, dtype=np.float64)
    rows = confusion.sum(axis=1, keepdims=True)
    normalised = np.divide(confusion, rows, out=np.zeros_like(confusion), where=rows > 0)
    n = len(class_names)
    side = min(4 + 0.35 * n, 16)
    fig = S.figure(side + 1.5, side)
    ax = fig.subplots()
    image = ax.imshow(normalised, cmap="Blues", vmin=0, vmax=1, interpolation="nearest")
    fig.colorbar(image, ax=ax, fraction=0.046, pad=0.04, label="fraction of the true class")
    if n <= 40:
        ax.set_xticks(range(n), class_names, rotation=90 if n > 12 else 0)
        ax.set_yticks(range(n), class_names)
    for (i, j), value in np.ndenumerate(confusion if n <= 15 else ()):
        if value:
            colour = "white" if normalised[i, j] > 0.5 else "black"
            ax.text(j, i, int(value), ha="center", va="center", fontsize=S.FONT_SMALL, color=colour)
    title = title or "confusion matrix (counts; colour = row fraction)"
    S.style_axes(ax, title, "predicted class", "true class")
    ax.grid(False)
    return S.save_figure(fig, path)[0]


def sweep_plot(
    results: Sequence[ClassifyResult], path: str | os.PathLike[str], train_size: Size | None = None
) -> Path:
    """Top-1 against sqrt(H * W) per model; square sizes joined by a line, others as hollow markers
    labelled HxW (extrapolation of RoPE and the resampled APE)."""
    fig = S.figure(S.TEXT_WIDTH, 4.5)
    ax = fig.subplots()
    labelled: dict[Size, int] = {}  # size -> label row, so labels at one x do not overlap
    for index, model in enumerate(dict.fromkeys(r.model for r in results)):
        points = [(r.size, 100 * r.scores.top1) for r in results if r.model == model]
        square = sorted((np.sqrt(h * w), v) for (h, w), v in points if h == w)
        xs = [x for x, _ in square]
        ys = [v for _, v in square]
        (line,) = ax.plot(xs, ys, label=model, **S.line_kwargs(index, 0))
        for (h, w), value in points:
            if h == w:
                continue
            xy = (np.sqrt(h * w), value)
            ax.scatter(*xy, facecolors="none", edgecolors=line.get_color(), s=60, zorder=3)
            if (h, w) not in labelled:  # once per size, not per model
                row = sum(hh * ww == h * w for hh, ww in labelled)
                labelled[(h, w)] = row
                offset = (6, 4 - 11 * row)
                text = f"{h}x{w}"
                ax.annotate(
                    text, xy, textcoords="offset points", xytext=offset, fontsize=S.FONT_SMALL
                )
    if train_size is not None:
        side = np.sqrt(train_size[0] * train_size[1])
        ax.axvline(side, color="grey", ls="--", lw=1, label="training size")
    xlabel = "input side sqrt(H x W) in pixels (hollow: non-square)"
    S.style_axes(ax, "accuracy against input resolution", xlabel, "top-1 %")
    S.legend(ax)
    return S.save_figure(fig, path)[0]


@dataclass(frozen=True)
class ClassNames:
    names: tuple[str, ...]
    source: str


@dataclass(frozen=True)
class Prediction:
    """The top-k classes of one image: ``(index, name, probability)``, most likely first; ``top`` is
    empty and ``error`` says why when the file could not be read."""

    path: Path
    top: tuple[tuple[int, str, float], ...]
    error: str = ""


def class_names(loaded: LoadedModel) -> ClassNames:
    model = unwrap(loaded.model)
    count = int(getattr(model, "num_classes", 0) or 0)
    if count <= 0:
        raise InputError(
            f"{loaded.label} has no classification head (num_classes=0): predict needs a classifier; "
            "for features use vit5 eval features"
        )
    own = (getattr(model, "pretrained_cfg", None) or {}).get("label_names")
    if own and len(own) == count:
        return ClassNames(tuple(str(n) for n in own), "the model's label_names")
    from timm.data import ImageNetInfo, infer_imagenet_subset

    subset = None if loaded.random_init else infer_imagenet_subset(model)
    if subset is not None:
        info = ImageNetInfo(subset)
        return ClassNames(
            tuple(info.label_descriptions()), f"{subset} names (timm.data.ImageNetInfo)"
        )
    return ClassNames(
        tuple(f"class {i}" for i in range(count)), "output indices (no class names recorded)"
    )


def predict(
    loaded: LoadedModel,
    images: str | os.PathLike[str],
    topk: int = 5,
    size: tuple[int, int] | None = None,
    batch_size: int = 32,
    num_workers: int = 0,
    device: torch.device | str = "cpu",
    progress: bool = True,
) -> tuple[list[Prediction], ClassNames]:
    """The ``topk`` most likely classes of every image under ``images`` (a folder, searched
    recursively, or one file), in file order, and the class names used."""
    if topk < 1:
        raise InputError(f"--topk must be at least 1, got {topk}")
    names = class_names(loaded)
    topk = min(topk, len(names.names))
    _, files = list_images(images)
    size = tuple(size or loaded.input_size)
    loader = labelled_loader(
        loaded, [(str(f), -1) for f in files], size, None, batch_size, num_workers
    )
    model = loaded.model.to(device).eval()
    results: list[Prediction] = []
    bar = tqdm(loader, desc=f"{loaded.label} @ {size[0]}x{size[1]}", disable=not progress)
    with torch.inference_mode():
        for batch, _, indices, ok in bar:
            probs = model(batch.to(device)).float().softmax(dim=-1).cpu()
            values, classes = probs.topk(topk, dim=-1)
            for i, good, p, c in zip(
                indices.tolist(), ok.tolist(), values.tolist(), classes.tolist()
            ):
                error = "" if good else bad_file_reason(files[i])
                top = () if error else tuple((k, names.names[k], prob) for k, prob in zip(c, p))
                results.append(Prediction(files[i], top, error))
    return results, names


def predictions_table(predictions: list[Prediction], root: str | os.PathLike[str]) -> str:
    """One line per image: ``cat.jpg  tabby 81.2% | tiger cat 9.3% | ...`` (paths relative to ``root``)."""
    lines = []
    for pred in predictions:
        top = " | ".join(f"{label} {100 * p:.1f}%" for _, label, p in pred.top)
        lines.append(
            f"{_shown(pred.path, root)}  " + (f"skipped: {pred.error}" if pred.error else top)
        )
    return "\n".join(lines)


def write_predictions(
    predictions: list[Prediction], path: str | os.PathLike[str], root: str | os.PathLike[str]
) -> Path:
    """``image, top1_class, top1_index, top1_prob, ..., error`` per image (``error``: why a file was
    skipped, its other cells empty)."""
    k = max((len(p.top) for p in predictions), default=0)
    ranks = range(1, k + 1)
    top_columns = [f"top{r}_{col}" for r in ranks for col in ("class", "index", "prob")]
    rows = []
    for pred in predictions:
        row = {"image": _shown(pred.path, root), "error": pred.error}
        for rank, (index, label, prob) in enumerate(pred.top, start=1):
            row |= {f"top{rank}_class": label, f"top{rank}_index": index, f"top{rank}_prob": prob}
        rows.append(row)
    return write_csv(path, rows, ["image", *top_columns, "error"])


def _shown(path: Path, root: str | os.PathLike[str]) -> str:
    """``path`` relative to the folder ``root`` (or to the folder of the file ``root``)."""
    folder = Path(root) if Path(root).is_dir() else Path(root).parent
    return str(path.relative_to(folder) if path.is_relative_to(folder) else path)

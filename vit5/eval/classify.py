"""Classification evaluation on an ImageFolder split: top-1, top-5, loss, per-class accuracy, speed.

Preprocessing is the official ViT-5 eval recipe (``datasets.py:101-105`` of github.com/wangf3014/ViT-5 at
b7b0796): resize by ``1 / crop_ratio`` (bicubic), centre crop, normalise. Under ``accelerate launch`` each
process evaluates a shard and ``gather_for_metrics`` drops the padding; unreadable files are skipped."""

from __future__ import annotations

import os
import time
import warnings
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from accelerate import Accelerator
from tqdm.auto import tqdm

from vit5.data import ImageFolderDataset, ImageFolderError, build_loader, class_names_change, eval_transform
from vit5.errors import InputError, name_list
from vit5.eval.backbone import EVAL_FIX, check_forward_memory
from vit5.eval.images import LabelledImages, bad_file_reason
from vit5.eval.load import LoadedModel
from vit5.eval.metrics import ClassificationMeter, ClassificationScores
from vit5.eval.report import format_table
from vit5.introspect import patch_size_of
from vit5.layers.patch_embed import grid_of
from vit5.runtime import default_workers, fit_threads, fit_workers


@dataclass(frozen=True)
class ClassifySettings:
    """``size`` (H, W) and ``crop_ratio`` default to the model's own (vit5: its img_size and 1.0)."""

    size: tuple[int, int] | None = None
    crop_ratio: float | None = None
    batch_size: int = 64
    num_workers: int | None = None  # None: vit5.runtime.default_workers() (min(4, CPUs - 1))

    def __post_init__(self) -> None:
        if self.size is not None and (len(self.size) != 2 or min(self.size) <= 0):
            raise InputError(f"size must be a positive (height, width) pair, got {self.size}")
        if self.crop_ratio is not None and not 0.0 < self.crop_ratio <= 1.0:
            raise InputError(
                f"crop_ratio must be in (0, 1] (1.0 = ViT-5 eval, 0.875 = classic), got {self.crop_ratio}"
            )
        if self.batch_size < 1 or (self.num_workers is not None and self.num_workers < 0):
            raise InputError(
                f"batch_size must be >= 1 and num_workers >= 0, got {self.batch_size}, {self.num_workers}"
            )


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
        s, doc = self.scores, {k: v for k, v in asdict(self).items() if k not in ("scores", "note")}
        scores = {"num_images": s.num_images, "top1": s.top1, "top5": s.top5, "loss": s.loss}
        per_class = dict(zip(self.class_names, s.per_class_accuracy.tolist()))
        return {
            **doc,
            **scores,
            "images_per_s": self.images_per_s,
            "per_class_accuracy": per_class,
            "confusion_matrix": s.confusion,
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
    num_classes = len(class_names)
    size = tuple(settings.size or loaded.input_size)
    patch = patch_size_of(loaded.model)
    if patch is not None:
        grid_of(size, patch, EVAL_FIX, InputError)
        width = getattr(loaded.model, "embed_dim", None) or getattr(loaded.model, "num_features", 0)
        check_forward_memory(patch, int(width), settings.batch_size, size, accelerator.device)
    crop = settings.crop_ratio or loaded.crop_pct
    transform = eval_transform(size, crop_ratio=crop, mean=loaded.mean, std=loaded.std)
    images = LabelledImages(dataset.samples, transform, size)
    workers = default_workers() if settings.num_workers is None else settings.num_workers
    workers, clamped = fit_workers(workers, "--workers")
    if clamped:
        warnings.warn(clamped, stacklevel=2)
    fit_threads(workers, accelerator.device)  # the CPUs the workers leave free, on a CPU device
    loader = accelerator.prepare(build_loader(images, settings.batch_size, train=False, num_workers=workers))
    model = loaded.model.to(accelerator.device).eval()
    meter, bad = ClassificationMeter(num_classes), []
    start = time.perf_counter()
    bar = tqdm(
        loader,
        desc=f"{loaded.label} @ {size[0]}x{size[1]}",
        disable=not (progress and accelerator.is_main_process),
    )
    with torch.inference_mode():
        for batch, targets, indices, ok in bar:
            logits = model(batch)
            logits, targets, indices, ok = accelerator.gather_for_metrics(
                (logits, targets, indices, ok.to(torch.uint8))
            )
            ok = ok.bool()
            meter.update(logits[ok], labels[targets[ok].cpu()])
            bad += indices[~ok].tolist()
    accelerator.wait_for_everyone()
    seconds = time.perf_counter() - start
    skipped = [
        {"path": dataset.samples[i][0], "reason": bad_file_reason(dataset.samples[i][0])}
        for i in sorted(set(bad))
    ]
    return ClassifyResult(
        model=loaded.label,
        weights=loaded.weights,
        data=str(Path(dataset.root)),
        size=size,
        crop_ratio=crop,
        class_names=class_names,
        scores=meter.compute(),
        seconds=seconds,
        num_processes=accelerator.num_processes,
        skipped=skipped,
        note=note,
    )


def label_map(loaded: LoadedModel, dataset: ImageFolderDataset) -> tuple[torch.Tensor, list[str], str]:
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
    how = (
        "the model's classes in another order"
        if len(folders) == len(names)
        else f"{len(folders)} of the model's {len(names)} classes"
    )
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
    headers = ("model", "weights", "size", "crop", "images", "top-1 %", "top-5 %", "loss", "img/s", "skipped")
    return format_table(headers, rows, title="classification")


def per_class_table(result: ClassifyResult, limit: int = 20) -> str:
    """Per-class accuracy; with more than ``limit`` classes only the ``limit`` worst."""
    acc = result.scores.per_class_accuracy
    counts = result.scores.confusion.sum(axis=1)
    rank = np.nan_to_num(acc, nan=np.inf)  # classes without images last
    order = sorted(range(len(acc)), key=lambda i: (rank[i], i)) if len(acc) > limit else range(len(acc))
    rows = [(result.class_names[i], int(counts[i]), 100 * acc[i]) for i in list(order)[:limit]]
    title = f"per-class accuracy, {result.model}" + (
        f" ({limit} worst of {len(acc)})" if len(acc) > limit else ""
    )
    return format_table(("class", "images", "accuracy %"), rows, title=title)

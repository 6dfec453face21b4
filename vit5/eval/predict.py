"""Top-k class predictions for a folder of images, with class names (what timm's ``inference.py`` does).

Preprocessing is that of :mod:`vit5.eval.classify`. Class names: the model's own (``label_names`` of its
``config.json``), else timm's ImageNet names (:class:`timm.data.ImageNetInfo`) for a trained ImageNet-size
head, else the output index. Unreadable files are listed, never replaced by a neighbour."""

from __future__ import annotations

import csv
import io
import os
from dataclasses import dataclass
from pathlib import Path

import torch
from tqdm.auto import tqdm

from vit5.errors import InputError
from vit5.eval.common import LoadedModel, bad_file_reason, labelled_loader, list_images
from vit5.files import atomic_write_text
from vit5.model.vit import unwrap


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
        return ClassNames(tuple(info.label_descriptions()), f"{subset} names (timm.data.ImageNetInfo)")
    return ClassNames(tuple(f"class {i}" for i in range(count)), "output indices (no class names recorded)")


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
    loader = labelled_loader(loaded, [(str(f), -1) for f in files], size, None, batch_size, num_workers)
    model = loaded.model.to(device).eval()
    results: list[Prediction] = []
    bar = tqdm(loader, desc=f"{loaded.label} @ {size[0]}x{size[1]}", disable=not progress)
    with torch.inference_mode():
        for batch, _, indices, ok in bar:
            probs = model(batch.to(device)).float().softmax(dim=-1).cpu()
            values, classes = probs.topk(topk, dim=-1)
            for i, good, p, c in zip(indices.tolist(), ok.tolist(), values.tolist(), classes.tolist()):
                error = "" if good else bad_file_reason(files[i])
                top = () if error else tuple((k, names.names[k], prob) for k, prob in zip(c, p))
                results.append(Prediction(files[i], top, error))
    return results, names


def predictions_table(predictions: list[Prediction], root: str | os.PathLike[str]) -> str:
    """One line per image: ``cat.jpg  tabby 81.2% | tiger cat 9.3% | ...`` (paths relative to ``root``)."""
    lines = []
    for pred in predictions:
        top = " | ".join(f"{label} {100 * p:.1f}%" for _, label, p in pred.top)
        lines.append(f"{_shown(pred.path, root)}  " + (f"skipped: {pred.error}" if pred.error else top))
    return "\n".join(lines)


def write_csv(
    predictions: list[Prediction], path: str | os.PathLike[str], root: str | os.PathLike[str]
) -> Path:
    """``image, top1_class, top1_index, top1_prob, ..., error`` per image (``error``: why a file was
    skipped, its other cells empty)."""
    k = max((len(p.top) for p in predictions), default=0)
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    columns = [f"top{r}_{col}" for r in range(1, k + 1) for col in ("class", "index", "prob")]
    writer.writerow(["image", *columns, "error"])
    for pred in predictions:
        cells = [cell for index, label, p in pred.top for cell in (label, index, f"{p:.6f}")]
        writer.writerow([_shown(pred.path, root), *cells, *[""] * (len(columns) - len(cells)), pred.error])
    Path(path).parent.mkdir(parents=True, exist_ok=True)
    return atomic_write_text(path, out.getvalue())


def _shown(path: Path, root: str | os.PathLike[str]) -> str:
    """``path`` relative to the folder ``root`` (or to the folder of the file ``root``)."""
    try:
        return str(path.relative_to(Path(root) if Path(root).is_dir() else Path(root).parent))
    except ValueError:
        return str(path)

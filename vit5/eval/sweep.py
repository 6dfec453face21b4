"""Accuracy against input resolution: ViT-5 resamples its absolute embedding and builds 2D RoPE for any
patch-multiple grid; the sweep measures how well that extrapolates (0.5x to 2x, non-square included)."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace

from accelerate import Accelerator

from vit5.data import ImageFolderDataset
from vit5.errors import InputError
from vit5.eval.classify import ClassifyResult, ClassifySettings, evaluate
from vit5.eval.images import Size
from vit5.eval.load import LoadedModel
from vit5.eval.report import format_table
from vit5.layers.patch_embed import round_to_patch

DEFAULT_SCALES = ("0.5", "0.75", "1", "1.25", "1.5", "2", "1x2", "2x1")
RECORD_KEYS = ("model", "weights", "size", "crop_ratio", "num_images", "top1", "top5", "loss", "images_per_s")


def parse_scale(text: str) -> tuple[float, float]:
    """``"1.5"`` -> (1.5, 1.5); ``"1x2"`` -> height x1, width x2."""
    try:
        values = [float(p) for p in text.lower().split("x")]
    except ValueError:
        values = []
    if len(values) not in (1, 2) or min(values, default=0) <= 0:
        raise InputError(f"scale {text!r} is not S or SHxSW with positive numbers (e.g. 0.5, 2 or 1x2)")
    return (values[0], values[-1])


def sizes_from_scales(scales: Sequence[str], base: Size, patch_size: int) -> list[Size]:
    """Scales of ``base`` (H, W), rounded to patch multiples, duplicates dropped, order kept."""
    sizes = [round_to_patch((base[0] * sh, base[1] * sw), patch_size) for sh, sw in map(parse_scale, scales)]
    return list(dict.fromkeys(sizes))


def run_sweep(
    models: Sequence[LoadedModel],
    dataset: ImageFolderDataset,
    sizes: Sequence[Size],
    settings: ClassifySettings | None = None,
    accelerator: Accelerator | None = None,
    progress: bool = True,
) -> list[ClassifyResult]:
    """One :func:`~vit5.eval.classify.evaluate` per (model, size), same data and crop ratio."""
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
    sizes = list(dict.fromkeys(r.size for r in results))
    cell = {(r.model, r.size): 100 * getattr(r.scores, metric) for r in results}
    rows = [(f"{h}x{w}", *(cell.get((m, (h, w))) for m in labels)) for h, w in sizes]
    return format_table(("size", *labels), rows, title=f"{metric} % against input size")


def sweep_records(results: Sequence[ClassifyResult]) -> list[dict]:
    """Compact JSON rows (no confusion matrices)."""
    return [{k: r.to_dict()[k] for k in RECORD_KEYS} for r in results]

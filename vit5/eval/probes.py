"""kNN and logistic-regression probes on frozen global features (CLS or average-pooled patches), the
DINO / DINOv2 protocol: encode a train and a val ImageFolder split once (eval preprocessing), fit on train,
report val top-1. kNN: cosine on L2-normalised features, the k nearest vote with ``exp(sim / T)`` (DINO's
weighted kNN, T = 0.07); linear probe: standardised features, multinomial L2 ``LogisticRegression``."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch
from sklearn.linear_model import LogisticRegression
from sklearn.neighbors import KNeighborsClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from tqdm.auto import tqdm

from vit5.data import ImageFolderDataset, build_loader, eval_transform
from vit5.errors import InputError
from vit5.eval.backbone import dense_features
from vit5.eval.images import LabelledImages
from vit5.eval.load import LoadedModel
from vit5.eval.report import format_table
from vit5.introspect import describe
from vit5.model import take_indices

POOLS = ("cls", "avg")
Array = np.ndarray


@dataclass(frozen=True)
class ProbeSettings:
    pools: tuple[str, ...] = POOLS
    knn_k: tuple[int, ...] = (10, 20)
    knn_temperature: float = 0.07
    logreg_c: float = 1.0
    logreg_max_iter: int = 1000
    layer: int = -1
    norm: bool = True  # final norm on the features (what the head sees)
    size: tuple[int, int] | None = None  # default: the model's input size
    crop_ratio: float | None = None
    batch_size: int = 64
    num_workers: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        bad = [p for p in self.pools if p not in POOLS]
        if bad or not self.pools:
            raise InputError(f"pools must be chosen from {POOLS}, got {self.pools}")
        if any(k < 1 for k in self.knn_k) or self.knn_temperature <= 0 or self.logreg_c <= 0:
            raise InputError("knn_k must be >= 1, knn_temperature > 0 and logreg_c > 0")


@dataclass(frozen=True)
class ProbeRow:
    model: str
    pool: str
    method: str  # "knn-20", "logreg"
    accuracy: float
    seconds: float


def encode(
    loaded: LoadedModel, dataset: ImageFolderDataset, settings: ProbeSettings, progress: bool = True
) -> tuple[dict[str, np.ndarray], np.ndarray]:
    """``({pool: [N, C] float32}, targets [N])`` for the readable images of ``dataset``."""
    info = describe(loaded.model)
    if "cls" in settings.pools and not info.num_cls:
        raise InputError(f"{loaded.label} has no CLS token; use pools=('avg',)")
    (block,) = take_indices(info.depth, [settings.layer])
    size = tuple(settings.size or loaded.input_size)
    crop = settings.crop_ratio or loaded.crop_pct
    transform = eval_transform(size, crop_ratio=crop, mean=loaded.mean, std=loaded.std)
    images = LabelledImages(dataset.samples, transform, size)
    loader = build_loader(images, settings.batch_size, train=False, num_workers=settings.num_workers)
    device = next(loaded.model.parameters()).device
    pooled: dict[str, list[torch.Tensor]] = {p: [] for p in settings.pools}
    targets = []
    for images, labels, _, ok in tqdm(
        loader, desc=f"encode {loaded.label}", disable=not progress, leave=False
    ):
        feats = dense_features(loaded.model, images.to(device), info, [block], norm=settings.norm)
        views = {
            "cls": feats.get(f"blocks.{block}.cls"),
            "avg": feats[f"blocks.{block}.patches"].mean((-2, -1)),
        }
        for pool in settings.pools:
            pooled[pool].append(views[pool].float().cpu()[ok])
        targets.append(labels[ok])
    return {p: torch.cat(v).numpy() for p, v in pooled.items()}, torch.cat(targets).numpy()


def knn_accuracy(
    train_x: Array, train_y: Array, val_x: Array, val_y: Array, k: int = 20, temperature: float = 0.07
) -> float:
    """Weighted cosine kNN (DINO): neighbours vote with ``exp(cos / T)``."""
    knn = KNeighborsClassifier(
        n_neighbors=min(k, len(train_y)),
        metric="cosine",
        algorithm="brute",
        weights=lambda distance: np.exp((1.0 - distance) / temperature),
    )
    return float(knn.fit(train_x, train_y).score(val_x, val_y))


def logreg_accuracy(
    train_x: Array,
    train_y: Array,
    val_x: Array,
    val_y: Array,
    c: float = 1.0,
    max_iter: int = 1000,
    seed: int = 0,
) -> float:
    """Linear probe: standardise, then multinomial L2 logistic regression."""
    probe = make_pipeline(StandardScaler(), LogisticRegression(C=c, max_iter=max_iter, random_state=seed))
    return float(probe.fit(train_x, train_y).score(val_x, val_y))


def run_probes(
    loaded: LoadedModel,
    train: ImageFolderDataset,
    val: ImageFolderDataset,
    settings: ProbeSettings = ProbeSettings(),
    progress: bool = True,
) -> list[ProbeRow]:
    if list(train.class_names) != list(val.class_names):
        raise InputError(
            f"train and val classes differ: {train.class_names[:5]}... vs {val.class_names[:5]}..."
        )
    (train_x, train_y), (val_x, val_y) = (encode(loaded, split, settings, progress) for split in (train, val))
    rows = []
    for pool in settings.pools:
        data = (train_x[pool], train_y, val_x[pool], val_y)
        probes = {
            f"knn-{k}": partial(knn_accuracy, *data, k, settings.knn_temperature) for k in settings.knn_k
        }
        probes["logreg"] = partial(
            logreg_accuracy, *data, settings.logreg_c, settings.logreg_max_iter, settings.seed
        )
        for method, probe in probes.items():
            start = time.perf_counter()
            accuracy = probe()
            rows.append(ProbeRow(loaded.label, pool, method, accuracy, time.perf_counter() - start))
    return rows


def probe_table(rows: Sequence[ProbeRow], chance: float | None = None) -> str:
    """Rows: (model, pool); columns: methods; cells: val top-1 in %."""
    methods = list(dict.fromkeys(r.method for r in rows))
    keys = list(dict.fromkeys((r.model, r.pool) for r in rows))
    cell = {(r.model, r.pool, r.method): 100 * r.accuracy for r in rows}
    table_rows = [(m, p, *(cell.get((m, p, x)) for x in methods)) for m, p in keys]
    title = "probe val top-1 %" + (f" (chance {100 * chance:.1f} %)" if chance else "")
    return format_table(("model", "pool", *methods), table_rows, title=title)

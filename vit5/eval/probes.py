"""Probes on frozen features. Global, the DINO protocol: CLS or average-pooled features of a train and a val
split; weighted cosine kNN (votes ``exp(sim / T)``, T = 0.07) and an L2 logistic regression. Dense, DINOv2's
linear segmentation: standardised patch features, a 1x1 layer, logits upsampled to each mask's size; IoU as
mmsegmentation (TP / (TP + FP + FN), mIoU over the classes with union > 0)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from functools import partial
from pathlib import Path

import cv2
import numpy as np
import torch
import torch.nn.functional as F
from sklearn.linear_model import LogisticRegression
from sklearn.neighbors import KNeighborsClassifier
from sklearn.pipeline import make_pipeline
from sklearn.preprocessing import StandardScaler
from torch import nn
from tqdm.auto import tqdm

from vit5.data import ImageFolderDataset, decode_image
from vit5.data.segmentation import SegDatasetInfo, list_pairs, read_mask
from vit5.errors import InputError, Rule
from vit5.eval.common import (
    LoadedModel,
    check_settings,
    confusion_matrix,
    dense_features,
    labelled_loader,
)
from vit5.eval.features import FailedImage, FeatureSettings, extract, prepare
from vit5.eval.upsample import JointBilateral, joint_bilateral_upsample
from vit5.introspect import ModelInfo, describe
from vit5.model import take_indices
from vit5.outputs import format_table

POOLS = ("cls", "avg")
Array = np.ndarray


_PROBE_RULES = (
    Rule("pools", lambda v: bool(v) and set(v) <= set(POOLS), f"chosen from {POOLS}"),
    Rule("knn_k", lambda v: all(k >= 1 for k in v), "counts >= 1"),
    Rule("knn_temperature logreg_c", lambda v: v > 0, "> 0"),
)


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
        check_settings(self, _PROBE_RULES)


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
    info = _info(loaded)
    if "cls" in settings.pools and not info.num_cls:
        raise InputError(f"{loaded.label} has no CLS token; use pools=('avg',)")
    (block,) = take_indices(info.depth, [settings.layer])
    size = tuple(settings.size or loaded.input_size)
    loader = labelled_loader(
        loaded,
        dataset.samples,
        size,
        settings.crop_ratio,
        settings.batch_size,
        settings.num_workers,
    )
    device = next(loaded.model.parameters()).device
    pooled: dict[str, list[torch.Tensor]] = {p: [] for p in settings.pools}
    targets = []
    for images, labels, _, ok in tqdm(
        loader,
        desc=f"encode {loaded.label}",
        disable=not progress,
        leave=False,
    ):
        feats = dense_features(loaded.model, images.to(device), info, [block], norm=settings.norm)
        patches = feats[f"blocks.{block}.patches"]
        views = {"cls": feats.get(f"blocks.{block}.cls"), "avg": patches.mean((-2, -1))}
        for pool in settings.pools:
            pooled[pool].append(views[pool].float().cpu()[ok])
        targets.append(labels[ok])
    return {p: torch.cat(v).numpy() for p, v in pooled.items()}, torch.cat(targets).numpy()


def _info(loaded: LoadedModel) -> ModelInfo:
    """The loader's description, or (a model loaded without one) the description made now."""
    return loaded.info or describe(loaded.model)


def knn_accuracy(
    train_x: Array,
    train_y: Array,
    val_x: Array,
    val_y: Array,
    k: int = 20,
    temperature: float = 0.07,
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
    probe = make_pipeline(
        StandardScaler(),
        LogisticRegression(C=c, max_iter=max_iter, random_state=seed),
    )
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
            f"train and val classes differ: {train.class_names[:5]}... vs {val.class_names[:5]}...",
        )
    train_x, train_y = encode(loaded, train, settings, progress)
    val_x, val_y = encode(loaded, val, settings, progress)
    rows = []
    for pool in settings.pools:
        data = (train_x[pool], train_y, val_x[pool], val_y)
        temperature = settings.knn_temperature
        probes = {f"knn-{k}": partial(knn_accuracy, *data, k, temperature) for k in settings.knn_k}
        probes["logreg"] = partial(
            logreg_accuracy,
            *data,
            settings.logreg_c,
            settings.logreg_max_iter,
            settings.seed,
        )
        for method, probe in probes.items():
            start = time.perf_counter()
            rows.append(ProbeRow(loaded.label, pool, method, probe(), time.perf_counter() - start))
    return rows


def probe_table(rows: Sequence[ProbeRow], chance: float | None = None) -> str:
    """Rows: (model, pool); columns: methods; cells: val top-1 in %."""
    methods = list(dict.fromkeys(r.method for r in rows))
    cell = {(r.model, r.pool, r.method): 100 * r.accuracy for r in rows}
    keys = dict.fromkeys((r.model, r.pool) for r in rows)
    table_rows = [(m, p, *(cell.get((m, p, x)) for x in methods)) for m, p in keys]
    title = "probe val top-1 %" + (f" (chance {100 * chance:.1f} %)" if chance else "")
    return format_table(("model", "pool", *methods), table_rows, title=title)


_SEG_PROBE_RULES = (
    Rule("epochs batch_size", lambda v: v >= 1, ">= 1"),
    Rule("lr", lambda v: v > 0, "> 0"),
    Rule("weight_decay", lambda v: v >= 0, ">= 0"),
)


@dataclass(frozen=True)
class SegProbeSettings:
    size: tuple[int, int] | None = None  # input (H, W); default: the model's
    layers: tuple[int, ...] = (-1,)
    norm: bool = True
    epochs: int = 30
    batch_size: int = 16
    lr: float = 0.05
    weight_decay: float = 1e-4
    seed: int = 0
    # also score with the logits upsampled to pixels by joint bilateral upsampling
    upsample: JointBilateral | None = None

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", tuple(self.layers))
        check_settings(self, _SEG_PROBE_RULES)


@dataclass(frozen=True)
class SegmentationScores:
    miou: float
    pixel_accuracy: float
    iou: np.ndarray  # per class; NaN where the class is absent from labels and predictions
    confusion: np.ndarray


def segmentation_scores(confusion: np.ndarray) -> SegmentationScores:
    confusion = np.asarray(confusion, dtype=np.float64)
    tp = np.diag(confusion)
    total = confusion.sum()
    union = confusion.sum(axis=0) + confusion.sum(axis=1) - tp
    iou = tp / np.where(union > 0, union, np.nan)
    # nanmean warns on all-NaN
    miou = float(np.nanmean(iou)) if np.isfinite(iou).any() else float("nan")
    pixel_accuracy = float(tp.sum() / total) if total else float("nan")
    return SegmentationScores(miou, pixel_accuracy, iou, confusion.astype(np.int64))


@dataclass
class SegProbeResult:
    model: str
    size: tuple[int, int]
    blocks: list[int]
    class_names: tuple[str, ...]
    scores: SegmentationScores
    num_train: int
    num_val: int
    seconds_features: float
    seconds_train: float
    final_train_loss: float
    skipped: list[dict[str, str]] = field(default_factory=list)
    # predictions on the patch grid against masks resized to it (nearest)
    scores_patch: SegmentationScores | None = None
    # logits upsampled to pixels by joint bilateral upsampling (settings.upsample)
    scores_upsampled: SegmentationScores | None = None

    def to_dict(self) -> dict:
        s = self.scores
        apart = ("class_names", "scores", "scores_patch", "scores_upsampled")
        doc = {k: v for k, v in asdict(self).items() if k not in apart}
        iou = dict(zip(self.class_names, s.iou.tolist()))
        extra = {}
        if self.scores_patch is not None:
            extra["miou_patch"] = self.scores_patch.miou
        if self.scores_upsampled is not None:
            extra["miou_upsampled"] = self.scores_upsampled.miou
            extra["pixel_accuracy_upsampled"] = self.scores_upsampled.pixel_accuracy
        return dict(
            doc,
            miou=s.miou,
            pixel_accuracy=s.pixel_accuracy,
            iou=iou,
            confusion_matrix=s.confusion,
            **extra,
        )


@dataclass
class EncodedSplit:
    features: torch.Tensor  # [N, C, h, w] float16
    masks: list[np.ndarray]  # full-resolution checked masks
    skipped: list[dict[str, str]]
    paths: list[Path] = field(default_factory=list)  # the images (guides of the upsampling)


@dataclass
class LinearHead:
    """Per-channel standardisation then a 1x1 convolution to class logits."""

    conv: nn.Conv2d
    mean: torch.Tensor
    std: torch.Tensor
    final_loss: float

    def __call__(self, features: torch.Tensor) -> torch.Tensor:
        return self.conv((features.float() - self.mean) / self.std)


def train_linear_head(
    train: EncodedSplit,
    info: SegDatasetInfo,
    size: tuple[int, int],
    settings: SegProbeSettings,
    device: torch.device | str = "cpu",
) -> LinearHead:
    """Fit the head with AdamW (cosine schedule) on logits upsampled to ``size``, masks resized
    to ``size`` with nearest neighbour; deterministic for ``settings.seed``. The cached features
    stay on the CPU (fp16); each batch and the head run on ``device`` (the backbone's)."""
    feats = train.features
    std, mean = torch.std_mean(feats.float(), dim=(0, 2, 3), keepdim=True)
    resized = [
        cv2.resize(m.astype(np.int32), size[::-1], interpolation=cv2.INTER_NEAREST)
        for m in train.masks
    ]
    targets = torch.from_numpy(np.stack(resized)).long()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(settings.seed)
        conv = nn.Conv2d(feats.shape[1], info.num_classes, kernel_size=1)
    head = LinearHead(
        conv.to(device),
        mean.to(device),
        std.clamp_min(1e-6).to(device),
        float("nan"),
    )
    generator = torch.Generator().manual_seed(settings.seed)
    steps = settings.epochs * -(-len(feats) // settings.batch_size)
    optimizer = torch.optim.AdamW(
        head.conv.parameters(),
        lr=settings.lr,
        weight_decay=settings.weight_decay,
    )
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps)
    for _ in range(settings.epochs):
        for idx in torch.randperm(len(feats), generator=generator).split(settings.batch_size):
            x = feats[idx].to(device, non_blocking=True)
            y = targets[idx].to(device, non_blocking=True)
            logits = F.interpolate(head(x), size=size, mode="bilinear", align_corners=False)
            loss = F.cross_entropy(logits, y, ignore_index=info.ignore_index)
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            schedule.step()
    head.final_loss = float(loss.detach())  # one host sync, after training
    head.conv.eval()
    return head


@torch.no_grad()
def score_linear_head(
    head: LinearHead,
    val: EncodedSplit,
    info: SegDatasetInfo,
    upsample: JointBilateral | None = None,
) -> tuple[SegmentationScores, SegmentationScores, SegmentationScores | None]:
    """mIoU and pixel accuracy three ways: logits upsampled (bilinear) to each mask's full size;
    on the patch grid against the mask resized to it (nearest); with ``upsample``, logits
    upsampled to the full size by joint bilateral upsampling guided by the image (the same as
    the head on upsampled features: the weights of each pixel sum to one)."""
    classes = info.num_classes
    pixel = torch.zeros(classes, classes, dtype=torch.int64)
    patch = torch.zeros_like(pixel)
    guided = torch.zeros_like(pixel)
    device = head.conv.weight.device

    def add(confusion: torch.Tensor, logits: torch.Tensor, mask: np.ndarray) -> None:
        pred = logits.argmax(dim=1)[0].cpu()
        target = torch.from_numpy(mask)
        valid = target != info.ignore_index
        confusion += confusion_matrix(target[valid], pred[valid], classes)

    for i, (feats, mask) in enumerate(zip(val.features, val.masks)):
        logits = head(feats[None].to(device))
        grid = logits.shape[-2:]
        add(
            pixel,
            F.interpolate(logits, size=mask.shape, mode="bilinear", align_corners=False),
            mask,
        )
        coarse = cv2.resize(mask.astype(np.int32), grid[::-1], interpolation=cv2.INTER_NEAREST)
        add(patch, logits, coarse)
        if upsample is not None:
            rgb = decode_image(val.paths[i])
            guide = torch.from_numpy(rgb).permute(2, 0, 1)[None].float().div(255).to(device)
            add(guided, joint_bilateral_upsample(logits, guide, upsample), mask)
    scores = segmentation_scores(pixel.numpy())
    at_patches = segmentation_scores(patch.numpy())
    upsampled = segmentation_scores(guided.numpy()) if upsample is not None else None
    return scores, at_patches, upsampled


def run_segmentation_probe(
    loaded: LoadedModel,
    root: str,
    info: SegDatasetInfo,
    splits: tuple[str, str],
    settings: SegProbeSettings = SegProbeSettings(),
    progress: bool = True,
) -> SegProbeResult:
    """Train the dense linear probe on ``splits[0]`` and score it on ``splits[1]``."""
    size = tuple(settings.size or loaded.input_size)
    features = FeatureSettings(
        settings.layers,
        size,
        norm=settings.norm,
        dtype="float16",
        batch_size=settings.batch_size,
    )
    # a bad size or block index fails here, before any work
    blocks = prepare(loaded, features).blocks

    def encode(split: str) -> EncodedSplit:
        masks_of = {Path(image): mask for image, mask in list_pairs(root, split)}
        chunks = []
        masks = []
        skipped = []
        paths = []
        items = extract(loaded, list(masks_of), features)
        for item in tqdm(
            items,
            total=len(masks_of),
            desc=f"features {split}",
            disable=not progress,
            leave=False,
        ):
            if isinstance(item, FailedImage):
                skipped.append({"path": str(item.path), "reason": item.reason})
                continue
            masks.append(read_mask(masks_of[item.path], item.image_size, info))
            paths.append(item.path)
            chunks.append(torch.cat([item.features[f"blocks.{b}.patches"] for b in blocks]))
        if not masks:
            raise InputError(
                f"none of the {len(masks_of)} images of split {split} can be read (e.g. {skipped[0]})",
            )
        return EncodedSplit(torch.stack(chunks), masks, skipped, paths)

    start = time.perf_counter()
    train, val = map(encode, splits)
    encoded = time.perf_counter()
    head = train_linear_head(
        train,
        info,
        size,
        settings,
        device=next(loaded.model.parameters()).device,
    )
    scores, at_patches, upsampled = score_linear_head(head, val, info, settings.upsample)
    return SegProbeResult(
        model=loaded.label,
        size=size,
        blocks=blocks,
        class_names=info.class_names,
        scores=scores,
        scores_patch=at_patches,
        scores_upsampled=upsampled,
        num_train=len(train.masks),
        num_val=len(val.masks),
        seconds_features=encoded - start,
        seconds_train=time.perf_counter() - encoded,
        final_train_loss=head.final_loss,
        skipped=train.skipped + val.skipped,
    )


def seg_tables(results: Sequence[SegProbeResult]) -> str:
    headers = (
        "model",
        "size",
        "blocks",
        "train",
        "val",
        "mIoU %",
        "mIoU patch %",
        "mIoU JBU %",
        "pixel acc %",
        "features s",
        "train s",
    )
    rows = [
        (
            r.model,
            f"{r.size[0]}x{r.size[1]}",
            ",".join(map(str, r.blocks)),
            r.num_train,
            r.num_val,
            100 * r.scores.miou,
            100 * r.scores_patch.miou if r.scores_patch else "-",
            100 * r.scores_upsampled.miou if r.scores_upsampled else "-",
            100 * r.scores.pixel_accuracy,
            round(r.seconds_features, 1),
            round(r.seconds_train, 1),
        )
        for r in results
    ]
    per_class = [
        (name, *(100 * r.scores.iou[i] for r in results))
        for i, name in enumerate(results[0].class_names)
    ]
    summary = format_table(headers, rows, "segmentation linear probe")
    ious = format_table(("class", *(r.model for r in results)), per_class, "IoU % per class")
    return f"{summary}\n\n{ious}"

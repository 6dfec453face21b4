"""Dense linear probe for semantic segmentation on frozen patch features (DINOv2's linear evaluation).

The chosen blocks' patch features (concatenated, cached in float16) are standardised per channel and a 1x1
linear layer maps them to class logits, upsampled bilinearly and trained with per-pixel cross-entropy;
validation logits are upsampled to each mask's own size, so scores are at full label resolution."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path

import cv2
import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from tqdm.auto import tqdm

from vit5.data.segmentation import SegDatasetInfo, list_pairs, read_mask
from vit5.errors import InputError
from vit5.eval.backbone import EVAL_FIX
from vit5.eval.features import FailedImage, FeatureSettings, extract
from vit5.eval.load import LoadedModel
from vit5.eval.metrics import SegmentationScores, confusion_matrix, segmentation_scores
from vit5.eval.report import format_table
from vit5.introspect import describe
from vit5.model import take_indices


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

    def __post_init__(self) -> None:
        object.__setattr__(self, "layers", tuple(self.layers))
        if self.epochs < 1 or self.batch_size < 1 or self.lr <= 0 or self.weight_decay < 0:
            raise InputError("epochs and batch_size must be >= 1, lr > 0 and weight_decay >= 0")


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

    def to_dict(self) -> dict:
        s, doc = self.scores, {k: v for k, v in asdict(self).items() if k not in ("class_names", "scores")}
        iou = dict(zip(self.class_names, s.iou.tolist()))
        return {
            **doc,
            "miou": s.miou,
            "pixel_accuracy": s.pixel_accuracy,
            "iou": iou,
            "confusion_matrix": s.confusion,
        }


@dataclass
class EncodedSplit:
    """Frozen patch features of one split and its checked masks."""

    features: torch.Tensor  # [N, C, h, w] float16
    masks: list[np.ndarray]  # full-resolution checked masks
    skipped: list[dict[str, str]]


def _encode(
    loaded: LoadedModel,
    split: str,
    root: str,
    info: SegDatasetInfo,
    features: FeatureSettings,
    progress: bool,
) -> EncodedSplit:
    """The frozen patch features of ``split`` (images resized to ``features.size``) and its masks."""
    masks_of = {Path(image): mask for image, mask in list_pairs(root, split)}
    chunks, masks, skipped = [], [], []
    items = extract(loaded, list(masks_of), features)
    for item in tqdm(items, total=len(masks_of), desc=f"features {split}", disable=not progress, leave=False):
        if isinstance(item, FailedImage):
            skipped.append({"path": str(item.path), "reason": item.reason})
            continue
        masks.append(read_mask(masks_of[item.path], item.image_size, info))
        chunks.append(torch.cat([item.features[f"blocks.{b}.patches"] for b in features.layers]))
    if not masks:
        raise InputError(f"none of the {len(masks_of)} images of this split can be read (e.g. {skipped[0]})")
    return EncodedSplit(torch.stack(chunks), masks, skipped)


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
    std = std.clamp_min(1e-6)
    resized = [
        cv2.resize(m.astype(np.int32), size[::-1], interpolation=cv2.INTER_NEAREST) for m in train.masks
    ]
    targets = torch.from_numpy(np.stack(resized)).long()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(settings.seed)
        conv = nn.Conv2d(feats.shape[1], info.num_classes, kernel_size=1)
    head = LinearHead(conv.to(device), mean.to(device), std.to(device), float("nan"))
    generator = torch.Generator().manual_seed(settings.seed)
    steps = settings.epochs * -(-len(feats) // settings.batch_size)
    optimizer = torch.optim.AdamW(head.conv.parameters(), lr=settings.lr, weight_decay=settings.weight_decay)
    schedule = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, steps)
    for _ in range(settings.epochs):
        for idx in torch.randperm(len(feats), generator=generator).split(settings.batch_size):
            x, y = feats[idx].to(device, non_blocking=True), targets[idx].to(device, non_blocking=True)
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
def score_linear_head(head: LinearHead, val: EncodedSplit, info: SegDatasetInfo) -> SegmentationScores:
    """mIoU and pixel accuracy with logits upsampled (bilinear) to each mask's full size."""
    confusion = torch.zeros(info.num_classes, info.num_classes, dtype=torch.int64)
    device = head.conv.weight.device
    for feats, mask in zip(val.features, val.masks):
        logits = F.interpolate(
            head(feats[None].to(device)), size=mask.shape, mode="bilinear", align_corners=False
        )
        pred = logits.argmax(dim=1)[0].cpu()
        target = torch.from_numpy(mask)
        valid = target != info.ignore_index
        confusion += confusion_matrix(target[valid], pred[valid], info.num_classes)
    return segmentation_scores(confusion.numpy())


def run_segmentation_probe(
    loaded: LoadedModel,
    root: str,
    info: SegDatasetInfo,
    splits: tuple[str, str],
    settings: SegProbeSettings = SegProbeSettings(),
    progress: bool = True,
) -> SegProbeResult:
    """Train the dense linear probe on ``splits[0]`` and score it on ``splits[1]``."""
    backbone = describe(loaded.model)
    blocks = take_indices(backbone.depth, settings.layers, unique=True)
    size = tuple(settings.size or loaded.input_size)
    backbone.grid(size, EVAL_FIX)
    features = FeatureSettings(
        blocks, size, norm=settings.norm, dtype="float16", batch_size=settings.batch_size
    )
    start = time.perf_counter()
    train, val = (_encode(loaded, split, root, info, features, progress) for split in splits)
    seconds_features = time.perf_counter() - start
    start = time.perf_counter()
    head = train_linear_head(train, info, size, settings, device=next(loaded.model.parameters()).device)
    seconds_train = time.perf_counter() - start
    return SegProbeResult(
        model=loaded.label,
        size=size,
        blocks=blocks,
        class_names=info.class_names,
        scores=score_linear_head(head, val, info),
        num_train=len(train.masks),
        num_val=len(val.masks),
        seconds_features=seconds_features,
        seconds_train=seconds_train,
        final_train_loss=head.final_loss,
        skipped=train.skipped + val.skipped,
    )


def seg_tables(results: Sequence[SegProbeResult]) -> str:
    summary = format_table(
        ("model", "size", "blocks", "train", "val", "mIoU %", "pixel acc %", "features s", "train s"),
        [
            (
                r.model,
                f"{r.size[0]}x{r.size[1]}",
                ",".join(map(str, r.blocks)),
                r.num_train,
                r.num_val,
                100 * r.scores.miou,
                100 * r.scores.pixel_accuracy,
                round(r.seconds_features, 1),
                round(r.seconds_train, 1),
            )
            for r in results
        ],
        title="segmentation linear probe",
    )
    names = results[0].class_names
    per_class = format_table(
        ("class", *(r.model for r in results)),
        [(name, *(100 * r.scores.iou[i] for r in results)) for i, name in enumerate(names)],
        title="IoU % per class",
    )
    return summary + "\n\n" + per_class

"""The training configuration: one typed dataclass per section, read by OmegaConf.

Defaults are the ViT-5-Small ImageNet pre-training recipe (DeiT-III style; reference §3.2): LAMB
lr 4e-3 (absolute, ``--unscale-lr``), weight decay 0.05, 800 epochs with 5 warmup epochs from
1e-6, cosine to 1e-5, 3-Augment, Mixup 0.8 / CutMix 1.0 with binarised BCE, repeated
augmentation x3, EMA 0.99996, bf16. ``configs/*.yaml`` only state what differs.

Loading, overrides and validation live in :mod:`vit5.train.config_load`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal


@dataclass
class ModelSection:
    name: str = "vit5_small"  # a vit5 preset (vit5.list_presets())
    img_size: int = 224
    num_classes: int | None = None  # None: the number of classes in the data
    drop_path_rate: float = 0.0
    overrides: dict[str, Any] = field(default_factory=dict)  # any other ViT5Config field, e.g. {depth: 2}
    pretrained: str | None = (
        None  # fine-tune from our run/checkpoint dir, an official ViT-5 .pth or a timm deit3
    )
    pretrained_ema: bool = False  # take the checkpoint's EMA weights (official --load_ema)
    new_head: bool = True  # start a new head when the checkpoint's head does not fit the data's classes
    grad_checkpointing: bool = False
    max_params: float = (
        2e9  # refuse a larger model before allocating it (a typo like depth=1200); raise it if meant
    )
    compile: bool | str = False  # true: torch.compile the model; regional: each block (vit5.compile_blocks)


@dataclass
class DataSection:
    dataset: Literal["folder", "digits"] = "folder"  # digits: the built-in scikit-learn set, no files
    root: str | None = None  # folder: ROOT/<train_split>/<class>/*.jpg and ROOT/<val_split>/<class>/*.jpg
    train_split: str = "train"
    val_split: str = "val"
    batch_size: int = 256  # per process, like the official --batch-size (per GPU)
    eval_batch_size: int | None = None  # None: 1.5 x batch_size, as the official code
    num_workers: int = 8
    pin_memory: bool | None = None  # None: on when CUDA is available
    persistent_workers: bool = True  # only with num_workers > 0
    verify: bool = False  # decode every file once before training (bad files found up front)
    digits_val_fraction: float = 0.2


@dataclass
class AugSection:
    train: Literal["three_augment", "randaug", "none"] = "three_augment"
    color_jitter: float = 0.3  # three_augment only
    randaug: str = "rand-m9-mstd0.5-inc1"  # randaug only
    scale: tuple[float, float] = (0.08, 1.0)  # random-resized-crop area range
    hflip: float = 0.5
    eval_crop_ratio: float = 1.0
    repeated_aug: int = 3  # RASampler repeats per image and epoch; 1 = off
    ra_selected_round: int = 256  # DeiT's per-epoch rounding; 0 for small data sets
    mixup: float = 0.8  # alpha; 0 = off
    cutmix: float = 1.0  # alpha; 0 = off
    mixup_prob: float = 1.0
    mixup_switch_prob: float = 0.5
    mixup_mode: Literal["batch", "pair", "elem"] = "batch"

    @property
    def mixing(self) -> bool:
        """Whether Mixup or CutMix is on at all."""
        return self.mixup_prob > 0 and (self.mixup > 0 or self.cutmix > 0)


@dataclass
class LossSection:
    name: Literal["bce", "soft_ce"] = "bce"
    smoothing: float = 0.0  # label smoothing, folded into the (mixed) soft targets
    bce_target_threshold: float | None = 0.0  # bce: targets > threshold become 1 (official: targets.gt(0))


@dataclass
class OptimSection:
    name: str = "lamb"  # any timm optimizer (timm.optim.list_optimizers())
    lr: float = 4e-3  # peak lr, absolute (official --unscale-lr) unless lr_base_batch is set
    lr_base_batch: int | None = None  # set: lr is scaled by global_batch / lr_base_batch (DeiT: 512)
    weight_decay: float = 0.05
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    layer_decay: float | None = None  # layer-wise lr decay (fine-tuning), e.g. 0.75
    clip_grad: float | None = None  # global grad-norm clip; timm's LAMB also clips at 1.0 like apex FusedLAMB
    accum_steps: int = 1  # gradient accumulation (micro-batches per optimizer step)


@dataclass
class ScheduleSection:
    epochs: int = 800
    warmup_epochs: float = 5.0
    warmup_lr: float = 1e-6
    min_lr: float = 1e-5
    interval: Literal["update", "epoch"] = (
        "epoch"  # epoch: official per-epoch stepping (one-epoch lag); update: per step
    )


@dataclass
class EmaSection:
    enabled: bool = True
    decay: float = 0.99996
    warmup: bool = False  # timm ModelEmaV3 decay warmup (for short runs)


@dataclass
class CheckpointSection:
    every_steps: int = 0  # also save every N optimizer steps (0: only at epoch ends)
    every_epochs: int = 1
    keep_last: int = 2
    save_best: bool = True  # best/ = best val top-1 of the raw weights
    # a resume whose random states are missing or damaged is an error; true: a loud warning, and the
    # summary records resume_exact=false
    allow_inexact_resume: bool = False


@dataclass
class RunSection:
    name: str = "run"
    output_dir: str = "runs"  # the run directory is output_dir/name
    seed: int = 42  # per-process seed = seed + rank, as the official code
    mixed_precision: Literal["fp32", "bf16", "fp16"] = "bf16"  # autocast dtype; master weights stay fp32
    cpu: bool = False  # force CPU even when an accelerator is available
    eval_every_epochs: int = 1
    progress: bool = True  # tqdm bar per epoch (main process only)


@dataclass
class TrainConfig:
    model: ModelSection = field(default_factory=ModelSection)
    data: DataSection = field(default_factory=DataSection)
    aug: AugSection = field(default_factory=AugSection)
    loss: LossSection = field(default_factory=LossSection)
    optim: OptimSection = field(default_factory=OptimSection)
    schedule: ScheduleSection = field(default_factory=ScheduleSection)
    ema: EmaSection = field(default_factory=EmaSection)
    checkpoint: CheckpointSection = field(default_factory=CheckpointSection)
    run: RunSection = field(default_factory=RunSection)

"""The training configuration: one typed dataclass per section (defaults: the ViT-5-Small ImageNet
recipe of github.com/wangf3014/ViT-5 main.py), read from YAML plus dotted ``key=value`` overrides by
OmegaConf (:func:`load_config`) and checked once, when built, with a fix for every problem."""

from __future__ import annotations

import dataclasses
import difflib
import importlib.resources
import importlib.util
import math
import os
import typing
import unicodedata
import warnings
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

import vit5
from vit5.data.folder import missing_split
from vit5.errors import Rule, rule_problems, shorten
from vit5.model.footprint import check_size
from vit5.train.errors import TrainConfigError
from vit5.weights import catalog


@dataclass
class LoraSection:
    """LoRA adapters (arXiv 2106.09685) through the peft library; see :mod:`vit5.train.modeling`."""

    enabled: bool = False  # true: train only low-rank adapters on the blocks' linears, and the head
    r: int = 8  # rank of each adapter
    alpha: float = 16.0  # the update is scaled by alpha / r
    dropout: float = 0.0  # dropout on an adapter's input
    targets: list[str] = field(default_factory=lambda: ["qkv", "proj", "fc1", "fc2"])  # per block


@dataclass
class ModelSection:
    name: str = "vit5_small"  # a vit5 preset (vit5.list_presets())
    img_size: int = 224
    num_classes: int | None = None  # None: the number of classes in the data
    drop_path_rate: float = 0.0
    overrides: dict[str, Any] = field(default_factory=dict)  # other ViT5Config fields: {depth: 2}
    # fine-tune from: true (the released weights of `name`), a released name
    # (vit5_small_patch16_224.in1k), hf-hub:USER/REPO, one of our runs (its config.json gives the
    # architecture), an official .pth, timm file
    pretrained: str | None = None
    pretrained_ema: bool = False  # take the checkpoint's EMA weights (official --load_ema)
    new_head: bool = True  # a new head when the checkpoint's head does not fit the data's classes
    grad_checkpointing: bool = False
    max_params: float = 2e9  # refuse a larger model before allocating it (a typo like depth=1200)
    compile: bool | str = False  # true: torch.compile the model; regional: vit5.compile_blocks
    lora: LoraSection = field(default_factory=LoraSection)  # parameter-efficient fine-tuning


@dataclass
class DataSection:
    dataset: Literal["folder", "digits", "wds"] = "folder"  # digits: built in; wds: shards
    root: str | None = None  # folder: ROOT/<train_split or val_split>/<class>/*.jpg
    train_split: str = "train"
    val_split: str = "val"
    train_shards: Any = None  # wds: a brace pattern (/data/train-{000000..001023}.tar), list or dir
    val_shards: Any = None  # wds: the same for validation
    num_classes: int | None = None  # wds without a classes.txt beside the shards
    shuffle_buffer: int = 1000  # wds: samples (undecoded) each loader worker mixes
    batch_size: int = 256  # per process, like the official --batch-size (per GPU)
    eval_batch_size: int | None = None  # None: 1.5 x batch_size, as the official code
    num_workers: int = 8
    pin_memory: bool | None = None  # None: on when CUDA is available
    persistent_workers: bool = True  # only with num_workers > 0
    verify: bool = False  # decode every file once before training (bad files found up front)
    preload: bool = False  # verify, and keep the decoded images in memory: no file read after that
    digits_val_fraction: float = 0.2
    # the training classes in label order; null: the train split's class folders, recorded here
    # when a run starts (config.yaml, every checkpoint), so --resume on renamed folders is refused
    class_names: list[str] | None = None


@dataclass
class AugSection:
    train: Literal["three_augment", "randaug", "rrc", "pad_crop", "none"] = "three_augment"
    color_jitter: float = 0.3  # three_augment only
    randaug: str = "rand-m9-mstd0.5-inc1"  # randaug only
    padding: int = 4  # pad_crop only: pixels of reflect padding before the random crop
    erasing: float = 0.25  # rrc and pad_crop: random-erasing probability (0 = off)
    scale: tuple[float, float] = (0.08, 1.0)  # random-resized-crop area range
    ratio: tuple[float, float] = (3 / 4, 4 / 3)  # random-resized-crop aspect range
    hflip: float = 0.5
    eval_crop_ratio: float = 1.0
    repeated_aug: int = 3  # RASampler repeats per image and epoch; 1 = off
    ra_selected_round: int = 256  # DeiT's per-epoch rounding (repeated_aug > 1); 0: small data
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
    bce_target_threshold: float | None = 0.0  # bce: targets > it become 1 (official: .gt(0))


@dataclass
class OptimSection:
    name: str = "lamb"  # any timm optimizer (timm.optim.list_optimizers())
    lr: float = 4e-3  # peak lr, absolute (official --unscale-lr) unless lr_base_batch is set
    lr_base_batch: int | None = (
        None  # set: lr is scaled by global_batch / lr_base_batch (DeiT: 512)
    )
    weight_decay: float = 0.05
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    layer_decay: float | None = None  # layer-wise lr decay (fine-tuning), e.g. 0.75
    clip_grad: float | None = None  # global grad-norm clip; timm's LAMB clips at 1.0 too (apex)
    accum_steps: int = 1  # gradient accumulation (micro-batches per optimizer step)

    def peak_lr(self, global_batch: int) -> float:
        """``lr`` (official ``--unscale-lr``), or scaled by ``global_batch / lr_base_batch``."""
        if self.lr_base_batch is None:
            return self.lr
        return self.lr * global_batch / self.lr_base_batch


@dataclass
class ScheduleSection:
    epochs: int = 800
    warmup_epochs: float = 5.0
    warmup_lr: float = 1e-6
    min_lr: float = 1e-5
    interval: Literal["update", "epoch"] = "epoch"  # epoch: official per-epoch stepping (lags one)


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
    # a resume whose random states are missing or damaged is an error; true: a loud warning, and
    # the summary records resume_exact=false
    allow_inexact_resume: bool = False


@dataclass
class RunSection:
    name: str = "run"
    output_dir: str = "runs"  # the run directory is output_dir/name
    seed: int = 42  # per-process seed = seed + rank, as the official code
    mixed_precision: Literal["fp32", "bf16", "fp16"] = "bf16"  # autocast; master weights fp32
    cpu: bool = False  # force CPU even when an accelerator is available
    eval_every_epochs: int = 1
    progress: bool = True  # tqdm bar per epoch (main process only)
    log_with: str | None = None  # Accelerate trackers (tensorboard, wandb, mlflow, ...), a,b
    log_every_steps: int = 1  # per-step loss and lr to the trackers every N steps (their mean)
    tracker_project: str = "vit5"  # wandb project, MLflow experiment, TensorBoard folder


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

    def __post_init__(self) -> None:
        validate_config(self)  # once, however it is built: load_config, a checkpoint, replace()


# ---------------------------------------------------------------------------------- validation
def validate_config(cfg: TrainConfig) -> None:
    """Every problem of the settings (ranges, names, combinations) in one error; the one check of
    a config, run by :class:`TrainConfig` when it is built (paths: :func:`check_paths_exist`)."""
    flat = flatten_config(cfg)
    epochs = cfg.schedule.epochs
    warmup = Rule("schedule.warmup_epochs", lambda v: 0 <= v < epochs, "in [0, schedule.epochs)")
    problems = [
        *_finite(flat),
        *rule_problems(flat, [*_RULES, warmup]),
        *_names(cfg),
        *_combinations(cfg),
        *_pretrained(cfg),
        *_lora(cfg.model.lora, cfg.model.pretrained),
        *_trackers(cfg.run.log_with),
    ]
    _refuse(problems)


def check_paths_exist(cfg: TrainConfig) -> None:
    """That ``data.root`` (and its splits) and a ``model.pretrained`` path exist."""
    _refuse(list(_path_problems(cfg)))


def _refuse(problems: list[str]) -> None:
    if problems:
        raise TrainConfigError("invalid training config:\n  - " + "\n  - ".join(problems))


_RULES = [
    Rule("model.img_size model.max_params optim.lr optim.eps", lambda v: v > 0, "> 0"),
    Rule("model.lora.alpha", lambda v: v > 0, "> 0"),
    Rule("model.num_classes data.eval_batch_size", lambda v: v >= 1, ">= 1 or null"),
    Rule("data.num_classes optim.lr_base_batch", lambda v: v >= 1, ">= 1 or null"),
    Rule("model.drop_path_rate loss.smoothing", lambda v: 0 <= v < 1, "in [0, 1)"),
    Rule("model.lora.dropout", lambda v: 0 <= v < 1, "in [0, 1)"),
    Rule("data.batch_size optim.accum_steps schedule.epochs", lambda v: v >= 1, ">= 1"),
    Rule("model.lora.r checkpoint.every_epochs checkpoint.keep_last", lambda v: v >= 1, ">= 1"),
    Rule("run.eval_every_epochs run.log_every_steps", lambda v: v >= 1, ">= 1"),
    Rule("data.num_workers aug.color_jitter aug.ra_selected_round", lambda v: v >= 0, ">= 0"),
    Rule("optim.weight_decay schedule.warmup_lr schedule.min_lr", lambda v: v >= 0, ">= 0"),
    Rule("data.shuffle_buffer aug.mixup aug.cutmix", lambda v: v >= 0, ">= 0 (0 = off)"),
    Rule("data.digits_val_fraction ema.decay", lambda v: 0 < v < 1, "in (0, 1)"),
    Rule("aug.hflip aug.erasing aug.mixup_prob", lambda v: 0 <= v <= 1, "a probability in [0, 1]"),
    Rule("aug.mixup_switch_prob", lambda v: 0 <= v <= 1, "a probability in [0, 1]"),
    Rule("aug.scale", lambda v: 0 < v[0] <= v[1] <= 1, "0 < min <= max <= 1"),
    Rule("aug.ratio", lambda v: 0 < v[0] <= v[1], "0 < min <= max"),
    Rule("aug.padding", lambda v: v >= 0, ">= 0 pixels"),
    Rule("aug.eval_crop_ratio", lambda v: 0 < v <= 1, "in (0, 1]"),
    Rule("aug.repeated_aug", lambda v: v >= 1, ">= 1 (1 = off)"),
    Rule("optim.betas", lambda v: all(0 <= b < 1 for b in v), "each in [0, 1)"),
    Rule("optim.layer_decay", lambda v: 0 < v <= 1, "in (0, 1] or null"),
    Rule("optim.clip_grad", lambda v: v > 0, "> 0 or null"),
    Rule("checkpoint.every_steps", lambda v: v >= 0, ">= 0 (0 = epoch ends only)"),
    # numpy seeds take [0, 2**32); each process adds its rank, each loader 1000 x rank
    Rule("run.seed", lambda v: 0 <= v < 2**31, "in [0, 2**31)"),
]
FLOAT32_MAX = 3.4028234663852886e38  # optimizer states and the lr live in float32 tensors


def _finite(flat: Mapping[str, Any]) -> Iterator[str]:
    """Every number setting is finite and fits float32 (``optim.eps=inf`` would pass ``> 0``)."""
    for key, value in flat.items():
        numbers = value if isinstance(value, (list, tuple)) else [value]
        floats = [n for n in numbers if isinstance(n, float)]
        if not all(math.isfinite(n) and abs(n) <= FLOAT32_MAX for n in floats):
            yield f"{key}={shorten(value)} must be a finite number of at most 3.4e38 in size (float32)"


def _did_you_mean(word: str, choices: Sequence[str]) -> str:
    close = difflib.get_close_matches(word, choices, n=1)
    return f"did you mean {close[0]}? " if close else ""


def _names(cfg: TrainConfig) -> Iterator[str]:
    from timm.optim import list_optimizers

    presets = vit5.list_presets()
    name = cfg.model.name
    if name not in presets:
        hint = _did_you_mean(name, presets)
        yield f"model.name={shorten(name)} is not a preset; {hint}presets: {', '.join(presets)}"
    else:
        yield from _model_overrides(cfg.model)
    optimizers = list_optimizers()
    if cfg.optim.name not in optimizers:
        close = difflib.get_close_matches(cfg.optim.name, optimizers, n=3)
        yield (
            f"optim.name={shorten(cfg.optim.name)} is not a timm optimizer "
            f"(closest: {', '.join(close) or 'none'}); "
            "this recipe uses 'lamb' for pre-training and 'adamw' for fine-tuning"
        )
    if not cfg.aug.randaug.startswith("rand-"):
        yield (
            f"aug.randaug={shorten(cfg.aug.randaug)} must be a timm RandAugment string like "
            "'rand-m9-mstd0.5-inc1'"
        )
    if not cfg.run.name or "/" in cfg.run.name or cfg.run.name in (".", ".."):
        yield (
            f"run.name={shorten(cfg.run.name)} must be a plain folder name "
            "(the run goes to run.output_dir/run.name)"
        )


def _model_overrides(cfg: ModelSection) -> list[str]:
    taken = sorted({"img_size", "drop_path_rate", "num_classes"} & set(cfg.overrides))
    if taken:
        return [f"model.overrides.{k} duplicates model.{k}; set model.{k} instead" for k in taken]
    try:
        sizes = dict(cfg.overrides, img_size=cfg.img_size, drop_path_rate=cfg.drop_path_rate)
        model_cfg = vit5.preset_config(cfg.name, **sizes)
        if cfg.pretrained is None:  # a checkpoint's own size is checked when it is read
            check_size(
                model_cfg.replace(num_classes=cfg.num_classes or 0), cfg.max_params, "the config"
            )
    except (vit5.ConfigError, TypeError, ValueError) as e:
        return [
            f"model (preset {cfg.name} with img_size={cfg.img_size}, "
            f"overrides={cfg.overrides}): {e}"
        ]
    return []


def _combinations(cfg: TrainConfig) -> Iterator[str]:
    data = cfg.data
    if cfg.aug.mixing and data.batch_size % 2:
        yield (
            f"data.batch_size={data.batch_size} is odd, but timm Mixup/CutMix needs an even batch "
            "per process; use an even batch size or switch mixing off (aug.mixup=0 aug.cutmix=0)"
        )
    threshold = cfg.loss.bce_target_threshold
    smoothing = cfg.loss.smoothing
    if cfg.loss.name == "bce" and smoothing > 0 and threshold is not None and threshold < smoothing:
        yield (
            f"loss.smoothing={smoothing} gives every class a target > "
            f"loss.bce_target_threshold={threshold}, so binarising makes all targets 1; "
            "set loss.smoothing=0 (official) or loss.bce_target_threshold=null"
        )
    if data.dataset == "folder" and data.root is None:
        yield (
            "data.root is not set: pass data.root=/path/to/dataset (holding train/<class>/*.jpg "
            "and val/<class>/*.jpg), or data.dataset=digits for the built-in digits"
        )
    if data.root is not None and data.dataset != "folder":
        reads = {"digits": "the built-in digits", "wds": "data.train_shards / data.val_shards"}
        yield (
            f"data.root={shorten(data.root)[1:-1]} is set, but data.dataset={data.dataset} reads "
            f"{reads[data.dataset]}, not a folder: add data.dataset=folder to train on the folder "
            "(`vit5 train` without --config runs the digits demo), or drop data.root"
        )
    if data.preload and data.dataset != "folder":
        yield (
            f"data.preload=true keeps an image folder's decoded files in memory; data.dataset="
            f"{data.dataset} has none (digits are in memory already, shards stream): "
            "set data.preload=false"
        )
    if data.dataset == "wds" and cfg.aug.repeated_aug != 1:
        yield (
            f"aug.repeated_aug={cfg.aug.repeated_aug}: shards stream every sample once per epoch, "
            "without repeated augmentation; set aug.repeated_aug=1 with data.dataset=wds"
        )
    for key in ("train_shards", "val_shards") if data.dataset == "wds" else ():
        value = getattr(data, key)
        if not value or not isinstance(value, (str, list)):
            yield (
                f"data.{key}={value!r}: data.dataset=wds needs a brace pattern "
                "(/data/train-{000000..000127}.tar), a list of shards or a folder of *.tar"
            )
    if isinstance(cfg.model.compile, str) and cfg.model.compile != "regional":
        yield (
            f"model.compile={cfg.model.compile} is not a choice: use true (torch.compile the whole "
            "model), regional (compile one block, shared by all: faster first step) or false"
        )
    if cfg.model.compile and cfg.model.grad_checkpointing:
        yield "model.compile and model.grad_checkpointing together are not supported; pick one"


# the names in model.lora.targets, and the module of every block they stand for
LORA_TARGETS = {"qkv": r"attn\.qkv", "proj": r"attn\.proj", "fc1": r"mlp\.fc1", "fc2": r"mlp\.fc2"}


def _lora(cfg: LoraSection, pretrained: str | None) -> Iterator[str]:
    if not cfg.enabled:
        return
    unknown = [t for t in cfg.targets if t not in LORA_TARGETS]
    if unknown or not cfg.targets:
        not_these = f"; not {', '.join(unknown)}" if unknown else ""
        yield (
            f"model.lora.targets={list(cfg.targets)}: give a non-empty list of "
            f"{', '.join(LORA_TARGETS)} (the linears of every block{not_these})"
        )
    if pretrained is None:
        yield (
            "model.lora.enabled=true freezes every pretrained weight, but model.pretrained is not "
            "set, so the frozen weights would stay random; set model.pretrained=... or "
            "model.lora.enabled=false"
        )
    if importlib.util.find_spec("peft") is None:
        yield (
            "model.lora.enabled=true needs the peft library, which is not installed: "
            "pip install 'vit5[peft]' (or pip install peft)"
        )


def tracker_names(log_with: str | None) -> list[str]:
    return [name.strip() for name in (log_with or "").split(",") if name.strip()]


def _trackers(log_with: str | None) -> Iterator[str]:
    """Unknown names and trackers whose package is not installed (Accelerate drops them silently)."""
    names = tracker_names(log_with)
    if not names:
        return
    from accelerate.tracking import LOGGER_TYPE_TO_CLASS, get_available_trackers

    known = sorted(LOGGER_TYPE_TO_CLASS)
    available = {str(t) for t in get_available_trackers()}
    for name in names:
        # a tracker whose package is named otherwise
        package = {"comet_ml": "comet-ml"}.get(name, name)
        if name not in LOGGER_TYPE_TO_CLASS:
            hint = _did_you_mean(name, known)
            yield f"run.log_with: {name!r} is not an Accelerate tracker; {hint}trackers: {', '.join(known)}"
        elif name not in available:
            yield (
                f"run.log_with: the {name} tracker needs the {package} package, which is not "
                f"installed: pip install {package}"
            )


# ---------------------------------------------------------------------------------- paths
# model.pretrained=true (YAML true reaches the str field as "True")
PRETRAINED_TRUE = ("true", "True")
_WEIGHT_FILES = (".pth", ".pt", ".bin", ".safetensors", ".ckpt")  # vit5_small_..._224.pth: a path


def pretrained_kind(text: str) -> Literal["true", "hub", "release", "path"]:
    """What ``model.pretrained`` names: the released weights of ``model.name`` (true), a Hub repo,
    released weights by name (no such file here) or a file or folder."""
    if text in PRETRAINED_TRUE:
        return "true"
    if text.startswith(catalog.HF_HUB_PREFIX):
        return "hub"
    path = Path(text).expanduser()
    named = catalog.is_weights_name(text) and path.suffix not in _WEIGHT_FILES
    return "release" if named and not _probe(path.exists) else "path"


def _pretrained(cfg: TrainConfig) -> list[str]:
    """``model.pretrained`` names released weights (``true``: of ``model.name``), ``hf-hub:`` or a
    path (its existence: :func:`check_paths_exist`)."""
    text = cfg.model.pretrained
    kind = None if text is None else pretrained_kind(text)
    released = ", ".join(catalog.RELEASES)
    name = cfg.model.name
    if kind == "true" and name in vit5.list_presets() and catalog.default_release(name) is None:
        return [
            f"model.pretrained=true: {name} has no released weights (released: {released}); "
            "name released weights or give a checkpoint path"
        ]
    if kind == "release" and text not in catalog.RELEASES:
        hint = _did_you_mean(str(text), list(catalog.RELEASES))
        return [
            f"model.pretrained={text} is neither a file nor released weights; {hint}released: {released}"
        ]
    return []


def _path_problems(cfg: TrainConfig) -> Iterator[str]:
    text = cfg.model.pretrained
    if text is not None and pretrained_kind(text) == "path":
        if not _probe(Path(text).expanduser().exists):
            yield (
                f"model.pretrained={shorten(text)[1:-1]} does not exist; check the path, or name "
                f"released weights ({catalog.RELEASED_NAMES}; true: those of model.name) or "
                "hf-hub:USER/REPO"
            )
    if cfg.data.dataset != "folder" or cfg.data.root is None:
        return
    root = Path(cfg.data.root).expanduser()
    if not _probe(root.is_dir):
        yield f"data.root={shorten(cfg.data.root)[1:-1]} does not exist or is not a folder; check the path"
        return
    for key in ("train_split", "val_split"):
        split = getattr(cfg.data, key)
        problem = missing_split(root, split)
        if problem is not None:
            yield f"data.{key}={shorten(split)}: {problem}; fix data.root or data.{key}"


def _probe(test: Callable[[], bool]) -> bool:
    """``Path.exists`` / ``is_dir``, False for a name the OS cannot look up (too long, a NUL byte)."""
    try:
        return test()
    except (OSError, ValueError):
        return False


# ---------------------------------------------------------------------------------- loading
DEMO_RECIPE = "demo_digits"  # what `vit5 train` runs with no --config
_FREE_FORM = {"model.overrides"}  # dict sections whose keys are checked by ViT5Config instead


def recipes() -> dict[str, Path]:
    """The packaged recipes (``vit5/configs/*.yaml``) by name."""
    folder = Path(str(importlib.resources.files("vit5").joinpath("configs")))
    return {p.stem: p for p in sorted(folder.glob("*.yaml"))}


def recipe_path(recipe: str | os.PathLike[str]) -> Path:
    """A recipe by path (an existing file wins) or by packaged name (``vit5_small_in1k[.yaml]``)."""
    path = Path(recipe).expanduser()
    if path.is_file():
        return path
    packaged = recipes()
    name = path.name.removesuffix(".yaml")
    if path.parent == Path(".") and name in packaged:
        return packaged[name]
    hint = f"; packaged recipes (give one by name): {', '.join(packaged)}" if packaged else ""
    if path.parent != Path(".") and path.parent.is_dir():
        nearby = sorted(p.name for p in path.parent.glob("*.yaml"))
        hint = f". Configs in {path.parent}: {nearby}" if nearby else hint
    raise TrainConfigError(f"config file {path} does not exist{hint}")


def load_config(
    path: str | os.PathLike[str] | None = None,
    overrides: Sequence[str] = (),
    *,
    check_paths: bool = True,
) -> TrainConfig:
    """Defaults <- YAML file or packaged recipe ``path`` <- ``overrides`` (``"optim.lr=1e-3"``),
    then validate (``check_paths``: also that ``data.root`` / ``model.pretrained`` exist)."""
    merged = OmegaConf.structured(TrainConfig)
    where = "the command line"
    # `???` in the file: the user must give these on the command line (merging `???` keeps the default)
    required: set[str] = set()
    if path is not None:
        path = recipe_path(path)
        where = str(path)
        loaded = _read_yaml(path)
        required = set(OmegaConf.missing_keys(loaded))
        merged = _merge(merged, loaded, where=where)
    given = {item.partition("=")[0].strip() for item in overrides}
    for item in overrides:
        merged = _merge(merged, _parse_override(item), where=f"command line '{item}'")
    if merged.data.dataset == "wds":
        required.discard("data.root")  # shards are named by data.train_shards / data.val_shards
    missing = sorted(required - given)
    if missing:
        example = " ".join(f"{k}=..." for k in missing)
        raise TrainConfigError(
            f"{path}: required setting(s) {', '.join(missing)} not given; add {example}"
        )
    _fit_warmup(merged, given=given)
    cfg = _to_config(merged, where=where)
    if check_paths:
        check_paths_exist(cfg)
    return cfg


class ConfigAdjusted(UserWarning):
    """A recipe's setting was adapted to what was given on the command line (the message says how)."""


# of the run: a recipe's warmup that does not fit a shorter run (the demo's 1 of 10)
SHORT_RUN_WARMUP = 0.1


def _fit_warmup(merged: DictConfig, given: set[str]) -> None:
    """A recipe's warmup as long as the run or longer becomes a tenth of the run (a
    :class:`ConfigAdjusted` warning); a warmup given on the command line is checked, never changed."""
    schedule = merged.schedule
    if "schedule.warmup_epochs" in given or not 0 < schedule.epochs <= schedule.warmup_epochs:
        return
    warmup = SHORT_RUN_WARMUP * schedule.epochs
    warnings.warn(
        f"schedule.warmup_epochs={schedule.warmup_epochs:g} of the recipe does not fit "
        f"schedule.epochs={schedule.epochs}: warming up for {warmup:g} epochs (a tenth of the "
        "run); set schedule.warmup_epochs to choose",
        ConfigAdjusted,
        stacklevel=3,
    )
    schedule.warmup_epochs = warmup


def config_from_dict(values: Mapping[str, Any], where: str) -> TrainConfig:
    """A config from its ``dataclasses.asdict`` form (as in a checkpoint), validated without paths;
    errors name ``where`` the values came from."""
    if not isinstance(values, Mapping):
        raise TrainConfigError(f"{where}: expected a mapping of sections")
    merged = _merge(OmegaConf.structured(TrainConfig), OmegaConf.create(dict(values)), where=where)
    return _to_config(merged, where)


def _to_config(merged: DictConfig, where: str) -> TrainConfig:
    """The typed config; settings read from ``${oc.env:VAR}`` keep their text (:func:`config_record`)."""
    raw = _flatten(typing.cast(dict, OmegaConf.to_container(merged, resolve=False)))
    try:
        cfg = typing.cast(TrainConfig, OmegaConf.to_object(merged))
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None) or "a setting"
        raise TrainConfigError(f"{where}: cannot resolve {key}: {_reason(e)}") from e
    # not a setting: asdict and OmegaConf never see it; copy.copy(cfg) keeps it
    cfg.__dict__["_from_env"] = {
        k: v for k, v in raw.items() if isinstance(v, str) and "${oc.env:" in v
    }
    return cfg


def _read_yaml(path: Path) -> DictConfig:
    try:
        loaded = OmegaConf.load(path)
    except Exception as e:  # yaml.YAMLError and friends; keep the parser's line/column message
        raise TrainConfigError(f"{path} is not valid YAML: {e}") from e
    if not isinstance(loaded, DictConfig):
        raise TrainConfigError(
            f"{path} must hold a mapping of sections (model:, data:, ...), not a list"
        )
    return loaded


def _parse_override(item: str) -> DictConfig:
    key, sep, _ = item.partition("=")
    text = shorten(item)
    if not sep or not key.strip():
        raise TrainConfigError(
            f"command-line argument {text} is not a key=value override; write e.g. optim.lr=1e-3 "
            "or data.root=/path/to/imagenet"
        )
    control = next((c for c in item if unicodedata.category(c) == "Cc"), None)
    if control is not None:
        raise TrainConfigError(
            f"command-line argument {text} holds the control character {control!r} at position "
            f"{item.index(control)}; retype it without (a setting is printable text)"
        )
    if key.startswith("-"):
        raise TrainConfigError(
            f"unknown option {shorten(key)}; options are --config FILE and --resume [DIR]"
        )
    try:
        return OmegaConf.from_dotlist([item])
    except OmegaConfBaseException as e:
        raise TrainConfigError(f"cannot parse override {text}: {_reason(e)}") from e


def _merge(base: DictConfig, update: DictConfig, where: str) -> DictConfig:
    _check_keys(OmegaConf.to_container(update), TrainConfig, prefix="", where=where)
    try:
        return typing.cast(DictConfig, OmegaConf.merge(base, update))
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None)
        if not key:
            raise TrainConfigError(f"{where}: bad value: {_reason(e)}") from e
        expected = _schema(key)
        expected = expected.__name__ if isinstance(expected, type) else str(expected)
        raise TrainConfigError(
            f"{where}: bad value for {key}: {_reason(e)} (expected {expected.replace('typing.', '')})"
        ) from e


def _reason(e: OmegaConfBaseException) -> str:
    return shorten(str(getattr(e, "msg", None) or e).splitlines()[0], 300)[1:-1]


def _check_keys(node: Any, schema: type, prefix: str, where: str) -> None:
    """Unknown keys and values given for a whole section, named with the fix."""
    section = prefix.rstrip(".")
    if not isinstance(node, Mapping):
        fix = f"{section} is a section; give it keys, e.g. {prefix}KEY=VALUE"
        raise TrainConfigError(f"{where}: {fix if prefix else 'expected a mapping of sections'}")
    hints = typing.get_type_hints(schema)
    for key, value in node.items():
        full = f"{prefix}{key}"
        if key not in hints:
            close = difflib.get_close_matches(str(key), sorted(hints), n=1, cutoff=0.5)
            hint = f"Did you mean {prefix}{close[0]}? " if close else ""
            raise TrainConfigError(
                f"{where}: {shorten(full)[1:-1]} is not a setting. {hint}Valid keys "
                f"in {section or 'the top level'}: {', '.join(sorted(hints))}."
            )
        if dataclasses.is_dataclass(hints[key]) and full not in _FREE_FORM:
            _check_keys(value, typing.cast(type, hints[key]), prefix=f"{full}.", where=where)


def _schema(full_key: str) -> Any:
    """The type of setting ``full_key`` (inside a free-form dict: the dict's type)."""
    hint: Any = TrainConfig
    for part in full_key.split("."):
        hint = typing.get_type_hints(hint).get(part) if dataclasses.is_dataclass(hint) else hint
    return hint if hint is not None else "see vit5/train/config.py"


# ---------------------------------------------------------------------------------- records
def config_record(cfg: TrainConfig) -> dict[str, Any]:
    """``dataclasses.asdict(cfg)`` for files, a setting read from the environment as its
    ``${oc.env:VAR}`` text (a secret passed that way is never written; ``--resume`` resolves it
    again)."""
    record = dataclasses.asdict(cfg)
    for key, text in cfg.__dict__.get("_from_env", {}).items():
        section, _, last = key.rpartition(".")
        node = record
        for part in section.split("."):
            node = node[part]
        node[last] = text
    return record


def config_to_yaml(cfg: TrainConfig) -> str:
    """Every setting as YAML, loadable by :func:`load_config` (as :func:`config_record`)."""
    return OmegaConf.to_yaml(OmegaConf.create(config_record(cfg)))


def config_diff(old: TrainConfig, new: TrainConfig) -> list[str]:
    """``"section.key: old -> new"`` for every setting that differs (``data.class_names=null`` in
    ``new`` means "the data's": no change)."""
    flat_old = flatten_config(old)
    flat_new = flatten_config(new)
    return [
        f"{k}: {shorten(flat_old.get(k))} -> {shorten(flat_new.get(k))}"
        for k in sorted(flat_new)
        if flat_old.get(k) != flat_new[k] and not (k == "data.class_names" and flat_new[k] is None)
    ]


def flatten_config(cfg: TrainConfig) -> dict[str, Any]:
    """Every setting as ``{"section.key": value}`` (``model.overrides`` kept as one dict)."""
    return _flatten(dataclasses.asdict(cfg))


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping) and f"{prefix}{key}" not in _FREE_FORM:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat

"""Data sets and loaders of a run on :mod:`vit5.data`. Train: a seeded, rank-aware ``RepeatAugSampler`` (not
prepared by Accelerate) whose order depends on seed and epoch only, so :func:`start_epoch` resumes on any
number of processes. Val: prepared by Accelerate. WebDataset shards split by process and worker themselves
and pad validation with label ``-1``."""

from __future__ import annotations

import copy
import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, Dataset, IterableDataset

from vit5.data import (
    DigitsDataset,
    ImageFolderDataset,
    RepeatAugSampler,
    ShardDataset,
    batch_augment,
    build_loader,
    build_transform,
    class_names_change,
    eval_transform,
    ignore_stop_signals,
    shard_loader,
)
from vit5.errors import name_list
from vit5.runtime import fit_workers
from vit5.train.checkpointing import checkpoint_config
from vit5.train.config import TrainConfig
from vit5.train.errors import ResumeError, TrainConfigError


@dataclass
class RunData:
    train_set: Dataset
    val_set: Dataset
    train_loader: DataLoader
    val_loader: DataLoader
    notes: list[str] = dataclasses.field(default_factory=list)  # settings adapted to the machine


def build_datasets(
    cfg: TrainConfig, accelerator: Accelerator | None = None
) -> tuple[Dataset, Dataset, list[str]]:
    """Train and val sets with their transforms, and the class names (train's order); shard streams
    (``data.dataset=wds``) are this ``accelerator`` process's."""
    size = cfg.model.img_size
    if cfg.data.dataset == "wds":
        train_set, val_set = _shard_datasets(cfg, accelerator or Accelerator())
        return train_set, val_set, list(train_set.class_names)
    train_tf = build_transform(cfg.aug.train, size, **_train_options(cfg))
    val_tf = eval_transform(size, crop_ratio=cfg.aug.eval_crop_ratio)
    if cfg.data.dataset == "digits":
        options: dict[str, Any] = dict(size=size, val_fraction=cfg.data.digits_val_fraction)
        train_set: Any = DigitsDataset("train", train_tf, **options)
        val_set: Any = DigitsDataset("val", val_tf, **options)
    else:
        root = Path(str(cfg.data.root)).expanduser()
        train_set = ImageFolderDataset(root, cfg.data.train_split, train_tf)
        val_set = ImageFolderDataset(
            root, cfg.data.val_split, val_tf, class_names=train_set.class_names
        )
        if cfg.data.verify or cfg.data.preload:
            show = cfg.run.progress and (accelerator is None or accelerator.is_main_process)
            train_set.verify(keep=cfg.data.preload, progress=show)
            val_set.verify(keep=cfg.data.preload, progress=show)
    return train_set, val_set, list(train_set.class_names)


def build_run_data(
    cfg: TrainConfig, accelerator: Accelerator, train_set: Dataset, val_set: Dataset
) -> RunData:
    """This process's loaders of the run's data sets."""
    if isinstance(train_set, ShardDataset):
        return _shard_run_data(cfg, accelerator, train_set, val_set)
    # a stream that batches itself (the register study's canvases), placed by set_epoch
    if isinstance(train_set, IterableDataset):
        return RunData(
            train_set=train_set,
            val_set=val_set,
            train_loader=DataLoader(train_set, batch_size=None),
            val_loader=DataLoader(val_set, batch_size=None),
        )
    world = accelerator.num_processes
    rank = accelerator.process_index
    try:
        sampler = RepeatAugSampler(
            train_set,
            num_replicas=world,
            rank=rank,
            num_repeats=cfg.aug.repeated_aug,
            shuffle=True,
            seed=cfg.run.seed,
            selected_round=cfg.aug.ra_selected_round,
            seeded=True,
        )
    except ValueError as e:
        raise TrainConfigError(f"{e} (config: aug.ra_selected_round=0)") from e
    workers, note = fit_workers(cfg.data.num_workers, "data.num_workers")
    common = dict(
        num_workers=workers,
        pin_memory=cfg.data.pin_memory,
        persistent_workers=cfg.data.persistent_workers and workers > 0,
    )
    size = cfg.model.img_size
    # preloaded images of the model's size: augmented as batches (vit5.data.batched), else per sample
    train_loader = build_loader(
        train_set,
        cfg.data.batch_size,
        train=True,
        seed=cfg.run.seed + 1000 * rank,
        sampler=sampler,
        seeded=True,
        worker_init_fn=ignore_stop_signals,
        augment=batch_augment(cfg.aug.train, size, **_train_options(cfg)),
        **common,
    )
    eval_batch = cfg.data.eval_batch_size or max(1, int(1.5 * cfg.data.batch_size))
    val_aug = batch_augment("eval", size, crop_ratio=cfg.aug.eval_crop_ratio)
    # Accelerate's prepare shards a DataLoader and leaves a BatchLoader (sharded by rank) as it is
    val_loader = accelerator.prepare(
        build_loader(
            val_set, eval_batch, False, augment=val_aug, num_replicas=world, rank=rank, **common
        )
    )
    return RunData(train_set, val_set, train_loader, val_loader, [note] if note else [])


def record_class_names(
    cfg: TrainConfig, class_names: list[str], resume: Path | None
) -> TrainConfig:
    """``cfg`` with ``data.class_names`` set to the data's classes; another list than the one recorded
    (``data.class_names``, or the checkpoint's: ResumeError) would mislabel the outputs, and one class
    gives a meaningless 100% top-1: both refused."""
    if len(class_names) < 2:
        where = f"data.root={cfg.data.root}" if cfg.data.dataset == "folder" else cfg.data.dataset
        raise TrainConfigError(
            f"{where} has {len(class_names)} class ({name_list(class_names)}): a classifier needs at least "
            f"2 (one class gives 100% top-1 whatever it learns); add a folder per class under "
            f"{cfg.data.train_split}/ and {cfg.data.val_split}/"
        )
    if resume is not None:  # what the checkpoint was trained on
        trained_on = (checkpoint_config(resume).get("data") or {}).get("class_names")
        if trained_on is not None and list(trained_on) != list(class_names):
            raise ResumeError(
                f"--resume: {resume} was trained on {len(trained_on)} classes ({name_list(trained_on)}) but "
                f"the data now has {len(class_names)} ({name_list(class_names)}); "
                f"{class_names_change(trained_on, class_names)}. Output i would be trained as another "
                "class: restore the class folders as they were, or start a new run from the weights "
                "(model.pretrained=RUN/final; a new head is trained for the new classes)"
            )
    recorded = cfg.data.class_names
    if recorded is None:
        cfg = copy.copy(cfg)  # with what config_record knows of settings read from the environment
        cfg.data = dataclasses.replace(cfg.data, class_names=list(class_names))
        return cfg
    if list(recorded) == list(class_names):
        return cfg
    change = class_names_change(recorded, class_names)
    old = f"{len(recorded)} classes ({name_list(recorded)})"
    new = f"{len(class_names)} ({name_list(class_names)})"
    raise TrainConfigError(
        f"data.class_names lists {old} but the data has {new}; {change}. Remove data.class_names "
        "(null: the data's class folders) or fix the folders"
    )


def _shard_datasets(
    cfg: TrainConfig, accelerator: Accelerator
) -> tuple[ShardDataset, ShardDataset]:
    size = cfg.model.img_size
    data = cfg.data
    common: dict[str, Any] = dict(
        num_replicas=accelerator.num_processes,
        rank=accelerator.process_index,
        num_workers=data.num_workers,
        seed=cfg.run.seed,
    )
    train_set = ShardDataset(
        data.train_shards,
        build_transform(cfg.aug.train, size, **_train_options(cfg)),
        batch_size=data.batch_size,
        train=True,
        shuffle_buffer=data.shuffle_buffer,
        num_classes=data.num_classes,
        **common,
    )
    val_set = ShardDataset(
        data.val_shards,
        eval_transform(size, crop_ratio=cfg.aug.eval_crop_ratio),
        batch_size=data.eval_batch_size or max(1, int(1.5 * data.batch_size)),
        train=False,
        class_names=train_set.class_names,
        **common,
    )
    return train_set, val_set


def _shard_run_data(
    cfg: TrainConfig, accelerator: Accelerator, train_set: Dataset, val_set: Dataset
) -> RunData:
    data = cfg.data
    mine = (accelerator.num_processes, accelerator.process_index, data.num_workers)
    given = [
        (d.num_replicas, d.rank, d.num_workers)
        for d in (train_set, val_set)
        if isinstance(d, ShardDataset)
    ]
    if given != [mine, mine] or train_set.batch_size != data.batch_size:  # type: ignore[attr-defined]
        raise TrainConfigError(
            "given shard data sets must both be ShardDatasets built for this process (num_replicas="
            f"{mine[0]}, rank={mine[1]}, num_workers=data.num_workers={mine[2]}; the train set's "
            f"batch_size=data.batch_size={data.batch_size})"
        )
    options = dict(pin_memory=data.pin_memory, persistent_workers=data.persistent_workers)
    loaders = [shard_loader(d, **options) for d in (train_set, val_set)]  # type: ignore[arg-type]
    return RunData(train_set, val_set, *loaders)


def start_epoch(loader: DataLoader, epoch: int, consumed: int) -> None:
    """Position the training data at ``epoch`` after its first ``consumed`` samples (all processes):
    through ``set_epoch(epoch, consumed=...)`` of the loader's sampler, or of its iterable data set."""
    source = loader.sampler if hasattr(loader.sampler, "set_epoch") else loader.dataset
    source.set_epoch(epoch, consumed=consumed)


def num_images(dataset: Dataset) -> int:
    """Samples in a data set (a shard data set's length counts batches)."""
    return int(getattr(dataset, "num_samples", None) or len(dataset))  # type: ignore[arg-type]


def bad_files(accelerator: Accelerator, *datasets: Dataset) -> list[str]:
    """Files found unreadable so far by any process (each file once). Collective: call on all ranks."""
    found: list[str] = []
    for dataset in datasets:
        mask = getattr(dataset, "bad_mask", None)
        if mask is None:
            continue
        union = accelerator.reduce(mask.to(accelerator.device, torch.int32), "sum") > 0
        found.extend(dataset.sample_name(i) for i in torch.nonzero(union.cpu()).flatten().tolist())  # type: ignore[attr-defined]
    return found


def _train_options(cfg: TrainConfig) -> dict[str, Any]:
    aug = cfg.aug
    crop = dict(scale=tuple(aug.scale), ratio=tuple(aug.ratio), hflip=aug.hflip)
    return {
        "three_augment": dict(color_jitter=aug.color_jitter, **crop),
        "randaug": dict(policy=aug.randaug, **crop),
        "rrc": dict(erasing=aug.erasing, **crop),
        "pad_crop": dict(padding=aug.padding, hflip=aug.hflip, erasing=aug.erasing),
    }.get(aug.train, {})

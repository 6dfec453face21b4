"""Data sets and loaders for a run, built from the config on top of :mod:`vit5.data`.

Sharding across processes:

* train: a rank-aware :class:`~vit5.data.RepeatAugSampler` (DeiT's RASampler; ``repeated_aug=1``
  is a plain distributed shuffle). All ranks share the seed, so they agree on the permutation
  and take disjoint strides of it; the loader is not passed to ``accelerator.prepare`` (which
  would shard it a second time).
* resume: an epoch is a global sample sequence that depends on the seed and the epoch only; the
  training state records how many of its samples all processes together have trained
  (``TrainState.epoch_samples``), and :func:`start_epoch` hands ``(epoch, consumed)`` to the data
  source, which skips that prefix and splits the rest over the current processes (exact for any
  number of processes). Each sample's augmentation draws from its own seed
  (:class:`~vit5.data.SeededSamples`), so workers and world size do not change it either. Another
  data source (e.g. sharded streams) plugs in by implementing ``set_epoch(epoch, consumed=...)``
  on the loader's sampler or data set.
* val: ``accelerator.prepare`` shards it and pads the last batches;
  :func:`vit5.train.evaluate.evaluate` drops the padding with ``gather_for_metrics``, so the
  counts are exact (the distributed evaluation of :mod:`vit5.eval.classify`).
* WebDataset shards (``data.dataset=wds``): each process's :class:`~vit5.data.ShardDataset`
  splits the epoch's samples by process and loader worker itself (see :mod:`vit5.data.shards`);
  neither loader is prepared; validation pads with label ``-1``, which ``evaluate`` leaves out.

Where an epoch starts (:func:`start_epoch`): the epoch and the number of its samples that all
processes together already consumed; the sampler or the shards skip those.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from accelerate import Accelerator
from torch.utils.data import DataLoader, Dataset

from vit5.data import (
    DigitsDataset,
    ImageFolderDataset,
    RepeatAugSampler,
    ShardDataset,
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
from vit5.train.config import TrainConfig, replace_sections
from vit5.train.errors import ResumeError, TrainConfigError


@dataclass
class RunData:
    train_set: Dataset
    val_set: Dataset
    class_names: list[str]
    train_loader: DataLoader
    val_loader: DataLoader
    notes: list[str] = dataclasses.field(default_factory=list)  # settings adapted to the machine


def build_datasets(cfg: TrainConfig) -> tuple[Dataset, Dataset, list[str]]:
    """Train and val sets with their transforms, and the class names (train's order)."""
    size = cfg.model.img_size
    train_tf = build_transform(cfg.aug.train, size, **_train_options(cfg))
    val_tf = eval_transform(size, crop_ratio=cfg.aug.eval_crop_ratio)
    if cfg.data.dataset == "digits":
        options: dict[str, Any] = dict(size=size, val_fraction=cfg.data.digits_val_fraction)
        train_set: Any = DigitsDataset("train", train_tf, **options)
        val_set: Any = DigitsDataset("val", val_tf, **options)
    else:
        root = Path(str(cfg.data.root)).expanduser()
        train_set = ImageFolderDataset(root, cfg.data.train_split, train_tf)
        val_set = ImageFolderDataset(root, cfg.data.val_split, val_tf, class_names=train_set.class_names)
        if cfg.data.verify:
            train_set.verify()
            val_set.verify()
    return train_set, val_set, list(train_set.class_names)


def build_run_data(
    cfg: TrainConfig,
    accelerator: Accelerator,
    train_set: Dataset | None = None,
    val_set: Dataset | None = None,
) -> RunData:
    """Datasets (from the config unless given) and this process's loaders."""
    class_names: list[str]
    if isinstance(train_set, ShardDataset) or (train_set is None and cfg.data.dataset == "wds"):
        return _shard_run_data(cfg, accelerator, train_set, val_set)
    if train_set is None or val_set is None:
        train_set, val_set, class_names = build_datasets(cfg)
    else:
        class_names = list(train_set.class_names)  # type: ignore[attr-defined]
    world, rank = accelerator.num_processes, accelerator.process_index
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
    train_loader = build_loader(
        train_set,
        cfg.data.batch_size,
        train=True,
        seed=cfg.run.seed + 1000 * rank,
        sampler=sampler,
        seeded=True,
        worker_init_fn=ignore_stop_signals,
        **common,
    )
    if len(train_loader) < cfg.optim.accum_steps:
        raise TrainConfigError(
            f"each process gets {len(train_loader)} full batches of data.batch_size={cfg.data.batch_size} "
            f"per epoch ({len(sampler)} samples), fewer than optim.accum_steps={cfg.optim.accum_steps}; "
            f"lower data.batch_size"
        )
    eval_batch = cfg.data.eval_batch_size or max(1, int(1.5 * cfg.data.batch_size))
    val_loader = accelerator.prepare(build_loader(val_set, eval_batch, train=False, **common))
    return RunData(train_set, val_set, class_names, train_loader, val_loader, [note] if note else [])


def record_class_names(cfg: TrainConfig, class_names: list[str], resume: Path | None) -> TrainConfig:
    """``cfg`` with ``data.class_names`` set to the data's classes, checked against the ones recorded.

    A run records its classes when it starts (config.yaml, every checkpoint, ``label_names`` of the
    saved models); a different list later would silently permute or mislabel the outputs, so it is
    refused naming both, as is a data set of one class (every prediction is right: 100% top-1 that
    means nothing).

    Raises:
        ResumeError: resuming ``resume`` (a checkpoint) on data whose classes differ from its own.
        TrainConfigError: ``data.class_names`` set and different from the data's, or one class.
    """
    if len(class_names) < 2:
        where = f"data.root={cfg.data.root}" if cfg.data.dataset == "folder" else cfg.data.dataset
        raise TrainConfigError(
            f"{where} has {len(class_names)} class ({name_list(class_names)}): a classifier needs at least "
            f"2 (one class gives 100% top-1 whatever it learns); add a folder per class under "
            f"{cfg.data.train_split}/ and {cfg.data.val_split}/"
        )
    if resume is not None:  # what the checkpoint was trained on (older checkpoints record nothing)
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
        return replace_sections(cfg, data=dataclasses.replace(cfg.data, class_names=list(class_names)))
    if list(recorded) == list(class_names):
        return cfg
    change = class_names_change(recorded, class_names)
    old = f"{len(recorded)} classes ({name_list(recorded)})"
    new = f"{len(class_names)} ({name_list(class_names)})"
    raise TrainConfigError(
        f"data.class_names lists {old} but the data has {new}; {change}. Remove data.class_names "
        "(null: the data's class folders) or fix the folders"
    )


def build_shard_datasets(cfg: TrainConfig, accelerator: Accelerator) -> tuple[ShardDataset, ShardDataset]:
    """The train and val shard streams of this process (``data.dataset=wds``), with their transforms."""
    size, data = cfg.model.img_size, cfg.data
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
    cfg: TrainConfig, accelerator: Accelerator, train_set: Dataset | None, val_set: Dataset | None
) -> RunData:
    data = cfg.data
    common: dict[str, Any] = dict(
        num_replicas=accelerator.num_processes,
        rank=accelerator.process_index,
        num_workers=data.num_workers,
    )
    if train_set is None or val_set is None:
        train_set, val_set = build_shard_datasets(cfg, accelerator)
    for dataset in (train_set, val_set):
        if not isinstance(dataset, ShardDataset) or (
            dataset.num_replicas,
            dataset.rank,
            dataset.num_workers,
        ) != (common["num_replicas"], common["rank"], common["num_workers"]):
            raise TrainConfigError(
                "given shard data sets must both be ShardDatasets built for this process "
                f"(num_replicas={common['num_replicas']}, rank={common['rank']}, "
                f"num_workers=data.num_workers={common['num_workers']})"
            )
    if train_set.batch_size != data.batch_size:  # type: ignore[attr-defined]
        raise TrainConfigError(
            f"the given ShardDataset's batch_size differs from data.batch_size={data.batch_size}"
        )
    if len(train_set) < cfg.optim.accum_steps:  # type: ignore[arg-type]
        raise TrainConfigError(
            f"each process gets {len(train_set)} batches of data.batch_size={data.batch_size} per epoch, "  # type: ignore[arg-type]
            f"fewer than optim.accum_steps={cfg.optim.accum_steps}; lower data.batch_size"
        )
    options = dict(pin_memory=data.pin_memory, persistent_workers=data.persistent_workers)
    return RunData(
        train_set,
        val_set,
        list(train_set.class_names),  # type: ignore[attr-defined]
        shard_loader(train_set, **options),  # type: ignore[arg-type]
        shard_loader(val_set, **options),  # type: ignore[arg-type]
    )


def start_epoch(loader: DataLoader, epoch: int, consumed: int) -> None:
    """Position the training data at epoch ``epoch`` after its first ``consumed`` samples (counted over
    all processes): the resume hook of the data pipeline. The loader's sampler (or, for an iterable
    data set without one, the data set) must implement ``set_epoch(epoch, consumed=...)``."""
    source = loader.sampler if hasattr(loader.sampler, "set_epoch") else loader.dataset
    if not hasattr(source, "set_epoch"):
        raise TypeError(f"{type(source).__name__} has no set_epoch(epoch, consumed=...): it cannot resume")
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
    if aug.train == "three_augment":
        return dict(color_jitter=aug.color_jitter, scale=tuple(aug.scale), hflip=aug.hflip)
    if aug.train == "randaug":
        return dict(policy=aug.randaug, scale=tuple(aug.scale), hflip=aug.hflip)
    if aug.train == "pad_crop":
        return dict(padding=aug.padding, hflip=aug.hflip, erasing=aug.erasing)
    return {}

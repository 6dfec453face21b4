"""A DataLoader with reproducible, resumable order (for training an epoch-seeded
:class:`~vit5.data.sampler.RepeatAugSampler`: call ``loader.sampler.set_epoch(epoch)``) and augmentation
following the loader seed.
A mid-epoch resume draws the same augmentations only with ``seeded=True`` (per-sample seeds).
"""

from __future__ import annotations

import signal
from collections.abc import Callable
from typing import Any

import torch
from torch.utils.data import DataLoader, Dataset, Sampler

from vit5.data.sampler import RepeatAugSampler, SeededSamples

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)


def ignore_stop_signals(worker_id: int) -> None:
    """A ``worker_init_fn``: the worker ignores ``STOP_SIGNALS``, left to the main process (a Ctrl-C or a
    scheduler's SIGTERM to the group would kill workers while the main process checkpoints); such workers
    exit when the main process shuts them down or dies."""
    for signum in STOP_SIGNALS:
        signal.signal(signum, signal.SIG_IGN)


def build_loader(
    dataset: Dataset,
    batch_size: int,
    train: bool,
    num_workers: int = 0,
    seed: int = 0,
    sampler: Sampler[int] | None = None,
    *,
    pin_memory: bool | None = None,
    persistent_workers: bool | None = None,
    drop_last: bool | None = None,
    collate_fn: Callable[[list[Any]], Any] | None = None,
    seeded: bool = False,
    worker_init_fn: Callable[[int], None] | None = None,
) -> DataLoader:
    """A DataLoader for ``dataset``; ``train`` shuffles (when ``sampler`` is None) and drops the last
    incomplete batch by default (timm ``Mixup`` needs full, even batches).

    ``seed`` seeds the default sampler and the loader generator (worker seeds); ``sampler`` (e.g. a
    rank-aware ``RepeatAugSampler``, whose loader must not go through ``accelerator.prepare``) replaces the
    default; ``pin_memory`` defaults to CUDA being there; ``seeded`` wraps ``dataset`` in
    :class:`~vit5.data.sampler.SeededSamples` (a given sampler must then be built ``seeded=True``).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be >= 1, got {batch_size}")
    if num_workers < 0:
        raise ValueError(f"num_workers must be >= 0, got {num_workers}")
    if persistent_workers and num_workers == 0:
        raise ValueError("persistent_workers=True needs num_workers > 0")
    if sampler is None and train:
        sampler = RepeatAugSampler(
            dataset, num_repeats=1, shuffle=True, seed=seed, selected_round=0, seeded=seeded
        )
    if seeded:
        if not getattr(sampler, "seeded", False):
            raise ValueError("seeded=True needs a RepeatAugSampler(..., seeded=True) (or sampler=None)")
        dataset = SeededSamples(dataset)
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=num_workers,
        collate_fn=collate_fn,
        pin_memory=torch.cuda.is_available() if pin_memory is None else pin_memory,
        drop_last=train if drop_last is None else drop_last,
        persistent_workers=num_workers > 0 if persistent_workers is None else persistent_workers,
        generator=torch.Generator().manual_seed(seed),
        worker_init_fn=worker_init_fn,
    )

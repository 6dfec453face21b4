"""A DataLoader with reproducible, resumable order and sensible defaults.

Order: training loaders default to an epoch-seeded :class:`~vit5.data.sampler.RepeatAugSampler`
with one repeat (a plain shuffle); call ``loader.sampler.set_epoch(epoch)`` every epoch and
``set_epoch(epoch, start_index=k * batch_size)`` to resume after ``k`` batches. With workers,
augmentation randomness follows the loader ``generator`` (seeded with ``seed``) through the worker
seeds, so a run repeats exactly from its start (for the same ``num_workers``); with
``num_workers=0`` it follows the global torch seed. A mid-epoch resume keeps the sample order but
draws new augmentations (workers restart with new streams) unless the sampler is ``seeded`` and the
data set wrapped in :class:`~vit5.data.sampler.SeededSamples` (``seeded=True`` here does both):
then every sample draws from its own seed, the same with any number of workers or processes.

Signals: ``worker_init_fn=ignore_stop_signals`` leaves SIGINT, SIGTERM and SIGUSR1 to the main
process (a Ctrl-C or a scheduler's SIGTERM to the process group would otherwise kill the workers
while the main process finishes its step and checkpoints). Such workers exit when the main process
shuts them down (the end of the loader's iterator; for persistent workers, the owner's job, as
:meth:`vit5.train.Trainer.close` does) or dies, but not on ``terminate()``: multiprocessing's
exit-time clean-up would wait for persistent workers left running.

The default (``sampler=None``) loader is single-process and may go through
``accelerator.prepare``; a loader built with a rank-aware sampler must not (see
:mod:`vit5.data.sampler`).
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
    """A ``worker_init_fn``: the worker ignores the signals the main process handles (``STOP_SIGNALS``)."""
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
    """Build a DataLoader for ``dataset``.

    Args:
        train: shuffle (when ``sampler`` is None) and, by default, drop the last incomplete batch
            (timm ``Mixup`` needs full, even batches).
        num_workers: worker processes; each runs OpenCV single-threaded to avoid oversubscription.
        seed: seeds the default sampler's shuffle and the loader generator (worker seeds).
        sampler: e.g. a rank-aware ``RepeatAugSampler``; None gives a seeded shuffle for training
            and sequential order for evaluation.
        pin_memory: default True when CUDA is available.
        persistent_workers: default ``num_workers > 0``.
        drop_last: default ``train``.
        seeded: per-sample augmentation seeds (see the module docstring); the default sampler is
            then built seeded, a given one must be a ``RepeatAugSampler(..., seeded=True)``.
        worker_init_fn: run in each worker at its start (e.g. :func:`ignore_stop_signals`).
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

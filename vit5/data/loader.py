"""Reproducible, resumable loading: the repeated-augmentation sampler (DeiT ``RASampler``; ViT-5 pre-training
uses ``--repeated-aug``, official ``main.py:112-114`` at github.com/wangf3014/ViT-5 commit b7b0796; with
``seed=0`` DeiT's ``samplers.py`` order), per-sample augmentation seeds, and the DataLoader around them."""

from __future__ import annotations

import math
import random
import signal
from collections.abc import Callable, Iterator, Sized
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
from torch.utils.data import DataLoader, Dataset, Sampler

if TYPE_CHECKING:
    from vit5.data.batched import BatchAugment, BatchLoader

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGUSR1)


def sample_seed(seed: int, epoch: int, position: int) -> int:
    """The 63-bit augmentation seed of global position ``position`` of epoch ``epoch``."""
    return int(np.random.SeedSequence([seed, epoch, position]).generate_state(1, np.uint64)[0]) >> 1


class RepeatAugSampler(Sampler[Any]):
    """Shuffle (seed + epoch), repeat each index ``num_repeats`` times, give rank ``r`` of ``W`` the global
    positions ``r, r + W, ...``: ``floor(N / selected_round) * selected_round / W`` of them as DeiT
    (``ceil(N / W)`` when ``selected_round=0`` or ``num_repeats=1``). Shards by ``rank`` itself: not for
    ``accelerator.prepare``. ``seeded=True`` yields ``(index, seed)`` pairs for :class:`SeededSamples`."""

    def __init__(
        self,
        data_source: Sized | int,
        *,
        num_replicas: int = 1,
        rank: int = 0,
        num_repeats: int = 3,
        shuffle: bool = True,
        seed: int = 0,
        selected_round: int = 256,
        seeded: bool = False,
    ) -> None:
        length = data_source if isinstance(data_source, int) else len(data_source)
        if length <= 0:
            raise ValueError("RepeatAugSampler needs a non-empty data set")
        if num_replicas < 1 or not 0 <= rank < num_replicas:
            raise ValueError(f"need 0 <= rank < num_replicas; got {num_replicas=} {rank=}")
        if num_repeats < 1:
            raise ValueError(f"num_repeats must be >= 1, got {num_repeats}")
        if selected_round < 0:
            raise ValueError(
                f"selected_round must be >= 0 (0 disables rounding), got {selected_round}",
            )
        self.length = length
        self.num_replicas = num_replicas
        self.rank = rank
        self.num_repeats = num_repeats
        self.shuffle = shuffle
        self.seed = seed
        self.seeded = seeded
        if selected_round and num_repeats > 1:
            self.num_selected = length // selected_round * selected_round // num_replicas
        else:
            self.num_selected = math.ceil(length / num_replicas)
        if self.num_selected == 0:
            raise ValueError(
                f"a data set of {length} samples over {num_replicas} process(es) with "
                f"selected_round={selected_round} yields 0 samples per epoch; "
                "pass selected_round=0 for small data sets"
            )
        self.epoch = self.consumed = 0

    @property
    def epoch_size(self) -> int:
        """Global positions of an epoch at this world size (all ranks together)."""
        return self.num_selected * self.num_replicas

    def set_epoch(self, epoch: int, *, consumed: int = 0) -> None:
        """Select the epoch and skip its first ``consumed`` global positions (trained by all processes
        together): exact on any world size."""
        if consumed < 0:
            raise ValueError(f"consumed must be >= 0, got {consumed}")
        self.epoch = epoch
        self.consumed = consumed

    def positions(self) -> range:
        """The global positions this rank still takes in the epoch, in order."""
        first = self.consumed + self.rank
        return range(first, first + len(self) * self.num_replicas, self.num_replicas)

    def indices(self) -> list[int]:
        """The sample indices at :meth:`positions`, without seeds."""
        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        if self.shuffle:
            order = torch.randperm(self.length, generator=generator)
        else:
            order = torch.arange(self.length)
        repeated = torch.repeat_interleave(order, self.num_repeats).tolist()
        return [repeated[p % len(repeated)] for p in self.positions()]

    def __iter__(self) -> Iterator[Any]:
        indices = self.indices()
        if self.seeded:
            positions = self.positions()
            seeds = [sample_seed(self.seed, self.epoch, p) for p in positions]
            return iter(list(zip(indices, seeds)))
        return iter(indices)

    def __len__(self) -> int:
        """Samples of this rank still to come in the epoch (the same on every rank)."""
        return max(self.epoch_size - self.consumed, 0) // self.num_replicas


class SeededSamples(Dataset):
    """``dataset[index]`` with torch, NumPy and Python seeded from the sample's seed (keys from a ``seeded``
    sampler), restored afterwards (the main process's streams stay undisturbed); attributes pass through.

    Only torch's CPU generator is seeded: ``torch.manual_seed`` also queues a lazy CUDA/XPU/MTIA seed with a
    formatted stack trace on every call, which made this wrapper cost more than decoding and augmenting a
    28 px image (half the loader's images/s on Fashion-MNIST)."""

    def __init__(self, dataset: Dataset) -> None:
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def __getattr__(self, name: str) -> Any:
        # never the wrapped set's protocol methods (a Subset's __getitems__ would take the seeded keys)
        if name == "dataset" or name.startswith("__"):
            raise AttributeError(name)
        return getattr(self.dataset, name)

    def __getitem__(self, key: tuple[int, int]) -> Any:
        index, seed = key
        saved = torch.get_rng_state(), np.random.get_state(), random.getstate()
        try:
            torch.default_generator.manual_seed(seed)
            np.random.seed(seed % 2**32)
            random.seed(seed)
            return self.dataset[index]
        finally:
            torch.set_rng_state(saved[0])
            np.random.set_state(saved[1])
            random.setstate(saved[2])


def ignore_stop_signals(worker_id: int) -> None:
    """A ``worker_init_fn``: the worker ignores ``STOP_SIGNALS``, left to the main process (a Ctrl-C or a
    scheduler's SIGTERM to the group would kill workers while the main process checkpoints)."""
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
    seeded: bool = False,
    worker_init_fn: Callable[[int], None] | None = None,
    augment: BatchAugment | None = None,
    num_replicas: int = 1,
    rank: int = 0,
) -> DataLoader | BatchLoader:
    """A DataLoader for ``dataset``; ``train`` shuffles (when ``sampler`` is None: an epoch-seeded
    :class:`RepeatAugSampler`, ``loader.sampler.set_epoch(epoch)``) and drops the last incomplete batch
    (timm ``Mixup`` needs full, even batches). ``seed`` seeds that sampler and the worker seeds;
    ``seeded`` wraps ``dataset`` in :class:`SeededSamples` (a mid-epoch resume then draws the same
    augmentations; a given sampler must be built ``seeded=True``). With ``augment`` (the batch form of
    the data set's transform) and images preloaded at a size it takes: a
    :class:`~vit5.data.batched.BatchLoader` instead, whose eval batches are rank ``rank`` of
    ``num_replicas``'s share (Accelerate's ``prepare`` leaves it as it is)."""
    from vit5.data.batched import preloaded_loader  # imports this module

    if sampler is None and train:
        sampler = RepeatAugSampler(
            dataset,
            num_repeats=1,
            seed=seed,
            selected_round=0,
            seeded=seeded,
        )
    batches = preloaded_loader(
        dataset,
        batch_size,
        augment,
        sampler=sampler if train else None,
        num_replicas=num_replicas,
        rank=rank,
    )
    if batches is not None:
        return batches
    if seeded:
        if not getattr(sampler, "seeded", False):
            raise ValueError(
                "seeded=True needs a RepeatAugSampler(..., seeded=True) (or sampler=None)",
            )
        dataset = SeededSamples(dataset)
    return DataLoader(
        dataset,
        batch_size=batch_size,
        sampler=sampler,
        num_workers=num_workers,
        pin_memory=torch.cuda.is_available() if pin_memory is None else pin_memory,
        drop_last=train,
        persistent_workers=num_workers > 0 if persistent_workers is None else persistent_workers,
        generator=torch.Generator().manual_seed(seed),
        worker_init_fn=worker_init_fn,
    )

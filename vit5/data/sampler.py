"""Repeated-augmentation sampler (DeiT ``RASampler``), rank-explicit and resumable.

ViT-5 pre-training uses ``--repeated-aug`` (on by default in the official ``main.py:112-114`` at
github.com/wangf3014/ViT-5 commit b7b0796): each epoch shuffles the indices with
a generator seeded by the epoch, repeats every index ``num_repeats`` (3) times in a row, pads to a
multiple of the world size, and gives rank ``r`` the positions ``r, r + W, r + 2W, ...``. Each rank
then keeps only ``floor(N / 256) * 256 / W`` of them, so an epoch has as many steps as without
repeats but sees about ``1 / num_repeats`` of the unique images, each under several augmentations.
With ``seed=0`` the order is identical to DeiT's ``samplers.py``.

With ``num_repeats=1`` it is a plain epoch-seeded ``DistributedSampler`` and ``selected_round`` is
ignored: the rounding only compensates for the repeats (DeiT uses ``RASampler`` only with
``--repeated-aug`` and a ``DistributedSampler`` otherwise), so without repeats every image is seen
once per epoch instead of up to ``selected_round - 1`` of them being left out.

**Accelerate.** The sampler already shards by ``rank``. Build the loader with
``num_replicas=accelerator.num_processes, rank=accelerator.process_index`` and do **not** pass
that loader to ``accelerator.prepare`` (which would shard the batches a second time, so each
process would see ``1 / W`` of its own shard); move batches with ``.to(accelerator.device)``.

**Resume.** An epoch is one *global* sequence of positions that depends on ``seed`` and the epoch
only, never on the world size: position ``p`` holds ``repeated[p % len(repeated)]`` (the repeated
permutation, extended cyclically where DeiT pads), and rank ``r`` of ``W`` takes the positions
``r, r + W, ...``, so each step of all ranks together consumes a contiguous block of it.
``set_epoch(epoch, consumed=C)`` skips the first ``C`` positions (samples trained by all processes
together) and splits the rest over the current ranks, which is exact for any world size: a
checkpoint written by ``N`` processes continues on ``M`` with the same remaining samples.
``start_index=k * batch_size`` (this rank's first ``k`` batches, same world size) is
``consumed=start_index * W``. Accelerate's own loaders call ``set_epoch(epoch)`` on every pass,
which resets the position; for a prepared loader use ``accelerator.skip_first_batches`` instead.

**Per-sample seeds** (``seeded=True``): the sampler yields ``(index, seed)`` pairs, the seed a
function of ``(seed, epoch, position)`` (:func:`sample_seed`), and :class:`SeededSamples` draws each
sample's augmentation from its own seed. Augmentations then depend neither on the DataLoader
workers (which worker gets which batch, when workers restart) nor on the world size, so a
mid-epoch resume, with or without workers, on any number of processes, draws exactly the
augmentations of an uninterrupted run.
"""

from __future__ import annotations

import math
import random
from collections.abc import Iterator, Sized
from typing import Any

import numpy as np
import torch
from torch.utils.data import Dataset, Sampler


def sample_seed(seed: int, epoch: int, position: int) -> int:
    """The augmentation seed of global position ``position`` of epoch ``epoch`` (a 63-bit integer,
    independent of the world size and of the DataLoader workers)."""
    return (
        int(np.random.SeedSequence([seed, epoch, position]).generate_state(2, np.uint32).view(np.uint64)[0])
        >> 1
    )


class RepeatAugSampler(Sampler[Any]):
    """Indices for one process: shuffle (seed + epoch), repeat ``num_repeats``x, stride by rank.

    Args:
        data_source: the data set (only its length is used) or the length itself.
        num_replicas: number of processes sharing the data (``accelerator.num_processes``).
        rank: this process's index (``accelerator.process_index``).
        num_repeats: how often each index appears per epoch across all ranks (DeiT: 3).
        shuffle: shuffle with a ``torch.Generator`` seeded by ``seed + epoch``; all ranks agree.
        seed: base seed (DeiT uses 0).
        selected_round: with repeats, the per-epoch sample count per rank is ``floor(N //
            selected_round * selected_round / num_replicas)`` as in DeiT; 0 (and ``num_repeats=1``)
            means ``ceil(N / num_replicas)``.
        seeded: yield ``(index, sample_seed)`` pairs for :class:`SeededSamples` instead of indices.
    """

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
            raise ValueError(f"selected_round must be >= 0 (0 disables rounding), got {selected_round}")
        self.length = length
        self.num_replicas = num_replicas
        self.rank = rank
        self.num_repeats = num_repeats
        self.shuffle = shuffle
        self.seed = seed
        self.seeded = seeded
        self.num_samples = math.ceil(length * num_repeats / num_replicas)
        self.total_size = self.num_samples * num_replicas
        if selected_round and num_repeats > 1:
            self.num_selected = length // selected_round * selected_round // num_replicas
        else:
            self.num_selected = math.ceil(length / num_replicas)
        if self.num_selected == 0:
            raise ValueError(
                f"a data set of {length} samples over {num_replicas} process(es) with selected_round="
                f"{selected_round} yields 0 samples per epoch; pass selected_round=0 for small data sets"
            )
        self.epoch = 0
        self.consumed = 0

    @property
    def epoch_size(self) -> int:
        """Global positions of an epoch at this world size (all ranks together)."""
        return self.num_selected * self.num_replicas

    def set_epoch(self, epoch: int, start_index: int = 0, *, consumed: int | None = None) -> None:
        """Select the epoch's permutation and skip its first ``consumed`` global positions (samples
        already trained by all processes together); ``start_index`` is the same position counted in
        this rank's samples (``consumed = start_index * num_replicas``)."""
        if consumed is None:
            if not 0 <= start_index <= self.num_selected:
                raise ValueError(f"start_index must be in [0, {self.num_selected}], got {start_index}")
            consumed = start_index * self.num_replicas
        if not 0 <= consumed:
            raise ValueError(f"consumed must be >= 0, got {consumed}")
        self.epoch = epoch
        self.consumed = consumed

    @property
    def start_index(self) -> int:
        """This rank's first sample of the epoch still to come (the consumed prefix per rank)."""
        return self.num_selected - len(self)

    def __iter__(self) -> Iterator[Any]:
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.length, generator=generator)
        else:
            order = torch.arange(self.length)
        repeated = torch.repeat_interleave(order, self.num_repeats).tolist()
        first = self.consumed + self.rank
        positions = range(first, first + len(self) * self.num_replicas, self.num_replicas)
        if self.seeded:
            return iter(
                [(repeated[p % len(repeated)], sample_seed(self.seed, self.epoch, p)) for p in positions]
            )
        return iter([repeated[p % len(repeated)] for p in positions])

    def __len__(self) -> int:
        """Samples of this rank still to come in the epoch (the same on every rank)."""
        return max(self.epoch_size - self.consumed, 0) // self.num_replicas


class SeededSamples(Dataset):
    """``dataset[index]`` with every random generator (torch, NumPy, Python) seeded from the
    sample's own seed, for a sampler with ``seeded=True``; the generators are restored afterwards,
    so the main process's streams (drop path, Mixup) are not disturbed when ``num_workers=0``.
    Attributes of the wrapped data set (``class_names``, ``bad_mask``, ...) pass through."""

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
            torch.manual_seed(seed)
            np.random.seed(seed % 2**32)
            random.seed(seed)
            return self.dataset[index]
        finally:
            torch.set_rng_state(saved[0])
            np.random.set_state(saved[1])
            random.setstate(saved[2])

"""Repeated-augmentation sampler (DeiT ``RASampler``), rank-explicit and resumable.

ViT-5 pre-training uses ``--repeated-aug`` (on by default in the official ``main.py:112-114`` at
github.com/wangf3014/ViT-5 commit b7b0796): each epoch shuffles the indices with
a generator seeded by the epoch, repeats every index ``num_repeats`` (3) times in a row, pads to a
multiple of the world size, and gives rank ``r`` the positions ``r, r + W, r + 2W, ...``. Each rank
then keeps only ``floor(N / 256) * 256 / W`` of them, so an epoch has as many steps as without
repeats but sees about ``1 / num_repeats`` of the unique images, each under several augmentations.
With ``seed=0`` the order is identical to DeiT's ``samplers.py``.

With ``num_repeats=1, selected_round=0`` it is a plain epoch-seeded ``DistributedSampler``.

**Accelerate.** The sampler already shards by ``rank``. Build the loader with
``num_replicas=accelerator.num_processes, rank=accelerator.process_index`` and do **not** pass
that loader to ``accelerator.prepare`` (which would shard the batches a second time, so each
process would see ``1 / W`` of its own shard); move batches with ``.to(accelerator.device)``.

**Resume.** ``set_epoch(epoch, start_index=k * batch_size)`` skips this rank's first ``k``
batches of that epoch, so an interrupted epoch continues with exactly the samples it had left.
Accelerate's own loaders call ``set_epoch(epoch)`` on every pass, which resets ``start_index``;
for a prepared loader use ``accelerator.skip_first_batches`` instead.
"""

from __future__ import annotations

import math
from collections.abc import Iterator, Sized

import torch
from torch.utils.data import Sampler


class RepeatAugSampler(Sampler[int]):
    """Indices for one process: shuffle (seed + epoch), repeat ``num_repeats``x, stride by rank.

    Args:
        data_source: the data set (only its length is used) or the length itself.
        num_replicas: number of processes sharing the data (``accelerator.num_processes``).
        rank: this process's index (``accelerator.process_index``).
        num_repeats: how often each index appears per epoch across all ranks (DeiT: 3).
        shuffle: shuffle with a ``torch.Generator`` seeded by ``seed + epoch``; all ranks agree.
        seed: base seed (DeiT uses 0).
        selected_round: per-epoch sample count per rank is ``floor(N // selected_round *
            selected_round / num_replicas)`` as in DeiT; 0 means ``ceil(N / num_replicas)``.
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
        self.num_samples = math.ceil(length * num_repeats / num_replicas)
        self.total_size = self.num_samples * num_replicas
        if selected_round:
            self.num_selected = length // selected_round * selected_round // num_replicas
        else:
            self.num_selected = math.ceil(length / num_replicas)
        if self.num_selected == 0:
            raise ValueError(
                f"a data set of {length} samples over {num_replicas} process(es) with selected_round="
                f"{selected_round} yields 0 samples per epoch; pass selected_round=0 for small data sets"
            )
        self.epoch = 0
        self.start_index = 0

    def set_epoch(self, epoch: int, start_index: int = 0) -> None:
        """Select the epoch's permutation; skip this rank's first ``start_index`` samples of it."""
        if not 0 <= start_index <= self.num_selected:
            raise ValueError(f"start_index must be in [0, {self.num_selected}], got {start_index}")
        self.epoch = epoch
        self.start_index = start_index

    def __iter__(self) -> Iterator[int]:
        if self.shuffle:
            generator = torch.Generator().manual_seed(self.seed + self.epoch)
            order = torch.randperm(self.length, generator=generator)
        else:
            order = torch.arange(self.length)
        indices = torch.repeat_interleave(order, self.num_repeats).tolist()
        indices = (indices * math.ceil(self.total_size / len(indices)))[: self.total_size]
        mine = indices[self.rank : self.total_size : self.num_replicas]
        return iter(mine[self.start_index : self.num_selected])

    def __len__(self) -> int:
        return self.num_selected - self.start_index

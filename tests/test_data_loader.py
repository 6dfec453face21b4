"""build_loader: reproducible and resumable order, distinct augmentation per worker, RA per rank."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from data_images import random_rgb
from torch.utils.data import Dataset

from vit5.data import RepeatAugSampler, build_loader, build_transform
from vit5.data.loader import SeededSamples


class Indices(Dataset):
    def __init__(self, length: int) -> None:
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> int:
        return index


class SameImage(Dataset):
    """Every sample is the same picture, so any difference comes from augmentation."""

    def __init__(self, length: int = 8) -> None:
        self.image = random_rgb(24, 24)
        self.transform = build_transform("three_augment", 16)
        self.length = length

    def __len__(self) -> int:
        return self.length

    def __getitem__(self, index: int) -> torch.Tensor:
        return self.transform(self.image)


def flat(loader) -> list[list[int]]:
    return [batch.tolist() for batch in loader]


def test_train_order_is_seeded_shuffled_and_drops_the_last_batch():
    batches = flat(build_loader(Indices(10), 4, train=True, seed=1))
    assert len(batches) == 2 and all(len(b) == 4 for b in batches)
    assert batches == flat(build_loader(Indices(10), 4, train=True, seed=1))
    assert batches != flat(build_loader(Indices(10), 4, train=True, seed=2))
    assert sorted(sum(batches, [])) != sum(batches, [])


def test_eval_order_is_sequential_and_complete():
    assert flat(build_loader(Indices(10), 4, train=False)) == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9]]


def test_resume_skips_exactly_the_batches_already_seen():
    loader = build_loader(Indices(50), 4, train=True, seed=0)
    loader.sampler.set_epoch(3)
    epoch = flat(loader)
    resumed = build_loader(Indices(50), 4, train=True, seed=0)
    resumed.sampler.set_epoch(3, consumed=5 * 4)
    assert flat(resumed) == epoch[5:] and len(resumed) == len(epoch) - 5
    loader.sampler.set_epoch(4)
    assert flat(loader) != epoch


def test_workers_draw_different_augmentations_and_runs_repeat():
    def batches(seed: int) -> list[torch.Tensor]:
        return list(build_loader(SameImage(), 2, train=False, num_workers=2, seed=seed))

    first = batches(0)
    assert not torch.equal(first[0], first[1])  # batch 0 from worker 0, batch 1 from worker 1
    assert not torch.equal(first[0][0], first[0][1])
    assert all(torch.equal(a, b) for a, b in zip(first, batches(0)))
    assert not torch.equal(first[0], batches(1)[0])


def test_persistent_workers_keep_drawing_new_augmentations_across_epochs():
    loader = build_loader(SameImage(4), 4, train=True, num_workers=2, seed=0)
    assert loader.persistent_workers and not loader.pin_memory
    epochs = [next(iter(loader)) for _ in range(2)]
    assert not torch.equal(epochs[0], epochs[1])


def test_rank_aware_ra_loaders_have_equal_length_and_split_the_repeats():
    loaders = [
        build_loader(
            Indices(512), 16, True, sampler=RepeatAugSampler(512, num_replicas=2, rank=r, seed=5)
        )
        for r in (0, 1)
    ]
    per_rank = [sum(flat(loader), []) for loader in loaders]
    assert len(per_rank[0]) == len(per_rank[1]) == 256
    seen = np.bincount(per_rank[0] + per_rank[1], minlength=512)
    assert seen.max() == 3 and (seen == 3).sum() >= 170  # ~512 / 3 images, 3 augmentations each


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"batch_size": 0}, "batch_size"),
        ({"num_workers": -1}, "num_workers"),
        ({"persistent_workers": True}, "persistent"),
    ],
)
def test_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        build_loader(Indices(4), **{"batch_size": 2, "train": True, **kwargs})


def test_seeded_augmentations_do_not_depend_on_workers_or_a_mid_epoch_restart():
    """Per-sample seeds: the same augmentations with 0 or 2 workers, and after skipping 2 batches."""

    def epoch(workers: int, skip: int = 0) -> list[torch.Tensor]:
        loader = build_loader(
            SameImage(12), 2, train=True, num_workers=workers, seed=7, seeded=True
        )
        loader.sampler.set_epoch(1, consumed=skip * 2)
        return list(loader)

    torch.manual_seed(123)
    before = torch.get_rng_state()
    without = epoch(0)
    assert torch.equal(torch.get_rng_state(), before)  # the main process's stream is left alone
    assert len({tuple(t.flatten()[:50].tolist()) for b in without for t in b}) == 12  # all distinct
    for other in (epoch(2), [*without[:2], *epoch(2, skip=2)], [*without[:2], *epoch(0, skip=2)]):
        assert len(other) == len(without) and all(
            torch.equal(a, b) for a, b in zip(other, without, strict=True)
        )


def test_seeded_samples_seed_only_the_cpu_generator(monkeypatch):
    """Per sample, ``torch.manual_seed`` would also queue lazy CUDA/XPU/MTIA seeds, each with a formatted
    stack trace (most of a 28 px sample's cost); the draws must still equal ``torch.manual_seed``'s."""
    reference = []
    for index, seed in [(0, 11), (1, 12)]:
        torch.manual_seed(seed)
        reference.append(SameImage()[index])
    for accelerator in ("cuda", "xpu", "mtia"):

        def refuse(seed: int, name: str = accelerator) -> None:
            raise AssertionError(f"a per-sample seed reached torch.{name}")

        monkeypatch.setattr(getattr(torch, accelerator), "manual_seed_all", refuse)
    samples = SeededSamples(SameImage())
    assert all(torch.equal(samples[key], ref) for key, ref in zip([(0, 11), (1, 12)], reference))


def test_a_seeded_loader_over_a_subset_takes_its_keys_one_by_one():
    """``Subset.__getitems__`` (batched fetching) must not see the ``(index, seed)`` keys."""
    loader = build_loader(
        torch.utils.data.Subset(Indices(20), range(10, 20)), 4, train=True, seeded=True
    )
    values = sum(flat(loader), [])
    assert len(values) == 8 and set(values) <= set(range(10, 20)) and len(set(values)) == 8

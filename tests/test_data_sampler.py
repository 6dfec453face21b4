"""RepeatAugSampler: DeiT RASampler parity, rank disjointness and coverage, epochs, resume."""

from __future__ import annotations

import math
from collections import Counter

import pytest
import torch

from vit5.data import RepeatAugSampler


def deit_rasampler(
    length: int, num_replicas: int, rank: int, epoch: int, num_repeats: int = 3
) -> list[int]:
    """facebookresearch/deit samplers.py RASampler.__iter__, transcribed."""
    num_samples = int(math.ceil(length * num_repeats / num_replicas))
    total_size = num_samples * num_replicas
    num_selected_samples = int(math.floor(length // 256 * 256 / num_replicas))
    g = torch.Generator()
    g.manual_seed(epoch)
    indices = torch.randperm(length, generator=g)
    indices = torch.repeat_interleave(indices, repeats=num_repeats, dim=0).tolist()
    padding_size = total_size - len(indices)
    if padding_size > 0:
        indices += indices[:padding_size]
    indices = indices[rank:total_size:num_replicas]
    return indices[:num_selected_samples]


@pytest.mark.parametrize(("length", "world"), [(1000, 2), (777, 3), (4096, 8)])
def test_matches_deit_rasampler(length, world):
    for epoch in (0, 5):
        for rank in range(world):
            sampler = RepeatAugSampler(length, num_replicas=world, rank=rank)
            sampler.set_epoch(epoch)
            assert list(sampler) == deit_rasampler(length, world, rank, epoch)
            assert len(sampler) == length // 256 * 256 // world


def test_two_ranks_take_disjoint_positions_of_the_repeated_permutation():
    length = 600
    ranks = [RepeatAugSampler(length, num_replicas=2, rank=r, seed=3) for r in (0, 1)]
    for s in ranks:
        s.set_epoch(2)
    rank0, rank1 = (list(s) for s in ranks)
    assert len(rank0) == len(rank1) == 256  # floor(600 / 256) * 256 / 2
    interleaved = [i for pair in zip(rank0, rank1) for i in pair]
    perm = torch.randperm(length, generator=torch.Generator().manual_seed(3 + 2)).tolist()
    assert interleaved == [i for i in perm for _ in range(3)][: len(interleaved)]
    counts = Counter(interleaved)
    assert max(counts.values()) == 3
    for index, n in counts.items():
        if n == 3:  # the repeats are split across the ranks, never all on one
            assert 0 < rank0.count(index) < 3


def test_single_repeat_is_a_sharded_shuffle_that_covers_everything_once():
    options = {"num_replicas": 2, "num_repeats": 1, "selected_round": 0, "seed": 7}
    shards = [RepeatAugSampler(10, rank=r, **options) for r in (0, 1)]
    rank0, rank1 = (list(s) for s in shards)
    assert set(rank0).isdisjoint(rank1) and sorted(rank0 + rank1) == list(range(10))
    assert rank0 + rank1 != sorted(rank0 + rank1)


def test_uneven_sizes_are_padded_to_equal_lengths():
    lengths = [
        len(list(RepeatAugSampler(10, num_replicas=4, rank=r, selected_round=0))) for r in range(4)
    ]
    assert lengths == [3, 3, 3, 3]
    tiny = [
        RepeatAugSampler(1, num_replicas=4, rank=r, num_repeats=1, selected_round=0)
        for r in range(4)
    ]
    assert [list(s) for s in tiny] == [[0], [0], [0], [0]]


def test_epochs_and_seeds_change_the_order_deterministically():
    def order(epoch: int, seed: int = 0) -> list[int]:
        sampler = RepeatAugSampler(512, seed=seed)
        sampler.set_epoch(epoch)
        return list(sampler)

    assert order(1) == order(1)
    assert order(1) != order(2) and order(1, seed=1) != order(1)
    assert list(RepeatAugSampler(4, num_repeats=2, shuffle=False, selected_round=0)) == [0, 0, 1, 1]


def test_consumed_resumes_mid_epoch():
    sampler = RepeatAugSampler(1000, num_replicas=2, rank=1)
    sampler.set_epoch(4)
    full = list(sampler)
    sampler.set_epoch(4, consumed=96 * 2)  # 96 samples of each of the 2 ranks
    assert list(sampler) == full[96:] and len(sampler) == len(full) - 96
    sampler.set_epoch(5)
    assert len(sampler) == len(full)
    with pytest.raises(ValueError, match="consumed"):
        sampler.set_epoch(5, consumed=-1)


@pytest.mark.parametrize(
    ("kwargs", "match"),
    [
        ({"num_replicas": 2, "rank": 2}, "rank"),
        ({"num_repeats": 0}, "num_repeats"),
        ({"selected_round": -1}, "selected_round"),
        ({}, "selected_round=0 for small data sets"),
    ],
)
def test_validation(kwargs, match):
    with pytest.raises(ValueError, match=match):
        RepeatAugSampler(100, **kwargs)


@pytest.mark.parametrize("num_repeats", [1, 3])
def test_the_global_order_does_not_depend_on_the_world_size(num_repeats):
    """Interleaving the ranks' shares gives one sequence for every world size; skipping a consumed
    prefix and splitting the rest over another world size continues that sequence exactly."""

    def global_order(world: int, consumed: int = 0) -> list[int]:
        shares = []
        for rank in range(world):
            s = RepeatAugSampler(
                101,
                num_replicas=world,
                rank=rank,
                num_repeats=num_repeats,
                seed=5,
                selected_round=0,
            )
            s.set_epoch(2, consumed=consumed)
            shares.append(list(s))
        assert len({len(share) for share in shares}) == 1  # every rank as many (DDP needs it)
        return [x for column in zip(*shares, strict=True) for x in column]

    reference = torch.repeat_interleave(
        torch.randperm(101, generator=torch.Generator().manual_seed(5 + 2)), num_repeats
    ).tolist()
    for world in (1, 2, 3, 4):
        order = global_order(world)
        assert order == (reference * 2)[: len(order)]  # DeiT's padding repeats the start
        for consumed in (0, 12, 37):  # written by another world size; any prefix
            rest = global_order(world, consumed)
            assert rest == (reference * 2)[consumed : consumed + len(rest)]
            assert (
                len(rest)
                == (
                    RepeatAugSampler(
                        101, num_replicas=world, num_repeats=num_repeats, selected_round=0
                    ).epoch_size
                    - consumed
                )
                // world
                * world
            )


def test_consumed_counts_the_samples_of_all_ranks():
    b = RepeatAugSampler(100, num_replicas=2, rank=1, num_repeats=1, selected_round=0)
    b.set_epoch(1)
    full = list(b)
    b.set_epoch(1, consumed=16)
    assert list(b) == full[8:] and len(b) == 50 - 8


def test_seeded_samples_carry_a_seed_per_global_position():
    s = RepeatAugSampler(10, num_replicas=1, num_repeats=1, selected_round=0, seeded=True, seed=3)
    s.set_epoch(1)
    pairs = list(s)
    s.set_epoch(1, consumed=4)
    assert list(s) == pairs[4:]
    assert len({seed for _, seed in pairs}) == 10
    s.set_epoch(2)
    assert not {seed for _, seed in pairs} & {seed for _, seed in s}


def test_without_repeats_the_deit_rounding_leaves_no_image_out():
    # the fine-tune recipe: repeated_aug=1 with the pre-training default ra_selected_round=256
    plain = RepeatAugSampler(1000, num_repeats=1, selected_round=256, seed=3)
    assert len(plain) == 1000 and sorted(plain) == list(range(1000))  # not 768 of them
    shards = [
        RepeatAugSampler(1000, num_replicas=3, rank=r, num_repeats=1, selected_round=256)
        for r in range(3)
    ]
    assert set().union(*map(set, shards)) == set(range(1000))
    assert (
        len(RepeatAugSampler(1000, num_repeats=3, selected_round=256)) == 768
    )  # DeiT's, with repeats

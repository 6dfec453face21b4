"""Timing helpers: interleaving, paired ratios, quartiles, thread control."""

import pytest
import torch

from vit5.bench.measure import Quartiles, Samples, TimingConfig, measure, num_threads, speedup


def test_measure_interleaves_rounds_and_rotates_order():
    calls = []
    fns = {name: (lambda n=name: calls.append(n)) for name in ("a", "b", "c")}
    samples = measure(fns, TimingConfig(warmup=1, rounds=3))
    assert calls[:3] == ["a", "b", "c"]  # warmup
    assert calls[3:] == [
        "a",
        "b",
        "c",
        "b",
        "c",
        "a",
        "c",
        "a",
        "b",
    ]  # one of each per round, rotated
    assert all(len(s.seconds) == 3 for s in samples.values())


def test_speedup_uses_same_round_pairs():
    # round 2 is slow for both (a busy machine): the paired ratio is unaffected, a ratio of medians is not
    a = Samples("a", (1.0, 10.0, 1.0, 1.0))
    b = Samples("b", (2.0, 20.0, 2.0, 2.0))
    assert speedup(b, a).median == pytest.approx(0.5)
    assert speedup(a, b).median == pytest.approx(2.0)
    with pytest.raises(ValueError, match="same rounds"):
        speedup(a, Samples("c", (1.0,)))


def test_quartiles_and_rates():
    q = Quartiles.of([1, 2, 3, 4, 5])
    assert (q.q1, q.median, q.q3) == (2, 3, 4) and q.text("{:.0f}") == "3 (2-4)"
    assert Samples("s", (0.5, 0.25, 1.0)).rate(10).median == pytest.approx(20.0)


def test_num_threads_restores_and_validates():
    before = torch.get_num_threads()
    with num_threads(1) as n:
        assert n == 1 == torch.get_num_threads()
    assert torch.get_num_threads() == before
    with pytest.raises(RuntimeError, match="positive"), num_threads(0):  # torch's own check
        pass


def test_timing_config_validation():
    with pytest.raises(ValueError, match="rounds"):
        TimingConfig(rounds=0)

"""Wall-clock timing that survives a noisy, shared machine.

Absolute times on a shared CPU drift with the background load, so the benchmark compares
contenders **side by side**: every round runs each contender once (the order rotates from round
to round, so nobody always runs first after a cache-cold neighbour), and a ratio is the median over
rounds of the per-round ratio. Both sides of each pair ran within the same second, under nearly
the same load; slow drift cancels. Each time reports the median and the interquartile range (IQR).

Small ops (a single norm call) are repeated inside a sample until it lasts ``min_sample_s``, so
timer resolution and Python overhead do not dominate.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass

import numpy as np
import torch


@dataclass(frozen=True)
class TimingConfig:
    """How to time: ``warmup`` untimed calls per contender, then ``rounds`` interleaved samples."""

    warmup: int = 2
    rounds: int = 7
    min_sample_s: float = 0.0  # repeat a call inside one sample until this long (for tiny ops)

    def __post_init__(self) -> None:
        if self.warmup < 0 or self.rounds < 1 or self.min_sample_s < 0:
            raise ValueError(f"invalid {self}: need warmup >= 0, rounds >= 1, min_sample_s >= 0")


@dataclass(frozen=True)
class Quartiles:
    """Median and interquartile range of a set of values."""

    median: float
    q1: float
    q3: float

    @classmethod
    def of(cls, values: list[float] | np.ndarray) -> Quartiles:
        q1, med, q3 = np.percentile(np.asarray(values, dtype=np.float64), [25, 50, 75])
        return cls(float(med), float(q1), float(q3))

    @property
    def iqr(self) -> float:
        return self.q3 - self.q1

    def to_dict(self) -> dict[str, float]:
        return {"median": self.median, "q1": self.q1, "q3": self.q3}


@dataclass(frozen=True)
class Samples:
    """Seconds per call of one contender, one value per round."""

    name: str
    seconds: tuple[float, ...]

    @property
    def stats(self) -> Quartiles:
        return Quartiles.of(self.seconds)

    @property
    def median(self) -> float:
        return self.stats.median

    def rate(self, items_per_call: float) -> Quartiles:
        """Items per second (e.g. images/s): median and IQR over rounds."""
        return Quartiles.of([items_per_call / s for s in self.seconds])

    def to_dict(self) -> dict[str, object]:
        return {"seconds": list(self.seconds), **{f"s_{k}": v for k, v in self.stats.to_dict().items()}}


def paired_ratio(numerator: Samples, denominator: Samples) -> Quartiles:
    """Median (and IQR) over rounds of ``numerator / denominator`` measured in the same round."""
    if len(numerator.seconds) != len(denominator.seconds):
        raise ValueError(f"{numerator.name} and {denominator.name} were not measured in the same rounds")
    return Quartiles.of([a / b for a, b in zip(numerator.seconds, denominator.seconds)])


def speedup(fast: Samples, slow: Samples) -> Quartiles:
    """How many times faster ``fast`` is than ``slow`` (> 1: faster), paired per round."""
    return paired_ratio(slow, fast)


def device_sync(device: torch.device | str) -> Callable[[], None]:
    """A function that waits for the device's queued work (CUDA kernels run asynchronously)."""
    if torch.device(device).type == "cuda":
        return torch.cuda.synchronize
    return lambda: None


def _calls_per_sample(fn: Callable[[], object], sync: Callable[[], None], min_sample_s: float) -> int:
    if min_sample_s <= 0:
        return 1
    sync()
    start = time.perf_counter()
    fn()
    sync()
    one = max(time.perf_counter() - start, 1e-7)
    return max(1, int(np.ceil(min_sample_s / one)))


def measure(
    fns: Mapping[str, Callable[[], object]],
    cfg: TimingConfig = TimingConfig(),
    sync: Callable[[], None] = lambda: None,
    on_round: Callable[[int], None] | None = None,
) -> dict[str, Samples]:
    """Time every callable in interleaved rounds; returns seconds per call for each name.

    Args:
        fns: name -> zero-argument callable doing one unit of work (e.g. one forward).
        cfg: warmup, rounds and the minimum sample length.
        sync: called before reading the clock (``device_sync(device)`` on a GPU).
        on_round: called after each round with its index (progress bars).
    """
    if not fns:
        raise ValueError("nothing to measure: pass at least one callable")
    names = list(fns)
    for name in names:
        for _ in range(cfg.warmup):
            fns[name]()
    reps = {name: _calls_per_sample(fns[name], sync, cfg.min_sample_s) for name in names}
    times: dict[str, list[float]] = {name: [] for name in names}
    for r in range(cfg.rounds):
        order = names[r % len(names) :] + names[: r % len(names)]
        for name in order:
            fn, k = fns[name], reps[name]
            sync()
            start = time.perf_counter()
            for _ in range(k):
                fn()
            sync()
            times[name].append((time.perf_counter() - start) / k)
        if on_round is not None:
            on_round(r)
    return {name: Samples(name, tuple(times[name])) for name in names}


@contextmanager
def num_threads(n: int | None) -> Iterator[int]:
    """Run with ``n`` intra-op CPU threads (None: leave as is); yields the count in effect."""
    before = torch.get_num_threads()
    if n is not None:
        if n < 1:
            raise ValueError(f"threads must be >= 1, got {n}")
        torch.set_num_threads(n)
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)

"""How the benchmark measures on a noisy, shared machine: contenders are timed side by side (every round
runs each once, in an order rotating between rounds) and compared by the median over rounds of the
per-round ratio, so slow drift in the background load cancels; also peak memory. What it
measures: :class:`BenchConfig`, profiles ``smoke`` (seconds), ``quick`` (minutes on a CPU) and ``full``."""

from __future__ import annotations

import re
import time
from collections import deque
from collections.abc import Callable, Iterator, Mapping
from contextlib import contextmanager
from dataclasses import dataclass, field
from itertools import accumulate
from pathlib import Path
from typing import Any, Literal, NamedTuple

import numpy as np
import torch
from torch.profiler import ProfilerActivity, profile

from vit5.bench.report import choose
from vit5.errors import InputError
from vit5.model.presets import SIZES


@dataclass(frozen=True)
class TimingConfig:
    """``warmup`` untimed calls per contender, then ``rounds`` interleaved samples."""

    warmup: int = 2
    rounds: int = 7

    def __post_init__(self) -> None:
        if self.warmup < 0 or self.rounds < 1:
            raise ValueError(f"invalid {self}: need warmup >= 0 and rounds >= 1")


class Quartiles(NamedTuple):
    median: float
    q1: float
    q3: float

    @classmethod
    def of(cls, values) -> Quartiles:
        q1, median, q3 = np.percentile(np.asarray(values, dtype=np.float64), [25, 50, 75])
        return cls(float(median), float(q1), float(q3))

    def text(self, fmt: str = "{:.2f}x") -> str:
        return f"{fmt.format(self.median)} ({fmt.format(self.q1)}-{fmt.format(self.q3)})"


@dataclass(frozen=True)
class Samples:
    """Seconds per call of one contender, one value per round; ``rate(n)``: n items per call, per second."""

    name: str
    seconds: tuple[float, ...]

    @property
    def median(self) -> float:
        return float(np.median(self.seconds))

    def rate(self, items_per_call: float) -> Quartiles:
        return Quartiles.of([items_per_call / s for s in self.seconds])


def speedup(fast: Samples, slow: Samples) -> Quartiles:
    """How many times faster ``fast`` is than ``slow`` (> 1: faster): the median (and IQR) over rounds of
    ``slow / fast`` measured in the same round."""
    if len(fast.seconds) != len(slow.seconds):
        raise ValueError(f"{fast.name} and {slow.name} were not measured in the same rounds")
    return Quartiles.of([b / a for a, b in zip(fast.seconds, slow.seconds)])


def measure(
    fns: Mapping[str, Callable[[], object]], cfg=TimingConfig(), device="cpu"
) -> dict[str, Samples]:
    """Time every zero-argument callable in interleaved, rotating rounds; seconds per call by name
    (on CUDA, waiting for the queued kernels before and after each call)."""
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else lambda: None
    for fn in fns.values():
        for _ in range(cfg.warmup):
            fn()
    times: dict[str, list[float]] = {name: [] for name in fns}
    order = deque(fns)
    for _ in range(cfg.rounds):
        for name in order:
            sync()
            start = time.perf_counter()
            fns[name]()
            sync()
            times[name].append(time.perf_counter() - start)
        order.rotate(-1)
    return {name: Samples(name, tuple(seconds)) for name, seconds in times.items()}


@contextmanager
def num_threads(n: int | None) -> Iterator[int]:
    """Run with ``n`` intra-op CPU threads (None: leave as is); yields the count in effect."""
    before = torch.get_num_threads()
    torch.set_num_threads(before if n is None else n)  # n < 1: torch raises
    try:
        yield torch.get_num_threads()
    finally:
        torch.set_num_threads(before)


class MemoryReading(NamedTuple):
    """``peak``: most tensor bytes alive at once during the work, above what was alive before;
    ``retained``: bytes still alive after it (e.g. a returned cache)."""

    peak: int
    retained: int


def measure_memory(
    fn: Callable[[], object], device: torch.device | str = "cpu"
) -> tuple[MemoryReading, Any]:
    """Run ``fn()`` once; return (its memory reading, its result; keep it alive to count it as retained).
    CUDA: the allocator's counters; CPU: the profiler's allocation events."""
    device = torch.device(device)
    if device.type == "cuda":
        torch.cuda.synchronize(device)
        before = torch.cuda.memory_allocated(device)
        torch.cuda.reset_peak_memory_stats(device)
        result = fn()
        torch.cuda.synchronize(device)
        after = torch.cuda.memory_allocated(device) - before
        return MemoryReading(torch.cuda.max_memory_allocated(device) - before, after), result
    if device.type != "cpu":
        raise ValueError(f"memory measurement supports cpu and cuda devices, got {device}")
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    events = sorted(prof.profiler.kineto_results.events(), key=lambda e: e.start_ns())
    cpu = (
        e
        for e in events
        if e.name() == "[memory]" and e.device_type() == torch.autograd.DeviceType.CPU
    )
    live = [
        0,
        *accumulate(e.nbytes() for e in cpu),
    ]  # tensor bytes alive after each allocation or free
    return MemoryReading(peak=max(live), retained=live[-1]), result


@dataclass(frozen=True)
class DepthAblationConfig:
    """Pre-norm vs post-norm at depth: a narrow model so it runs in seconds on a CPU."""

    depth: int = 24
    width: int = 64
    heads: int = 4
    steps: int = 100
    lrs: tuple[float, ...] = (1e-3, 2e-3)  # fixed learning rates, no warmup
    batch: int = 64
    grad_batch: int = 128

    def __post_init__(self) -> None:
        if (
            self.depth < 2
            or self.steps < 1
            or not self.lrs
            or min(self.lrs) <= 0
            or self.width % self.heads
        ):
            raise InputError(f"invalid depth-ablation config {self}")


@dataclass(frozen=True)
class BenchConfig:
    device: str = "cpu"
    dtype: Literal["fp32", "bf16"] = "fp32"
    threads: int | None = None  # CPU intra-op threads; None: torch's default
    timing: TimingConfig = TimingConfig(warmup=1, rounds=5)
    sizes: tuple[str, ...] = ("tiny", "small")  # speed: every size at img_size
    target_size: str = "small"  # the size the speed targets are stated for (and measured at hires)
    depth: int | None = None  # override every model's depth (smoke runs)
    img_size: int = 224
    batch: int = 8
    hires_img_size: int = 448
    hires_batch: int = 2
    attn_seq_lens: tuple[int, ...] = (256, 1024, 2048, 4096, 8192)
    attn_heads: int = 2
    attn_head_dim: int = 64
    attn_eager_max_bytes: int = 4 * 2**30  # skip eager where its n x n tensors would exceed this
    compile_size: str = "tiny"
    compile_backend: str = "inductor"
    depth_ablation: DepthAblationConfig = field(default_factory=DepthAblationConfig)
    # data_index: synthetic ImageFolder trees indexed, and photos decoded from a folder and from shards
    index_sizes: tuple[int, ...] = (10_000, 100_000)
    index_rounds: int = 3
    decode_images: int = 64

    def __post_init__(self) -> None:
        if not (found := re.fullmatch(r"(cpu|cuda)(?::(\d+))?", self.device)):
            raise InputError(f"device must be 'cpu' or 'cuda' (or 'cuda:N'), got {self.device!r}")
        if found[1] == "cuda" and int(found[2] or 0) >= (count := torch.cuda.device_count()):
            raise InputError(
                f"{self.device} does not exist: torch sees {count} CUDA device(s); use cpu"
            )
        if self.dtype not in ("fp32", "bf16"):
            raise InputError(f"dtype must be 'fp32' or 'bf16', got {self.dtype!r}")
        if self.threads is not None and self.threads < 1:
            raise InputError(f"threads must be at least 1, got {self.threads}")
        if min(self.index_sizes, default=0) < 1 or self.index_rounds < 1 or self.decode_images < 8:
            raise InputError(
                "index_sizes must be positive, index_rounds >= 1 and decode_images >= 8"
            )
        if not self.sizes:
            raise InputError("sizes must name at least one model size")
        choose("model size", (*self.sizes, self.target_size, self.compile_size), SIZES)

    @property
    def size_for_targets(self) -> str:
        """The speed targets are for ViT-S; smaller runs check them on their largest size."""
        return self.target_size if self.target_size in self.sizes else self.sizes[-1]

    @classmethod
    def profile(cls, name: Literal["smoke", "quick", "full"], **changes: Any) -> BenchConfig:
        choose("profile", [name], PROFILES)
        return cls(**{**PROFILES[name], **changes})


PROFILES: dict[str, dict[str, Any]] = {
    "smoke": dict(
        threads=1,  # tiny ops: a second thread only adds synchronisation stalls on a busy machine
        timing=TimingConfig(warmup=1, rounds=2),
        sizes=("tiny",),
        depth=2,
        img_size=32,
        batch=2,
        hires_img_size=64,
        hires_batch=1,
        attn_seq_lens=(64, 256),
        attn_heads=1,
        compile_backend="eager",
        depth_ablation=DepthAblationConfig(
            depth=8, width=32, heads=2, steps=4, lrs=(1e-3,), batch=32, grad_batch=32
        ),
        index_sizes=(200,),
        index_rounds=1,
        decode_images=8,
    ),
    "quick": dict(),
    "full": dict(
        timing=TimingConfig(warmup=3, rounds=15),
        batch=64,
        hires_batch=16,
        attn_seq_lens=(256, 512, 1024, 2048, 4096, 8192, 16384),
        attn_heads=6,
        attn_eager_max_bytes=32 * 2**30,
        compile_size="small",
        depth_ablation=DepthAblationConfig(width=256, steps=300, lrs=(5e-4, 1e-3, 2e-3)),
        index_sizes=(10_000, 100_000, 1_000_000),
    ),
}


@dataclass
class BenchContext:
    cfg: BenchConfig
    out_dir: Path
    log: Callable[[str], None] = print

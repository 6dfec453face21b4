"""How the benchmark measures: wall-clock timing that survives a noisy, shared machine, peak
memory, throughput, FLOPs and operator profiles.

Absolute times on a shared CPU drift with the background load, so the benchmark compares
contenders **side by side**: every round runs each contender once (the order rotates from round
to round, so nobody always runs first after a cache-cold neighbour), and a ratio is the median over
rounds of the per-round ratio. Both sides of each pair ran within the same second, under nearly
the same load; slow drift cancels. Each time reports the median and the interquartile range (IQR).

Small ops (a single norm call) are repeated inside a sample until it lasts ``min_sample_s``, so
timer resolution and Python overhead do not dominate.

Also in this module:

* Peak memory of a piece of work, measured the same way on CPU and GPU.
* Forward and training-step throughput (images/s) of several models, measured side by side.
* Forward FLOPs of a ViT: counted by ``FlopCounterMode`` and derived analytically from the config.
* Where a step spends its time: ``torch.profiler`` operator time grouped into a few categories.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator, Mapping
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn
from torch.profiler import ProfilerActivity, profile
from torch.utils.flop_counter import FlopCounterMode, sdpa_flop_count

from vit5 import ViT5Config
from vit5.model.vit import unwrap


# ------------------------------------------------------------------------------------------ timing
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


# ------------------------------------------------------------------------------------------ memory
@dataclass(frozen=True)
class MemoryReading:
    """``peak``: most tensor bytes alive at once during the work, above what was alive before;
    ``retained``: bytes still alive after it (e.g. a returned cache)."""

    peak: int
    retained: int


def _cpu_reading(fn: Callable[[], object]) -> tuple[MemoryReading, object]:
    with profile(activities=[ProfilerActivity.CPU], profile_memory=True) as prof:
        result = fn()
    events = [e for e in prof.profiler.kineto_results.events() if e.name() == "[memory]"]
    events = [e for e in events if e.device_type() == torch.autograd.DeviceType.CPU]
    live = peak = 0
    for event in sorted(events, key=lambda e: e.start_ns()):
        live += event.nbytes()
        peak = max(peak, live)
    return MemoryReading(peak=peak, retained=live), result


def _cuda_reading(fn: Callable[[], object], device: torch.device) -> tuple[MemoryReading, object]:
    torch.cuda.synchronize(device)
    before = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    result = fn()
    torch.cuda.synchronize(device)
    peak = torch.cuda.max_memory_allocated(device) - before
    return MemoryReading(peak=peak, retained=torch.cuda.memory_allocated(device) - before), result


def measure_memory(
    fn: Callable[[], object], device: torch.device | str = "cpu"
) -> tuple[MemoryReading, object]:
    """Run ``fn()`` once and return (its memory reading, its result); keep the result alive to
    count it as retained."""
    device = torch.device(device)
    if device.type == "cuda":
        return _cuda_reading(fn, device)
    if device.type == "cpu":
        return _cpu_reading(fn)
    raise ValueError(f"memory measurement supports cpu and cuda devices, got {device}")


# -------------------------------------------------------------------------------------- throughput
MODES: tuple[str, ...] = ("forward", "train")


def autocast_context(device: torch.device | str, dtype: str) -> Callable[[], AbstractContextManager]:
    """A factory of the autocast context for ``dtype`` ("fp32": none, "bf16": bfloat16 autocast)."""
    if dtype == "fp32":
        return nullcontext
    if dtype == "bf16":
        device_type = torch.device(device).type
        return lambda: torch.autocast(device_type, dtype=torch.bfloat16)
    raise ValueError(f"unknown dtype {dtype!r}: use 'fp32' or 'bf16'")


def forward_step(
    model: nn.Module, images: torch.Tensor, amp: Callable[[], AbstractContextManager]
) -> Callable[[], None]:
    model.eval()

    def step() -> None:
        with torch.no_grad(), amp():
            model(images)

    return step


def train_step(
    model: nn.Module, images: torch.Tensor, labels: torch.Tensor, amp: Callable[[], AbstractContextManager]
) -> Callable[[], None]:
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-5, weight_decay=0.05, foreach=True)

    def step() -> None:
        with amp():
            loss = F.cross_entropy(model(images), labels)
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


@dataclass(frozen=True)
class ThroughputRun:
    """Seconds per batch of each model for each mode, from one interleaved measurement per mode."""

    img_size: int
    batch: int
    samples: dict[str, dict[str, Samples]]  # mode -> model -> samples

    def images_per_s(self, mode: str, model: str) -> float:
        return self.samples[mode][model].rate(self.batch).median

    def to_dict(self) -> dict[str, object]:
        return {
            "img_size": self.img_size,
            "batch": self.batch,
            "samples": {m: {k: s.to_dict() for k, s in v.items()} for m, v in self.samples.items()},
        }


def random_batch(
    batch: int, img_size: int, device: torch.device | str = "cpu", num_classes: int = 1000
) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded random images ``[batch, 3, img_size, img_size]`` and labels, the same in every section."""
    generator = torch.Generator().manual_seed(0)
    images = torch.randn(batch, 3, img_size, img_size, generator=generator).to(device)
    labels = torch.randint(0, num_classes, (batch,), generator=generator).to(device)
    return images, labels


def trains(model: nn.Module) -> bool:
    """Whether a model has a training step (one fused for inference does not)."""
    return not getattr(unwrap(model), "fused_for_inference", False)


def measure_throughput(
    models: Mapping[str, nn.Module],
    img_size: int,
    batch: int,
    timing: TimingConfig,
    device: torch.device | str = "cpu",
    dtype: str = "fp32",
    modes: tuple[str, ...] = MODES,
    num_classes: int = 1000,
) -> ThroughputRun:
    """Images/s of every model for each of ``modes`` ("forward", "train") on random images.

    Models fused for inference are timed in the forward rounds only.
    """
    unknown = set(modes) - set(MODES)
    if unknown:
        raise ValueError(f"unknown throughput modes {sorted(unknown)}: use {MODES}")
    images, labels = random_batch(batch, img_size, device, num_classes)
    amp = autocast_context(device, dtype)
    sync = device_sync(device)
    samples: dict[str, dict[str, Samples]] = {}
    for mode in modes:
        if mode == "forward":
            steps = {name: forward_step(m.to(device), images, amp) for name, m in models.items()}
        else:
            trained = {name: m for name, m in models.items() if trains(m)}
            steps = {name: train_step(m.to(device), images, labels, amp) for name, m in trained.items()}
        samples[mode] = measure(steps, timing, sync)
        del steps
    for model in models.values():
        model.zero_grad(set_to_none=True)
        model.eval()
    return ThroughputRun(img_size, batch, samples)


# ------------------------------------------------------------------------------------------- flops
aten = torch.ops.aten


def _cpu_sdpa_flops(query_shape, key_shape, value_shape, *args, out_shape=None, **kwargs) -> int:
    """PyTorch counts its CUDA attention kernels but not the CPU flash kernel; same formula."""
    return sdpa_flop_count(query_shape, key_shape, value_shape)


def counted_forward_flops(model: nn.Module, images: torch.Tensor) -> int:
    """FLOPs of one forward of ``model`` on ``images`` as counted by ``FlopCounterMode``."""
    cpu_attention = {aten._scaled_dot_product_flash_attention_for_cpu: _cpu_sdpa_flops}
    counter = FlopCounterMode(display=False, custom_mapping=cpu_attention)
    with counter, torch.no_grad():
        model(images)
    return counter.get_total_flops()


def analytic_forward_flops(cfg: ViT5Config, batch: int = 1, img_hw: tuple[int, int] | None = None) -> int:
    """FLOPs of a ViT-5 forward from its config: ``2 * (multiply-adds of every matrix product)``."""
    h, w = img_hw if img_hw is not None else cfg.img_size
    patches = (h // cfg.patch_size) * (w // cfg.patch_size)
    tokens = patches + int(cfg.class_token) + cfg.num_registers
    d, hd = cfg.embed_dim, cfg.head_dim
    kv_heads = cfg.num_kv_heads or cfg.num_heads
    mlp_mats = 3 if cfg.mlp == "swiglu" else 2
    per_block = (
        tokens * d * (cfg.num_heads + 2 * kv_heads) * hd  # qkv
        + 2 * cfg.num_heads * tokens * tokens * hd  # q k^T and p v
        + tokens * d * d  # output projection
        + mlp_mats * tokens * d * cfg.mlp_hidden_dim
    )
    macs = patches * d * cfg.in_chans * cfg.patch_size**2 + cfg.depth * per_block + d * cfg.num_classes
    return 2 * batch * macs


# -------------------------------------------------------------------------------------- op_profile
CATEGORIES: tuple[str, ...] = ("matmul", "attention", "elementwise", "optimizer")
_MATMUL = (
    "aten::mm",
    "aten::addmm",
    "aten::bmm",
    "aten::baddbmm",
    "aten::_addmm_activation",
    "aten::conv2d",
    "aten::convolution",
    "aten::_convolution",
    "aten::mkldnn_convolution",
    "aten::cudnn_convolution",
    "aten::convolution_backward",
    "aten::_int_mm",
    "aten::_scaled_mm",
)


def op_category(name: str) -> str | None:
    """The category an operator (or annotation) name defines, or None (see :func:`event_category`)."""
    if name in _MATMUL:
        return "matmul"
    if "scaled_dot_product" in name or "flash_attn" in name or "efficient_attention" in name:
        return "attention"
    if name.startswith(("aten::_foreach", "aten::_fused_adam", "Optimizer.step")):
        return "optimizer"
    return None


def event_category(event) -> str:
    """The category of a profiler event: that of the nearest enclosing matmul, attention kernel or
    optimizer step (a bias copy inside ``addmm`` is matmul, a ``sqrt`` inside AdamW is optimizer),
    elementwise otherwise."""
    while event is not None:
        category = op_category(event.name)
        if category is not None:
            return category
        event = event.cpu_parent
    return "elementwise"


@dataclass(frozen=True)
class OpBreakdown:
    """Self time (seconds) per category, and the slowest elementwise operators."""

    seconds: dict[str, float]
    top_elementwise: tuple[tuple[str, float], ...]

    @property
    def total(self) -> float:
        return sum(self.seconds.values())

    def share(self, category: str) -> float:
        return self.seconds[category] / self.total if self.total else 0.0

    def to_dict(self) -> dict[str, object]:
        return {"seconds": self.seconds, "top_elementwise": [list(item) for item in self.top_elementwise]}


def op_breakdown(
    step: Callable[[], object], device: torch.device | str = "cpu", calls: int = 3, top: int = 5
) -> OpBreakdown:
    """Profile ``calls`` runs of ``step`` one by one (after an untimed run) and return the run with
    the median total: a run in which the process was descheduled inflates whichever op was running."""
    on_cuda = torch.device(device).type == "cuda"
    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if on_cuda else [])
    step()
    runs = []
    for _ in range(calls):
        if on_cuda:
            torch.cuda.synchronize()
        with profile(activities=activities) as prof:
            step()
            if on_cuda:
                torch.cuda.synchronize()
        runs.append(_group(prof.events(), on_cuda, top))
    return sorted(runs, key=lambda b: b.total)[len(runs) // 2]


def _group(events, on_cuda: bool, top: int) -> OpBreakdown:
    seconds = dict.fromkeys(CATEGORIES, 0.0)
    elementwise: dict[str, float] = {}
    for event in events:
        if not event.name.startswith("aten::"):
            continue  # autograd nodes and annotations: their work is in the aten ops they call
        s = (event.self_device_time_total if on_cuda else event.self_cpu_time_total) / 1e6
        category = event_category(event)
        seconds[category] += s
        if category == "elementwise" and s > 0:
            elementwise[event.name] = elementwise.get(event.name, 0.0) + s
    ranked = sorted(elementwise.items(), key=lambda item: -item[1])[:top]
    return OpBreakdown(seconds, tuple(ranked))

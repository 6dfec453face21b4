"""Peak memory of a piece of work, measured the same way on CPU and GPU.

- CUDA: the caching allocator's own counters (``torch.cuda.max_memory_allocated`` after a reset),
  relative to the memory allocated before the work started.
- CPU: PyTorch's CPU allocator keeps no peak counter, and ``tracemalloc`` / RSS do not see tensor
  memory reliably (RSS includes freed pages the allocator keeps). ``torch.profiler`` with
  ``profile_memory=True`` records every tensor allocation and free made through the c10 allocator,
  with its size and time; replaying those events in time order gives the exact peak of live
  tensor bytes, which is what the GPU counter measures too.

Both report bytes of **tensors** (activations, outputs, workspaces); the allocator's rounding and
the process's other memory are not included.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.profiler import ProfilerActivity, profile


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

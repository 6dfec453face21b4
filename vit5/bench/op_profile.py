"""Where a step spends its time: ``torch.profiler`` operator time grouped into a few categories.

Self time per ATen operator (CPU time on a CPU, device time on CUDA), summed into:

- ``matmul``: matrix products and the patch convolution (``mm``, ``addmm``, ``bmm``, ``convolution``);
- ``attention``: the fused attention kernels (SDPA's flash / memory-efficient / math kernels, flash-attn);
- ``optimizer``: the AdamW update (``Optimizer.step``, ``_foreach_*``);
- ``elementwise``: everything else (norms, activations, RoPE, residual adds, copies, reductions).

A model whose elementwise share is larger than its rival's pays for memory passes, not for FLOPs;
the top elementwise operators say which.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch.profiler import ProfilerActivity, profile

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

"""Where the work runs: the printing process (rank 0), device names checked up front, and memory
estimates checked against the memory there. torch is imported by the functions that need it."""

from __future__ import annotations

import os
import sys
from typing import TYPE_CHECKING

from vit5.errors import Vit5Error

if TYPE_CHECKING:
    import torch

DEVICE_HELP = "auto (cuda when available), cpu, cuda, cuda:1, mps"


def resolve_device(name: str) -> torch.device:
    """``"auto"`` -> cuda when available, else cpu; any other name is checked to exist (Vit5Error)."""
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise Vit5Error(f"--device {name!r} is not a device: use {DEVICE_HELP}") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            raise Vit5Error(f"--device {name}: torch sees no CUDA device on this machine; use --device cpu")
        if device.index is not None and device.index >= count:
            raise Vit5Error(f"--device {name}: torch sees {count} CUDA device(s) (cuda:0..cuda:{count - 1})")
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise Vit5Error(f"--device {name}: MPS is not available on this machine; use --device cpu")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise Vit5Error(f"--device {name}: vit5 runs on {DEVICE_HELP}, not {device.type}")
    return device


def available_memory(device: torch.device | str) -> int:
    """Bytes that can still be allocated on ``device``: free CUDA memory, or the host's available RAM."""
    import psutil
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    return int(psutil.virtual_memory().available)


def format_bytes(n: float) -> str:
    """``1.5e9`` -> ``"1.40 GiB"`` (binary units)."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def check_fits(needed: int, device: torch.device | str, what: str, fix: str) -> None:
    """Refuse work whose memory estimate ``needed`` exceeds what ``device`` has available (Vit5Error)."""
    import torch

    have = available_memory(device)
    if needed > have:
        raise Vit5Error(
            f"{what} needs about {format_bytes(needed)} of memory, but {torch.device(device)} has "
            f"{format_bytes(have)} available; {fix}"
        )


def is_main_process() -> bool:
    """Rank 0 of a launched job (torchrun / accelerate launch set RANK), or a single process."""
    return int(os.environ.get("RANK", "0")) == 0


def print_main(message: str, err: bool = False) -> None:
    """Print once per job, not once per process (before Accelerate is up, read the launcher's rank)."""
    if is_main_process():
        print(message, file=sys.stderr if err else sys.stdout, flush=True)


def cpu_count() -> int:
    """The CPUs this process may run on (its affinity mask, e.g. a container's share)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity masks (macOS, Windows)
        return max(1, os.cpu_count() or 1)


def default_workers(most: int = 4) -> int:
    """Loader workers that leave the model a CPU: ``min(most, CPUs - 1)`` (``docs/evaluation.md``)."""
    return max(0, min(most, cpu_count() - 1))


def fit_workers(requested: int, setting: str = "num_workers") -> tuple[int, str]:
    """``requested`` loader workers clamped to :func:`cpu_count`, and a note naming ``setting`` if clamped."""
    cpus = cpu_count()
    if requested <= cpus:
        return requested, ""
    return cpus, f"{setting}={requested} but this process may use {cpus} CPUs: {cpus} loader workers"


def fit_threads(workers: int, device: torch.device | str = "cpu") -> int:
    """On a CPU device, lower torch's thread count to the CPUs the loader workers leave free (an explicit
    ``OMP_NUM_THREADS`` wins): workers beside a full OpenMP pool spin-wait on each other. Returns it."""
    import torch

    if torch.device(device).type != "cpu" or "OMP_NUM_THREADS" in os.environ:
        return torch.get_num_threads()
    threads = max(1, cpu_count() - workers)
    if torch.get_num_threads() > threads:
        torch.set_num_threads(threads)
    return torch.get_num_threads()

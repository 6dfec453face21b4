"""Where and how a benchmark ran: versions, hardware, threads and the machine's load."""

from __future__ import annotations

import os
import platform
import sys

import timm
import torch

from vit5.bench.config import BenchConfig


def cpu_name() -> str:
    try:
        with open("/proc/cpuinfo") as f:
            for line in f:
                if line.startswith("model name"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return platform.processor() or "unknown"


def load_average() -> list[float] | None:
    """1, 5 and 15 minute load averages (a busy machine makes absolute times unreliable)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def environment(cfg: BenchConfig) -> dict[str, object]:
    env: dict[str, object] = {
        "python": sys.version.split()[0],
        "torch": torch.__version__,
        "timm": timm.__version__,
        "platform": platform.platform(),
        "cpu": cpu_name(),
        "cpu_count": os.cpu_count(),
        "torch_threads": torch.get_num_threads(),
        "device": cfg.device,
        "dtype": cfg.dtype,
        "load_average": load_average(),
    }
    if torch.device(cfg.device).type == "cuda" and torch.cuda.is_available():
        env["gpu"] = torch.cuda.get_device_name(torch.device(cfg.device))
    return env

"""Shared helpers for the training tests (no tests here): a tiny, fast config and a CLI runner."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from vit5.train import TrainConfig, load_config

REPO = Path(__file__).resolve().parent.parent
TRAIN_PY = REPO / "train.py"

# vit5_tiny cut to 2 blocks of width 48 on 16-px digits (2x2 patches of 8 px): ~1 s per epoch on one core.
TINY = [
    "data.dataset=digits",
    "data.batch_size=32",
    "data.num_workers=0",
    "model.name=vit5_tiny",
    "model.img_size=16",
    "model.overrides.patch_size=8",
    "model.overrides.depth=2",
    "model.overrides.embed_dim=48",
    "model.overrides.num_heads=2",
    "aug.train=none",
    "aug.repeated_aug=1",
    "aug.ra_selected_round=0",
    "loss.name=soft_ce",
    "optim.name=adamw",
    "optim.lr=2e-3",
    "schedule.epochs=1",
    "schedule.warmup_epochs=0",
    "schedule.interval=update",
    "ema.decay=0.9",
    "checkpoint.keep_last=5",
    "run.progress=false",
    "run.mixed_precision=fp32",
    "run.name=tiny",
]


def tiny_config(tmp_path: Path, *overrides: str) -> TrainConfig:
    return load_config(None, [*TINY, f"run.output_dir={tmp_path}", *overrides])


def train_command(args: list[str]) -> tuple[list[str], dict[str, str]]:
    """Command line and environment for ``python train.py ARGS`` (single-threaded torch: reproducible)."""
    return [sys.executable, str(TRAIN_PY), *args], {**os.environ, "OMP_NUM_THREADS": "1"}


def run_train(args: list[str], cwd: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    command, env = train_command(args)
    return subprocess.run(command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)


@pytest.fixture(autouse=True)
def single_thread():
    """Tiny models on a shared 2-core machine: one torch thread avoids OpenMP spin-wait stalls
    (tens of ms per op when another process holds the other core). Import into a test module to use."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

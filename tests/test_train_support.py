"""Shared helpers for the training tests (no tests here): a tiny, fast config and a CLI runner."""

from __future__ import annotations

import os
import socket
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
    return subprocess.run(
        command, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout
    )


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def accelerate_command(script: Path, *args: str) -> tuple[list[str], dict[str, str]]:
    """``accelerate launch`` of ``script ARGS`` on 2 CPU processes (gloo), one torch thread each, no
    user Accelerate config, and the tests folder importable by the script."""
    accelerate = Path(sys.executable).parent / "accelerate"
    command = [str(accelerate), "launch", "--multi_gpu", "--num_processes", "2", "--num_machines", "1",
               "--mixed_precision", "no", "--dynamo_backend", "no", "--main_process_port", str(free_port()),
               str(script), *args]  # fmt: skip
    tests = str(Path(__file__).resolve().parent)
    env = {
        **os.environ,
        "OMP_NUM_THREADS": "1",
        "ACCELERATE_CONFIG_FILE": str(script.parent / "none.yaml"),
        "PYTHONPATH": os.pathsep.join([tests, os.environ.get("PYTHONPATH", "")]),
    }
    return command, env


# The end of a worker: no thread of the process group left (gloo's are named gloo_tcp_loop and
# pt_gloo_runloop); still running, they can abort the interpreter's exit (vit5.runtime.end_process_group)
GROUP_FREED = """
import os as _os
_left = sorted(name for task in _os.listdir("/proc/self/task")
               if "gloo" in (name := open(f"/proc/self/task/{task}/comm").read().strip()))
assert not _left, f"the process group outlived destroy_process_group: its threads {_left} still run"
print("process group freed", flush=True)
"""


def launch_two(script: Path, worker: str, *args: str) -> subprocess.CompletedProcess:
    """Write ``worker`` to ``script``, run it on 2 CPU processes and require success. The worker ends by
    destroying its process group, as ``vit5 train`` does, and checking that its threads stopped although
    the worker still holds its Trainer: the Trainer let go of the group when its run ended."""
    script.write_text(worker + "\ntorch.distributed.destroy_process_group()\n" + GROUP_FREED)
    command, env = accelerate_command(script, *args)
    result = subprocess.run(
        command, cwd=script.parent, env=env, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert result.stdout.count("process group freed") == 2
    return result


@pytest.fixture(autouse=True)
def single_thread():
    """Tiny models on a shared 2-core machine: one torch thread avoids OpenMP spin-wait stalls
    (tens of ms per op when another process holds the other core). Import into a test module to use."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)

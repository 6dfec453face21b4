"""Stop signals (issue 17, item 3): SIGTERM, SIGINT and SIGUSR1 finish the optimizer step, checkpoint that
exact position (mid-epoch included), say how to resume and exit with 128 + the signal number; the resumed
run ends with exactly the weights of an uninterrupted one, with or without DataLoader workers. A second
signal exits at once."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_train_support import REPO, TINY, single_thread, tiny_config  # noqa: F401 (autouse fixture)

from vit5.cli import train as cli
from vit5.outputs import read_csv
from vit5.train import Trainer, TrainingInterrupted
from vit5.train.checkpointing import list_checkpoints
from vit5.train.loop import LRSchedule

STEPS = 1438 // 32  # 44 optimizer steps per epoch
# every source of randomness on: 3-Augment in the workers, drop path and Mixup/CutMix in the main process
ARGS = (
    "aug.train=three_augment",
    "aug.hflip=0.5",
    "model.drop_path_rate=0.1",
    "schedule.epochs=2",
    "schedule.warmup_epochs=1",
)


def final_weights(run: Path) -> dict[str, dict[str, torch.Tensor]]:
    return {
        name: load_file(run / "final" / name)
        for name in ("model.safetensors", "model_ema.safetensors")
    }


@pytest.fixture(scope="module")
def reference(tmp_path_factory) -> Path:
    """The uninterrupted run, without workers."""
    out = tmp_path_factory.mktemp("reference")
    torch.set_num_threads(1)
    Trainer(tiny_config(out, *ARGS)).fit()
    return out / "tiny"


def signal_at(trainer: Trainer, step: int, signum: int) -> None:
    """Send ``signum`` to this process in the middle of optimizer step ``step``."""

    def hook(optimizer, args, kwargs):
        if trainer.state.num_updates == step - 1:
            os.kill(os.getpid(), signum)

    trainer.optimizer.optimizer.register_step_pre_hook(hook)


@pytest.mark.parametrize(
    ("signum", "workers", "step"),
    [
        (signal.SIGTERM, 0, 13),  # mid-epoch 1
        (signal.SIGINT, 2, 57),  # mid-epoch 2, with workers
        (
            signal.SIGUSR1,
            2,
            STEPS,
        ),  # an epoch's last step: stops after validation and the epoch-end checkpoint
    ],
)
def test_a_stop_signal_checkpoints_the_step_and_resumes_exactly(
    reference, tmp_path, signum, workers, step
):
    cfg = tiny_config(tmp_path, *ARGS, f"data.num_workers={workers}")
    trainer = Trainer(cfg)
    signal_at(trainer, step, signum)
    handler_before = signal.getsignal(signum)
    with pytest.raises(TrainingInterrupted) as info:
        trainer.fit()
    assert signal.getsignal(signum) is handler_before and trainer.stop_signal == signum  # put back
    run, saved = trainer.run_dir, trainer.run_dir / "checkpoints" / f"ckpt-{step:09d}"
    assert info.value.exit_code == 128 + signum
    message = str(info.value)
    assert (
        f"stopped by {signal.Signals(signum).name}" in message
        and f"(optimizer step {step})" in message
    )
    assert f"saved {saved}" in message and f"`vit5 train --resume {run}`" in message
    assert list_checkpoints(run / "checkpoints")[-1] == saved and not (run / "final").exists()

    resumed = Trainer(cfg, resume=saved)
    assert resumed.state.num_updates == step
    resumed.fit()
    expected, actual = final_weights(reference), final_weights(run)
    for file, tensors in expected.items():
        assert tensors.keys() == actual[file].keys()
        for key, value in tensors.items():
            assert torch.equal(actual[file][key], value), (
                f"{file}:{key} differs from the uninterrupted run"
            )
    for key in ("val_top1", "val_loss", "ema_top1", "updates", "lr"):
        assert [r[key] for r in read_csv(run / "metrics.csv")] == [
            r[key] for r in read_csv(reference / "metrics.csv")
        ], key


def test_the_command_line_says_how_to_resume_and_exits_143(tmp_path, monkeypatch, capsys):
    after_update = LRSchedule.after_update

    def sigterm_at_step_7(self, num_updates):
        if num_updates == 7:
            os.kill(os.getpid(), signal.SIGTERM)
        after_update(self, num_updates)

    monkeypatch.setattr(LRSchedule, "after_update", sigterm_at_step_7)
    status = cli.main([*TINY, f"run.output_dir={tmp_path}"])
    err = capsys.readouterr().err
    assert status == 143
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith(
        "stopped: stopped by SIGTERM at epoch 1, batch 7"
    ), err
    assert f"vit5 train --resume {tmp_path / 'tiny'}" in err
    monkeypatch.undo()
    assert cli.main(["--resume", str(tmp_path / "tiny")]) == 0


SECOND_SIGNAL = """
import os, signal, sys
import torch
torch.set_num_threads(1)
from vit5.train import Trainer, load_config
trainer = Trainer(load_config(None, sys.argv[1:]))
def twice(optimizer, args, kwargs):
    if trainer.state.num_updates == 4:
        os.kill(os.getpid(), signal.SIGTERM)
        os.kill(os.getpid(), signal.SIGTERM)
trainer.optimizer.optimizer.register_step_pre_hook(twice)
trainer.fit()
"""


def test_a_second_signal_exits_at_once(tmp_path):
    result = subprocess.run(
        [sys.executable, "-c", SECOND_SIGNAL, *TINY, f"run.output_dir={tmp_path}"],
        cwd=REPO,
        env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == -signal.SIGTERM, result.stderr[-2000:]
    assert list_checkpoints(tmp_path / "tiny" / "checkpoints") == []  # it did not wait for the step

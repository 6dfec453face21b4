"""``--resume`` continues exactly: a run killed with SIGKILL mid-epoch, after a checkpoint, and resumed ends
with the same weights as an uninterrupted run with the same seed (exact resume)."""

import signal
import subprocess
import time
from pathlib import Path

import torch
from safetensors.torch import load_file
from test_train_support import TINY, run_train, train_command

from vit5.train.checkpointing import resolve_resume
from vit5.train.rundir import read_csv

# Every source of randomness on: 3-Augment (torch RNG), drop path (torch RNG), Mixup/CutMix (NumPy RNG).
ARGS = [
    *TINY,
    "aug.train=three_augment",
    "aug.hflip=0.5",
    "model.drop_path_rate=0.1",
    "schedule.epochs=2",
    "schedule.warmup_epochs=1",
    "checkpoint.every_steps=17",
]
STEPS_PER_EPOCH = 1438 // 32  # 44; checkpoints at steps 17, 34, 44 (epoch end), 51, 68, 85, 88


def wait_for(path: Path, process: subprocess.Popen, log: Path, timeout: float = 120) -> None:
    deadline = time.monotonic() + timeout
    while not path.is_dir():
        assert process.poll() is None, f"run ended before {path.name}:\n{log.read_text()}"
        assert time.monotonic() < deadline, f"no {path.name} after {timeout} s"
        time.sleep(0.005)


def test_sigkill_mid_epoch_then_resume_equals_an_uninterrupted_run(tmp_path):
    reference = run_train([*ARGS, f"run.output_dir={tmp_path / 'reference'}"], cwd=tmp_path)
    assert reference.returncode == 0, reference.stderr

    run_dir, log = tmp_path / "killed" / "tiny", tmp_path / "killed.log"
    command, env = train_command([*ARGS, f"run.output_dir={tmp_path / 'killed'}"])
    with open(log, "w") as out:
        process = subprocess.Popen(command, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT)
        wait_for(run_dir / "checkpoints" / "ckpt-000000051", process, log)  # epoch 2, batch 7
        process.send_signal(signal.SIGKILL)
        assert process.wait(timeout=30) == -signal.SIGKILL
    assert not (run_dir / "final").exists(), "the run finished before the kill; the test proves nothing"
    _, latest = resolve_resume(run_dir)
    resumed_at = int(latest.name.split("-")[1])
    assert resumed_at >= 51 and resumed_at % STEPS_PER_EPOCH != 0  # a mid-epoch checkpoint of epoch 2

    resumed = run_train(["--resume", str(run_dir)], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed        from {latest}" in resumed.stdout

    for file in ("model.safetensors", "model_ema.safetensors"):
        expected = load_file(tmp_path / "reference" / "tiny" / "final" / file)
        actual = load_file(run_dir / "final" / file)
        assert expected.keys() == actual.keys()
        for key in expected:
            torch.testing.assert_close(actual[key], expected[key], rtol=1e-6, atol=1e-6, msg=f"{file}:{key}")
    rows, reference_rows = (
        read_csv(run_dir / "metrics.csv"),
        read_csv(tmp_path / "reference" / "tiny" / "metrics.csv"),
    )
    assert [r["epoch"] for r in rows] == [1, 2]
    for key in ("val_top1", "val_loss", "ema_top1", "updates", "lr"):
        assert [r[key] for r in rows] == [r[key] for r in reference_rows], key

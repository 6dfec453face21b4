"""``--resume`` continues exactly: a run killed with SIGKILL mid-epoch, after a checkpoint, and resumed ends
with the same weights as an uninterrupted run with the same seed (exact resume)."""

import signal
import subprocess
import time
from pathlib import Path

import torch
from safetensors.torch import load_file
from test_train_support import TINY, run_train, train_command

from vit5.outputs import read_csv
from vit5.train.checkpointing import resolve_resume

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
        process = subprocess.Popen(
            command, cwd=tmp_path, env=env, stdout=out, stderr=subprocess.STDOUT
        )
        wait_for(run_dir / "checkpoints" / "ckpt-000000051", process, log)  # epoch 2, batch 7
        process.send_signal(signal.SIGKILL)
        assert process.wait(timeout=30) == -signal.SIGKILL
    assert not (run_dir / "final").exists(), (
        "the run finished before the kill; the test proves nothing"
    )
    _, latest = resolve_resume(run_dir)
    resumed_at = int(latest.name.split("-")[1])
    assert (
        resumed_at >= 51 and resumed_at % STEPS_PER_EPOCH != 0
    )  # a mid-epoch checkpoint of epoch 2

    resumed = run_train(["--resume", str(run_dir)], cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resumed        from {latest}" in resumed.stdout

    for file in ("model.safetensors", "model_ema.safetensors"):
        expected = load_file(tmp_path / "reference" / "tiny" / "final" / file)
        actual = load_file(run_dir / "final" / file)
        assert expected.keys() == actual.keys()
        for key in expected:
            torch.testing.assert_close(
                actual[key], expected[key], rtol=1e-6, atol=1e-6, msg=f"{file}:{key}"
            )
    rows, reference_rows = (
        read_csv(run_dir / "metrics.csv"),
        read_csv(tmp_path / "reference" / "tiny" / "metrics.csv"),
    )
    assert [r["epoch"] for r in rows] == [1, 2]
    for key in ("val_top1", "val_loss", "ema_top1", "updates", "lr"):
        assert [r[key] for r in rows] == [r[key] for r in reference_rows], key


def test_class_names_are_recorded_and_renamed_folders_refuse_resume(tmp_path, capsys):
    import json

    import pytest
    import timm
    from test_train_support import tiny_config

    import vit5
    from vit5.cli import train as cli
    from vit5.data import export_digits_imagefolder
    from vit5.train import ResumeError, TrainConfigError, Trainer, load_config

    root = tmp_path / "digits"
    export_digits_imagefolder(root, size=16)
    for split in ("train", "val"):
        for digit in "3456789":
            for f in (root / split / digit).iterdir():
                f.unlink()
            (root / split / digit).rmdir()
    cfg = tiny_config(tmp_path, "data.dataset=folder", f"data.root={root}")
    trainer = Trainer(cfg)
    trainer.fit()
    run = trainer.run_dir
    checkpoint = resolve_resume(run)[1]
    assert json.loads((checkpoint / "checkpoint.json").read_text())["config"]["data"][
        "class_names"
    ] == [
        "0",
        "1",
        "2",
    ]
    assert "class_names:\n  - '0'\n  - '1'\n  - '2'" in (run / "config.yaml").read_text()
    assert json.loads((run / "final" / "config.json").read_text())["label_names"] == ["0", "1", "2"]
    loaded = timm.create_model(f"local-dir:{run / 'final'}", pretrained=True)  # timm sees them too
    assert loaded.pretrained_cfg["label_names"] == ["0", "1", "2"]
    assert vit5.load_model(run).pretrained_cfg["label_names"] == ["0", "1", "2"]

    for split in ("train", "val"):
        (root / split / "2").rename(root / split / "two")
    assert cli.main(["--resume", str(run), "schedule.epochs=2"]) == 2
    err = capsys.readouterr().err
    assert (
        "trained on 3 classes (0, 1, 2) but the data now has 3 (0, 1, two); gone: 2; new: two"
        in err
    )
    with pytest.raises(ResumeError, match=r"gone: 2; new: two"):  # from Python too
        Trainer(
            tiny_config(tmp_path, "data.dataset=folder", f"data.root={root}"), resume=checkpoint
        )
    recorded = load_config(run / "config.yaml")  # a new run from a config that records its classes
    with pytest.raises(
        TrainConfigError, match=r"data\.class_names lists 3 classes \(0, 1, 2\) but the data"
    ):
        Trainer(recorded)

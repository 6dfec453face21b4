"""Experiment trackers through Accelerate (run.log_with): checked when the config is read, and a
TensorBoard run (offline) logs the per-step loss and lr and the per-epoch metrics under the run directory."""

import math

import accelerate.tracking
import pytest
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from test_train_support import single_thread, tiny_config  # noqa: F401 (autouse fixture)

from vit5.train import TrainConfigError, Trainer


def logged(cfg):
    trainer = Trainer(cfg)
    trainer.fit()
    events = EventAccumulator(str(trainer.run_dir / "logs" / "vit5"))
    events.Reload()
    return trainer, events


def test_tensorboard_logs_step_and_epoch_scalars_under_the_run_directory(tmp_path):
    trainer, events = logged(tiny_config(tmp_path, "run.log_with=tensorboard"))
    loss, lr = events.Scalars("train/loss"), events.Scalars("train/lr")
    steps = 1438 // 32  # digits: 1438 training images, batch 32
    assert [e.step for e in loss] == [e.step for e in lr] == list(range(1, steps + 1))
    row = trainer.state.history[0]
    # one process, full batches: the epoch's loss is the mean of the steps' losses
    assert math.isclose(sum(e.value for e in loss) / steps, row["train_loss"], rel_tol=1e-6)
    # step s ran at the cosine lr of update s - 1 (no warmup, T = all updates, min_lr 1e-5)
    for e in lr:
        expected = 1e-5 + (2e-3 - 1e-5) * (1 + math.cos(math.pi * (e.step - 1) / steps)) / 2
        assert math.isclose(e.value, expected, rel_tol=1e-6), e.step
    for key in ("val_top1", "ema_top1", "train_loss", "epoch"):
        (scalar,) = events.Scalars(f"epoch/{key}")
        assert scalar.step == steps and math.isclose(scalar.value, row[key], rel_tol=1e-6), key

    # every 11 steps: the mean of those 11 steps' losses
    _, sparse = logged(
        tiny_config(tmp_path / "sparse", "run.log_with=tensorboard", "run.log_every_steps=11")
    )
    means = sparse.Scalars("train/loss")
    assert [e.step for e in means] == [11, 22, 33, 44]
    for e in means:
        window = [s.value for s in loss if e.step - 11 < s.step <= e.step]
        assert math.isclose(e.value, sum(window) / 11, rel_tol=1e-5), e.step


def test_unknown_or_uninstalled_trackers_are_config_errors(tmp_path, monkeypatch):
    with pytest.raises(
        TrainConfigError,
        match=r"'tensorbord' is not an Accelerate tracker; did you mean tensorboard\?",
    ):
        tiny_config(tmp_path, "run.log_with=tensorbord")
    monkeypatch.setattr(accelerate.tracking, "get_available_trackers", lambda: [])
    with pytest.raises(
        TrainConfigError,
        match=r"the comet_ml tracker needs the comet-ml package.*pip install comet-ml",
    ) as info:
        tiny_config(tmp_path, "run.log_with=tensorboard, comet_ml")
    assert "pip install tensorboard" in str(info.value)  # every problem at once

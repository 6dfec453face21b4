"""A NaN loss stops the run with a message naming the step; the last good checkpoint stays loadable and
nothing is written from the diverged weights."""

import math

import pytest
import torch
from test_train_support import single_thread, tiny_config  # noqa: F401 (autouse fixture)

from vit5.train import Trainer, TrainingDiverged


def test_nan_loss_stops_and_keeps_the_last_good_checkpoint(tmp_path):
    cfg = tiny_config(tmp_path, "checkpoint.every_steps=5", "schedule.epochs=2")
    trainer = Trainer(cfg)
    criterion, calls = trainer.parts.criterion, [0]

    def nan_on_the_13th(logits, targets):
        calls[0] += 1
        loss = criterion(logits, targets)
        return loss * math.nan if calls[0] == 13 else loss

    trainer.parts.criterion = nan_on_the_13th
    at_step_10 = {}  # the post-hook runs inside the 10th step, before the loop counts it
    trainer.optimizer.optimizer.register_step_post_hook(
        lambda opt, a, k: (
            at_step_10.update({n: v.clone() for n, v in trainer.raw_model.state_dict().items()})
            if trainer.state.num_updates == 9
            else None
        )
    )
    with pytest.raises(TrainingDiverged) as info:
        trainer.fit()
    message = str(info.value)
    assert "loss is nan at epoch 1, batch 13 (optimizer step 13)" in message
    assert (
        "The last good checkpoint is" in message
        and "ckpt-000000010" in message
        and "--resume" in message
    )
    assert all(
        torch.isfinite(p).all() for p in trainer.raw_model.parameters()
    )  # NaN never reached the weights

    checkpoints = sorted(p.name for p in (trainer.run_dir / "checkpoints").iterdir())
    assert checkpoints == ["ckpt-000000005", "ckpt-000000010"]
    assert (
        not (trainer.run_dir / "final").exists() and not (trainer.run_dir / "summary.json").exists()
    )

    resumed = Trainer(cfg, resume=trainer.run_dir / "checkpoints" / "ckpt-000000010")
    assert (resumed.state.epoch, resumed.state.batch, resumed.state.num_updates) == (0, 10, 10)
    restored = resumed.raw_model.state_dict()
    assert at_step_10 and all(
        torch.equal(restored[name], value) for name, value in at_step_10.items()
    )
    summary = resumed.fit()  # and the run can go on from there
    assert summary["updates"] == 2 * (1438 // 32)

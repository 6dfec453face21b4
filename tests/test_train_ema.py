"""EMA (timm ModelEmaV3): updated once per real optimizer step with the configured decay, saved next
to the raw weights, and evaluated alongside them (checked against an independent evaluation)."""

import pytest
import torch
from test_train_support import single_thread, tiny_config  # noqa: F401 (autouse fixture)

import vit5
from vit5.data import DigitsDataset, eval_transform
from vit5.train import Trainer


def test_ema_follows_the_formula_and_is_evaluated_alongside_the_raw_weights(tmp_path):
    decay = 0.8
    cfg = tiny_config(
        tmp_path,
        "data.batch_size=64",
        "optim.accum_steps=2",
        f"ema.decay={decay}",
        "schedule.epochs=2",
    )
    trainer = Trainer(cfg)
    seen = []  # raw head weights after every real optimizer step
    trainer.optimizer.optimizer.register_step_post_hook(
        lambda opt, args, kwargs: seen.append(trainer.raw_model.head.weight.detach().clone())
    )
    summary = trainer.fit()
    assert len(seen) == trainer.state.num_updates == 2 * (1438 // 64 // 2)

    expected = seen[0].clone()  # the first update copies the weights (ModelEmaV3 decay 0 at step 1)
    for weights in seen[1:]:
        expected = decay * expected + (1 - decay) * weights
    torch.testing.assert_close(trainer.ema.module.head.weight, expected)
    assert not torch.allclose(expected, seen[-1])

    val = DigitsDataset("val", eval_transform(16), size=16)
    images, labels = torch.stack([val[i][0] for i in range(len(val))]), torch.tensor(val.targets)
    for use_ema, key in ((False, "final_top1"), (True, "ema_top1")):
        model = vit5.load_model(trainer.run_dir / "final", use_ema=use_ema).eval()
        with torch.no_grad():
            top1 = (model(images).argmax(-1) == labels).double().mean().item() * 100
        assert summary[key] == pytest.approx(top1, abs=0.3), (
            key
        )  # 0.3: one image of 359 may flip on rounding
    row = trainer.state.history[-1]
    assert row["ema_top1"] == summary["ema_top1"] and row["val_top1"] == summary["final_top1"]


@pytest.mark.parametrize(
    ("decay", "warmup", "scored"),
    [
        (0.99, False, [False, False, True]),
        (0.98, False, [False, True, True]),
        (0.99, True, [True] * 3),
    ],
)
def test_the_ema_is_validated_only_where_it_can_matter(tmp_path, decay, warmup, scored):
    """44 updates an epoch. Decay 0.99 averages over ~100 updates: before that the EMA mostly holds
    the starting weights and is validated at the last epoch only; decay 0.98 (~50) from epoch 2 on;
    with timm's warmup the EMA follows the run and is validated at every epoch."""
    cfg = tiny_config(tmp_path, f"ema.decay={decay}", f"ema.warmup={warmup}", "schedule.epochs=3")
    trainer = Trainer(cfg)
    trainer.fit()
    assert [row.get("ema_top1") is not None for row in trainer.state.history] == scored

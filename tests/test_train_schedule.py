"""The lr schedule advances only on real optimizer steps (gradient accumulation), per update or with the
official per-epoch lag; values checked against the cosine-with-warmup formula (timm
``CosineLRScheduler``, as main.py of github.com/wangf3014/ViT-5 steps it per epoch, commit b7b0796)."""

import math

import pytest
from test_train_support import single_thread, tiny_config  # noqa: F401 (autouse fixture)

from vit5.train import Trainer


def cosine_with_warmup(
    t: float, peak: float, warmup: float, total: float, warmup_lr: float, min_lr: float
) -> float:
    if t < warmup:
        return warmup_lr + t * (peak - warmup_lr) / warmup
    return min_lr + 0.5 * (peak - min_lr) * (1 + math.cos(math.pi * t / total))


def record_real_steps(trainer: Trainer) -> list[float]:
    """The lr of every step the wrapped torch optimizer really takes (Accelerate skips the others)."""
    lrs: list[float] = []
    trainer.optimizer.optimizer.register_step_pre_hook(
        lambda opt, args, kwargs: lrs.append(opt.param_groups[0]["lr"])
    )
    return lrs


def count_calls(trainer: Trainer) -> list[int]:
    calls = [0]
    criterion = trainer.parts.criterion

    def counted(logits, targets):
        calls[0] += 1
        return criterion(logits, targets)

    trainer.parts.criterion = counted
    return calls


def test_schedule_steps_once_per_optimizer_step_under_accumulation(tmp_path):
    peak, warmup_lr, min_lr = 2e-3, 1e-5, 1e-4
    cfg = tiny_config(
        tmp_path,
        "optim.accum_steps=3",
        "schedule.epochs=2",
        "schedule.warmup_epochs=1",
        f"optim.lr={peak}",
        f"schedule.warmup_lr={warmup_lr}",
        f"schedule.min_lr={min_lr}",
        "ema.enabled=false",
    )
    trainer = Trainer(cfg)
    lrs, micro = record_real_steps(trainer), count_calls(trainer)
    trainer.fit()
    per_epoch = 1438 // 32 // 3  # 44 micro-batches of 32 per epoch, truncated to 42 = 14 steps of 3
    assert micro[0] == 2 * per_epoch * 3
    assert len(lrs) == trainer.state.num_updates == 2 * per_epoch
    expected = [
        cosine_with_warmup(u, peak, per_epoch, 2 * per_epoch, warmup_lr, min_lr)
        for u in range(2 * per_epoch)
    ]
    assert lrs == pytest.approx(expected, rel=1e-9)


def test_epoch_interval_reproduces_the_official_one_epoch_lag(tmp_path):
    peak, warmup_lr, min_lr = 2e-3, 1e-5, 1e-4
    cfg = tiny_config(
        tmp_path,
        "data.batch_size=128",
        "schedule.epochs=3",
        "schedule.warmup_epochs=1",
        "schedule.interval=epoch",
        f"optim.lr={peak}",
        f"schedule.warmup_lr={warmup_lr}",
        f"schedule.min_lr={min_lr}",
        "ema.enabled=false",
    )
    trainer = Trainer(cfg)
    lrs = record_real_steps(trainer)
    trainer.fit()
    steps = 1438 // 128
    per_epoch = [lrs[e * steps : (e + 1) * steps] for e in range(3)]
    # epoch 0 runs at warmup_lr; epoch e >= 1 at lr(e - 1), stepped after each epoch as DeiT's main.py does
    expected = [
        warmup_lr,
        cosine_with_warmup(0, peak, 1, 3, warmup_lr, min_lr),
        cosine_with_warmup(1, peak, 1, 3, warmup_lr, min_lr),
    ]
    for epoch_lrs, lr in zip(per_epoch, expected, strict=True):
        assert epoch_lrs == pytest.approx([lr] * steps, rel=1e-9)
    assert expected[1] == warmup_lr and expected[2] == pytest.approx(
        min_lr + 0.75 * (peak - min_lr)
    )

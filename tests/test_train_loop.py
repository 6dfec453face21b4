"""The one training step of vit5 (vit5.train.loop) in plain PyTorch, as the register study and the depth
benchmark run it: against a hand-written step, and a NaN loss stopping it before backward."""

import copy
import math

import pytest
import torch
import torch.nn.functional as F
from timm.utils import ModelEmaV3
from torch import nn

from vit5.train.checkpointing import TrainState
from vit5.train.config import ScheduleSection
from vit5.train.loop import LRSchedule, NonFiniteLoss, StepParts, train_step, train_steps

SCHEDULE = ScheduleSection(
    epochs=4, warmup_epochs=1, warmup_lr=1e-3, min_lr=1e-4, interval="update"
)


def test_plain_step_is_forward_backward_clip_step_schedule_ema():
    model = nn.Sequential(nn.Linear(4, 8), nn.GELU(), nn.Linear(8, 3))
    ref, initial = copy.deepcopy(model), copy.deepcopy(model)
    optimizer, ref_optimizer = (torch.optim.AdamW(m.parameters(), lr=0.1) for m in (model, ref))
    ema, ref_ema = ModelEmaV3(model, decay=0.5), ModelEmaV3(ref, decay=0.5)
    ref_schedule = LRSchedule(ref_optimizer, SCHEDULE, updates_per_epoch=1)
    parts = StepParts(
        model=model,
        optimizer=optimizer,
        criterion=F.cross_entropy,
        schedule=LRSchedule(optimizer, SCHEDULE, updates_per_epoch=1),
        clip_grad=0.05,
        ema=ema,
    )
    batches = [(torch.randn(5, 4), torch.randint(0, 3, (5,))) for _ in range(3)]
    state = TrainState()
    losses = train_steps(parts, batches, state)

    for step, (x, y) in enumerate(batches, start=1):
        loss = F.cross_entropy(ref(x), y)
        assert losses[step - 1] == loss.item()
        loss.backward()
        nn.utils.clip_grad_norm_(ref.parameters(), 0.05)
        ref_optimizer.step()
        ref_optimizer.zero_grad()
        ref_schedule.after_update(step)
        ref_ema.update(ref, step=step)
    assert (state.batch, state.num_updates) == (3, 3)
    assert optimizer.param_groups[0]["lr"] == ref_optimizer.param_groups[0]["lr"] != 0.1
    for mine, theirs in ((model, ref), (ema.module, ref_ema.module)):
        for a, b in zip(mine.state_dict().values(), theirs.state_dict().values()):
            torch.testing.assert_close(a, b, rtol=0, atol=0)
    F.cross_entropy(initial(batches[0][0]), batches[0][1]).backward()  # the clip was active
    assert nn.utils.clip_grad_norm_(initial.parameters(), math.inf) > 0.05


def test_a_nan_loss_stops_the_step_before_backward():
    model = nn.Linear(4, 3)
    before = copy.deepcopy(model.state_dict())
    parts = StepParts(
        model=model,
        optimizer=torch.optim.SGD(model.parameters(), lr=1.0),
        criterion=lambda logits, y: F.cross_entropy(logits, y) * math.nan,
    )
    state = TrainState(batch=7, num_updates=7)
    with pytest.raises(
        NonFiniteLoss, match=r"loss is nan at epoch 1, batch 8 \(optimizer step 8\)"
    ):
        train_step(parts, torch.randn(2, 4), torch.tensor([0, 1]), state)
    assert all(p.grad is None for p in model.parameters())
    assert all(torch.equal(before[k], v) for k, v in model.state_dict().items())
    assert (state.batch, state.num_updates) == (7, 7)

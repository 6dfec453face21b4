"""The trainer's validation pass against top-k and cross-entropy computed directly on all logits."""

import pytest
import torch
import torch.nn.functional as F
from accelerate import Accelerator
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from vit5.train.loop import evaluate


@pytest.mark.parametrize("classes", [3, 10])
def test_evaluate_matches_a_direct_computation(classes):
    torch.manual_seed(0)
    images, labels = torch.randn(23, 6), torch.randint(0, classes, (23,))
    model = nn.Linear(6, classes)
    result = evaluate(
        model, DataLoader(TensorDataset(images, labels), batch_size=5), Accelerator(cpu=True)
    )
    with torch.no_grad():
        logits = model(images)
    k = min(5, classes)
    top5 = (logits.argsort(-1, descending=True)[:, :k] == labels[:, None]).any(
        1
    ).float().mean() * 100
    assert result.count == 23
    assert result.top1 == pytest.approx((logits.argmax(-1) == labels).float().mean().item() * 100)
    assert result.top5 == pytest.approx(top5.item())
    assert result.loss == pytest.approx(F.cross_entropy(logits, labels).item(), rel=1e-5)
    assert model.training  # the caller's mode is restored

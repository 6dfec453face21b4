"""Classification and segmentation metrics against scikit-learn on the same numbers."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from sklearn.metrics import (
    accuracy_score,
    confusion_matrix,
    jaccard_score,
    log_loss,
    top_k_accuracy_score,
)

from vit5.eval import ClassificationMeter, segmentation_scores
from vit5.eval import confusion_matrix as our_confusion


def test_classification_meter_matches_sklearn_over_uneven_batches():
    gen = torch.Generator().manual_seed(0)
    logits = torch.randn(203, 7, generator=gen) * 2
    targets = torch.randint(0, 7, (203,), generator=gen)
    logits[targets == 3, 3] += 3  # some signal, so top-1 is not near chance
    meter = ClassificationMeter(7)
    for start in range(0, 203, 37):
        meter.update(logits[start : start + 37], targets[start : start + 37])
    scores = meter.compute()
    y, p = targets.numpy(), torch.softmax(logits, 1).numpy()
    assert scores.num_images == 203
    assert scores.top1 == accuracy_score(y, p.argmax(1))
    assert scores.top5 == top_k_accuracy_score(y, p, k=5, labels=range(7))
    assert scores.loss == pytest.approx(log_loss(y, p, labels=range(7)), rel=1e-5)
    np.testing.assert_array_equal(
        scores.confusion, confusion_matrix(y, p.argmax(1), labels=range(7))
    )
    per_class = confusion_matrix(y, p.argmax(1), labels=range(7), normalize="true").diagonal()
    np.testing.assert_allclose(scores.per_class_accuracy, per_class)


def test_top5_uses_all_classes_when_there_are_fewer_than_five():
    meter = ClassificationMeter(3)
    meter.update(torch.tensor([[0.0, 1.0, 2.0], [3.0, 1.0, 0.0]]), torch.tensor([0, 1]))
    scores = meter.compute()
    assert (scores.top1, scores.top5) == (0.0, 1.0)


def test_segmentation_scores_match_sklearn_jaccard():
    rng = np.random.default_rng(0)
    target = rng.integers(0, 5, 4000)
    pred = np.where(rng.random(4000) < 0.6, target, rng.integers(0, 5, 4000))
    pred[pred == 4] = 0  # class 4 never predicted: IoU 0, still counted (it is in the labels)
    scores = segmentation_scores(
        our_confusion(torch.from_numpy(target), torch.from_numpy(pred), 6).numpy()
    )
    reference = jaccard_score(target, pred, labels=range(5), average=None)
    np.testing.assert_allclose(scores.iou[:5], reference)
    assert np.isnan(scores.iou[5])  # absent from labels and predictions: left out of the mean
    assert scores.miou == pytest.approx(reference.mean())
    assert scores.pixel_accuracy == pytest.approx(accuracy_score(target, pred))

"""Frozen-feature probes: a trained tiny model beats chance by far; features unrelated to the images do
not."""

from __future__ import annotations

import numpy as np
import pytest
from eval_helpers import TINY, digits_folder, single_thread, trained_checkpoint

from vit5.errors import InputError
from vit5.eval import (
    ProbeSettings,
    knn_accuracy,
    logreg_accuracy,
    open_split,
    probe_table,
    run_probes,
)
from vit5.introspect.load import load_spec

CHANCE = 0.1
SETTINGS = ProbeSettings(pools=("cls", "avg"), knn_k=(10,), batch_size=128)


@pytest.fixture(scope="module")
def splits():
    return open_split(digits_folder(), "train"), open_split(digits_folder(), "val")


@pytest.fixture(scope="module")
def trained_rows(splits):
    with single_thread():
        return run_probes(load_spec(str(trained_checkpoint())), *splits, SETTINGS, progress=False)


def _accuracy(rows, pool, method):
    (row,) = [r for r in rows if r.pool == pool and r.method == method]
    return row.accuracy


def test_trained_features_beat_chance_by_a_wide_margin(trained_rows):
    assert _accuracy(trained_rows, "cls", "logreg") > 0.8
    assert _accuracy(trained_rows, "cls", "knn-10") > 0.8
    assert _accuracy(trained_rows, "avg", "logreg") > 0.5
    table = probe_table(trained_rows, chance=CHANCE)
    assert "knn-10" in table and "logreg" in table and "chance 10.0 %" in table


def test_features_unrelated_to_the_images_stay_at_chance(splits):
    """The control: same shapes and labels, Gaussian features. A probe that leaked labels would pass here."""
    train, val = splits
    rng = np.random.default_rng(0)
    train_x, val_x = rng.normal(size=(len(train), 64)), rng.normal(size=(len(val), 64))
    train_y, val_y = np.array(train.targets), np.array(val.targets)
    assert abs(logreg_accuracy(train_x, train_y, val_x, val_y) - CHANCE) < 0.08
    assert abs(knn_accuracy(train_x, train_y, val_x, val_y, k=10) - CHANCE) < 0.08


def test_untrained_model_is_far_behind_the_trained_one_on_knn(splits, trained_rows):
    """A random ViT-5 (LayerScale 1e-4) leaves the CLS token almost constant: kNN cannot use it."""
    random_init = load_spec("vit5_tiny", TINY, random_init=True)
    settings = ProbeSettings(pools=("cls",), knn_k=(10,), batch_size=128)
    with single_thread():
        rows = run_probes(random_init, *splits, settings, progress=False)
    assert _accuracy(rows, "cls", "knn-10") < _accuracy(trained_rows, "cls", "knn-10") - 0.3


def test_probe_settings_are_validated():
    with pytest.raises(InputError, match=r"pools=\('mean',\) must be chosen"):
        ProbeSettings(pools=("mean",))

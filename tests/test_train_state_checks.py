"""A crafted ``train_state.json`` (issue 9; its hash updated in ``checkpoint.json``, as an attacker or a
hand edit would) is refused at load with one error line naming the field and the file, before training."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from test_train_reliability import rewrite_manifest
from test_train_support import single_thread, tiny_config  # noqa: F401 (autouse fixture)

from vit5.cli import train as cli
from vit5.train import Trainer


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("trained")
    torch.set_num_threads(1)
    Trainer(tiny_config(out, "checkpoint.every_steps=20")).fit()  # ckpt-20, ckpt-40, ckpt-44
    return out / "tiny"


@pytest.fixture
def run(trained, tmp_path) -> Path:
    copy = tmp_path / "runs" / "tiny"
    shutil.copytree(trained, copy)
    return copy


def junk_row(state):
    state["history"][0] = {"junk": 1}


def set_field(name, value):
    return lambda state: state.__setitem__(name, value)


@pytest.mark.parametrize(
    ("step", "edit", "named"),
    [
        (44, junk_row, "train_state.history[0] has no 'epoch'"),
        (44, lambda s: s["history"][0].__setitem__("val_top1", "high"), "history[0].val_top1='high'"),
        (20, set_field("batch", 10**12), "train_state.batch=1000000000000"),
        (20, set_field("batch", 21), "train_state.batch=21"),
        (44, set_field("num_updates", -50), "train_state.num_updates=-50: must be >= 0"),
        (20, set_field("num_updates", 28), "train_state.num_updates=28"),
        (44, set_field("epoch", -3), "train_state.epoch=-3: must be >= 0"),
        (44, set_field("epoch", 0), "train_state.epoch=0"),
        (20, set_field("epoch_samples", 7), "train_state.epoch_samples=7"),
        (44, set_field("best_epoch", 5), "train_state.best_epoch=5"),
        (44, set_field("best_top1", 99.5), "train_state.best_top1=99.5"),
        (44, set_field("wall_seconds", float("nan")), "train_state.wall_seconds=nan"),
        (44, set_field("images_seen", True), "images_seen=True is not of type int"),
    ],
)
def test_a_crafted_train_state_is_one_error_naming_the_field(run, capsys, step, edit, named):
    checkpoint = run / "checkpoints" / f"ckpt-{step:09d}"
    path = checkpoint / "train_state.json"
    record = json.loads(path.read_text())
    edit(record["train_state"])
    path.write_text(json.dumps(record))
    rewrite_manifest(checkpoint)
    status = cli.main(["--resume", str(checkpoint), "schedule.epochs=2"])
    err = capsys.readouterr().err
    assert status == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert str(path) in err and named in err, err
    assert sorted(p.name for p in run.parent.iterdir()) == ["tiny"]  # no fork left behind, nothing trained


def test_an_intact_state_still_loads(run):
    trainer = Trainer(
        tiny_config(run.parent, "schedule.epochs=2"), resume=run / "checkpoints" / "ckpt-000000020"
    )
    assert (trainer.state.epoch, trainer.state.batch, trainer.state.epoch_samples) == (0, 20, 20 * 32)
    trainer.close()

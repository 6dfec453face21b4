"""A crafted ``train_state.json`` (issue 9; its hash updated in ``checkpoint.json``, as an attacker or a
hand edit would) is refused at load with one error line naming the field and the file, before training."""

from __future__ import annotations

import json
import os
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
        (44, junk_row, "train_state.history[0] has no field 'epoch'"),
        (
            44,
            lambda s: s["history"][0].__setitem__("val_top1", "high"),
            "history[0].val_top1='high'",
        ),
        (20, set_field("batch", 10**12), "train_state.batch=1000000000000"),
        (20, set_field("batch", 21), "train_state.batch=21"),
        (44, set_field("num_updates", -50), "train_state.num_updates=-50 must be an integer >= 0"),
        (20, set_field("num_updates", 28), "train_state.num_updates=28"),
        (44, set_field("epoch", -3), "train_state.epoch=-3 must be an integer >= 0"),
        (44, set_field("epoch", 0), "train_state.epoch=0"),
        (20, set_field("epoch_samples", 7), "train_state.epoch_samples=7"),
        (44, set_field("best_epoch", 5), "train_state.best_epoch=5"),
        (44, set_field("best_top1", 99.5), "train_state.best_top1=99.5"),
        (44, set_field("wall_seconds", float("nan")), "train_state.wall_seconds=nan"),
        (
            44,
            set_field("images_seen", True),
            "train_state.images_seen=True must be an integer >= 0",
        ),
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
    assert sorted(p.name for p in run.parent.iterdir()) == [
        "tiny"
    ]  # no fork left behind, nothing trained


def test_an_intact_state_still_loads(run):
    trainer = Trainer(
        tiny_config(run.parent, "schedule.epochs=2"), resume=run / "checkpoints" / "ckpt-000000020"
    )
    assert (trainer.state.epoch, trainer.state.batch, trainer.state.epoch_samples) == (
        0,
        20,
        20 * 32,
    )
    trainer.close()


def edit_json(path: Path, edit) -> None:
    record = json.loads(path.read_text())
    edit(record)
    path.write_text(json.dumps(record))


def one_error(argv, capsys) -> str:
    status = cli.main(argv)
    err = capsys.readouterr().err
    lines = err.strip().splitlines()
    assert status == 2 and len(lines) == 1 and lines[0].startswith("error: "), err
    return err


def edit_torch(path: Path, edit) -> None:
    record = torch.load(path, weights_only=True)
    edit(record)
    torch.save(record, path)


def set_item(key, value):
    return lambda record: record.__setitem__(key, value)


def set_word(index, value):
    return lambda record: record["mt19937"].__setitem__(index, value)


RNG = "rng_state_0.pt"


@pytest.mark.parametrize(
    ("name", "edit", "named"),
    [
        (RNG, set_word((1, 624), 10**6), "mt19937[:, 624]=[624, 1000000] must be positions <= 624"),
        (
            RNG,
            set_word((1, slice(0, 624)), -1),
            "mt19937=a torch.int64 tensor of shape (2, 625), values -1..",
        ),
        (RNG, set_word((0, 0), 2**32), "must be 32-bit words"),
        (
            RNG,
            set_item("mt19937", torch.zeros(2, 625)),
            "float32 tensor of shape (2, 625), values 0.0..0.0 must be a torch.int64 tensor",
        ),
        (RNG, set_item("mt19937", torch.zeros(625, dtype=torch.int64)), "of shape (2, 625)"),
        (RNG, set_item("python_gauss", "x"), "python_gauss='x' must be a number or null"),
        (RNG, set_item("python_version", 7), "python_version=7 must be 3"),
        (
            RNG,
            set_item("torch", torch.zeros(4, dtype=torch.uint8)),
            "torch=a torch.uint8 tensor of shape (4,), values 0..0 must be torch's CPU generator state",
        ),
        (RNG, set_item("torch", torch.get_rng_state().int()), "must be a torch.uint8 tensor"),
        (RNG, set_item("cuda", [torch.get_rng_state()] * 9), "cuda=[5056, 5056,"),
        (RNG, lambda r: r.pop("numpy_gauss"), "the file has no field 'numpy_gauss'"),
        (RNG, set_item("extra", 1), "the file has an unknown field 'extra'"),
        ("checkpoint.json", set_item("num_processes", 0), "num_processes=0 must be"),
        ("checkpoint.json", lambda r: r["files"].__setitem__("x", {}), "files['x'] has no field"),
        (
            "checkpoint.json",
            lambda r: r["files"].__setitem__("../x", {"bytes": 1, "sha256": "0"}),
            "files=[",
        ),
        ("checkpoint.json", set_item("ema", "yes"), "ema='yes' must be true or false"),
    ],
)
def test_a_crafted_random_state_or_manifest_is_one_error_naming_the_field(
    run, capsys, name, edit, named
):
    checkpoint = run / "checkpoints" / "ckpt-000000020"
    if name == RNG:
        edit_torch(checkpoint / name, edit)
        rewrite_manifest(checkpoint)
    else:
        edit_json(checkpoint / name, edit)
    err = one_error(["--resume", str(checkpoint), "schedule.epochs=2"], capsys)
    assert f"{checkpoint / name} is damaged" in err and named in err, err
    assert sorted(p.name for p in run.parent.iterdir()) == ["tiny"]


def test_a_pickle_in_place_of_the_random_state_is_refused_unexecuted(run, capsys):
    """``torch.save`` of an arbitrary object (here a function reference) is a pickle payload:
    ``weights_only`` refuses it before anything runs, one error naming the file."""
    checkpoint = run / "checkpoints" / "ckpt-000000020"
    torch.save({"python_version": os.getcwd}, checkpoint / RNG)
    rewrite_manifest(checkpoint)
    err = one_error(["--resume", str(checkpoint), "schedule.epochs=2"], capsys)
    assert f"{checkpoint / RNG} contains pickled objects other than tensors" in err, err
    assert "refuses to execute" in err and "allow_inexact_resume=true" in err, err


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("batch", 10**12, "at most the 44 micro-batches of an epoch of this run"),
        ("epoch_samples", 7, "a multiple of data.batch_size x optim.accum_steps = 32"),
        ("epoch_samples", 32 * 10, "batch x data.batch_size x 1 process(es) = 640"),
        ("num_updates", 28, "train_state.num_updates=28 must be 20, as in ckpt-000000020"),
    ],
)
def test_a_position_crafted_in_both_state_and_manifest_is_refused(run, capsys, field, value, named):
    """An attacker who edits the manifest's copy of the position too meets the epoch's layout."""
    checkpoint = run / "checkpoints" / "ckpt-000000020"
    edit_json(checkpoint / "train_state.json", lambda r: r["train_state"].__setitem__(field, value))
    rewrite_manifest(checkpoint)
    edit_json(checkpoint / "checkpoint.json", lambda r: r.__setitem__(field, value))
    err = one_error(["--resume", str(checkpoint), "schedule.epochs=2"], capsys)
    assert f"{checkpoint / 'train_state.json'} is damaged" in err and named in err, err

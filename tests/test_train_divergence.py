"""Divergence (issue 17, items 1-2): a checkpoint counts as good only once its weights gave a finite loss;
pruning never removes the newest good one; a non-finite training loss, validation loss or weight stops the
run with ``TrainingDiverged`` (exit status 3), never "completed", never writing best/ or final/ from it."""

from __future__ import annotations

import json
import math
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_train_support import single_thread, tiny_config  # noqa: F401 (autouse fixture)

from vit5 import load_model
from vit5.cli import train as cli
from vit5.outputs import read_csv
from vit5.train import EXIT_DIVERGED, Trainer, TrainingDiverged
from vit5.train.checkpointing import is_verified, list_checkpoints

STEPS = 1438 // 32  # 44 optimizer steps per epoch


@pytest.fixture(scope="module")
def one_epoch(tmp_path_factory) -> Path:
    """A finished 1-epoch run with ``keep_last=1``, as the demo recipe keeps."""
    out = tmp_path_factory.mktemp("one_epoch")
    torch.set_num_threads(1)
    Trainer(tiny_config(out, "checkpoint.keep_last=1")).fit()
    return out / "tiny"


@pytest.fixture
def run(one_epoch, tmp_path) -> Path:
    copy = tmp_path / "runs" / "tiny"
    shutil.copytree(one_epoch, copy)
    return copy


def test_an_exploding_lr_keeps_the_last_good_checkpoint_and_names_it(run, capsys):
    """The reproduction of issue 17: the step after the resume still has a finite loss, its weights do not."""
    good = run / "checkpoints" / f"ckpt-{STEPS:09d}"
    assert is_verified(good)  # validated at the end of epoch 1
    status = cli.main(
        ["--resume", str(run), "optim.lr=3e38", "checkpoint.every_steps=1", "schedule.epochs=2"]
    )
    err = capsys.readouterr().err
    assert status == EXIT_DIVERGED
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: training diverged:"), err
    assert f"The last good checkpoint is {good};" in err and f"--resume {run}" in err
    assert list_checkpoints(run / "checkpoints") == [good], "the only good checkpoint was pruned"
    for aside in (run / "checkpoints").glob("*.diverged"):  # written from the weights that diverged
        assert not is_verified(aside)
    assert (
        json.loads((run / "summary.json").read_text())["epochs"] == 1
    )  # the old summary, not a new one

    # and it really is good (config.yaml records the lr as run: set it back)
    status = cli.main(["--resume", str(run), "schedule.epochs=2", "optim.lr=2e-3"])
    assert status == 0, capsys.readouterr().err
    assert all(
        torch.isfinite(v).all() for v in load_file(run / "final" / "model.safetensors").values()
    )


def blow_up_at(trainer: Trainer, step: int, factor: float) -> None:
    """Right after optimizer step ``step``, scale every weight by ``factor`` (a step that explodes)."""

    def hook(optimizer, args, kwargs):
        if (
            trainer.state.num_updates == step - 1
        ):  # the post-hook runs before the loop counts the step
            with torch.no_grad():
                for p in trainer.raw_model.parameters():
                    p.mul_(factor)

    trainer.optimizer.optimizer.register_step_post_hook(hook)


def test_a_run_that_diverges_on_its_last_step_does_not_complete(tmp_path):
    trainer = Trainer(tiny_config(tmp_path, "schedule.epochs=2", "checkpoint.every_steps=40"))
    blow_up_at(trainer, 2 * STEPS, 1e36)  # finite weights that overflow every forward pass
    with pytest.raises(TrainingDiverged, match=r"val_loss is (nan|inf) after epoch 2") as info:
        trainer.fit()
    run = trainer.run_dir
    best = load_model(run / "best")
    assert all(torch.isfinite(p).all() for p in best.parameters())  # epoch 1's, untouched
    assert json.loads((run / "best" / "config.json").read_text())["epoch"] == 1
    assert not (run / "final").exists() and not (run / "summary.json").exists()
    assert [r["epoch"] for r in read_csv(run / "metrics.csv")] == [
        1
    ]  # no row from the diverged weights
    names = [c.name for c in list_checkpoints(run / "checkpoints")]
    assert names[-1] == f"ckpt-{80:09d}" and f"ckpt-{2 * STEPS:09d}" not in names
    assert f"The last good checkpoint is {run / 'checkpoints' / names[-1]}" in str(info.value)


def test_non_finite_weights_are_never_checkpointed(tmp_path):
    trainer = Trainer(tiny_config(tmp_path, "checkpoint.every_steps=10"))
    blow_up_at(trainer, 20, math.inf)
    with pytest.raises(TrainingDiverged, match=r"a weight is not finite after optimizer step 20"):
        trainer.fit()
    checkpoints = trainer.run_dir / "checkpoints"
    assert [c.name for c in list_checkpoints(checkpoints)] == ["ckpt-000000010"]
    assert is_verified(checkpoints / "ckpt-000000010")  # steps 11-20 had finite losses


def test_pruning_keeps_the_newest_good_checkpoint_until_a_newer_one_is_verified(tmp_path):
    trainer = Trainer(tiny_config(tmp_path, "checkpoint.every_steps=5", "checkpoint.keep_last=1"))
    seen: list[tuple[int, list[str]]] = []
    save = trainer.checkpoints.save

    def save_and_list(num_updates):
        path = save(num_updates)
        seen.append((num_updates, [c.name for c in list_checkpoints(path.parent)]))
        return path

    trainer.checkpoints.save = save_and_list
    trainer.fit()
    # right after a save the new (unverified) checkpoint sits next to the newest good one
    assert seen[0] == (5, ["ckpt-000000005"])
    assert seen[1] == (10, ["ckpt-000000005", "ckpt-000000010"])
    final = list_checkpoints(trainer.run_dir / "checkpoints")
    assert [c.name for c in final] == [f"ckpt-{STEPS:09d}"] and is_verified(final[0])

"""The default demo config learns the digits (a cheap version: 2 blocks, 2 epochs), and the command line
reports bad input without a traceback."""

from pathlib import Path

import pytest
from test_train_support import REPO, single_thread  # noqa: F401 (autouse fixture)

import vit5
from vit5 import CheckpointError
from vit5.cli.train import main, parse_args, resolve
from vit5.train import Trainer, load_config

DEMO = REPO / "configs" / "demo_digits.yaml"


def test_demo_config_learns_the_digits_in_seconds(tmp_path):
    overrides = [
        "model.overrides.depth=2",
        "schedule.epochs=2",
        "schedule.warmup_epochs=0.2",
        f"run.output_dir={tmp_path}",
        "run.progress=false",
    ]
    summary = Trainer(load_config(DEMO, overrides)).fit()
    assert summary["final_top1"] > 60  # chance is 10%; the full demo reaches > 97%
    run = Path(summary["run_dir"])
    assert run.name == "demo_digits" and (run / "final" / "model.safetensors").is_file()

    # `--resume` without a directory continues run.output_dir/run.name; overrides are reported
    cfg, checkpoint, notes = resolve(
        parse_args(["--resume", *overrides, "schedule.epochs=3"]), DEMO
    )
    assert checkpoint == run / "checkpoints" / "ckpt-000000044" and cfg.schedule.epochs == 3
    assert notes == ["changed on resume: schedule.epochs: 2 -> 3"]

    # a training checkpoint, or their folder, given where a model goes: what it is and the run's models
    for given in (checkpoint, checkpoint.parent):
        with pytest.raises(CheckpointError, match="not a model folder") as err:
            vit5.load_model(given)
        assert f"the run's model folders: {run / 'final'}, {run / 'best'}" in str(err.value)


def test_command_line_errors_exit_2_with_a_message_and_no_traceback(tmp_path, capsys):
    run = tmp_path / "run"  # the folders a user may give --resume by mistake, by their names only
    (run / "checkpoints" / "ckpt-000000005").mkdir(parents=True)
    (run / "final").mkdir()
    (run / "final" / "model.safetensors").touch()
    cases = [
        (
            ["optim.lrr=1"],
            "error: command line 'optim.lrr=1': optim.lrr is not a setting. Did you mean optim.lr?",
        ),
        (
            ["--config", str(REPO / "configs" / "vit5_small_in1k.yaml")],
            "required setting(s) data.root not given",
        ),
        (["--resume", str(tmp_path / "gone")], "no such run directory"),
        (
            ["--resume", str(run / "checkpoints")],
            f"this is a run's folder of checkpoints; give the run directory (--resume {run}, its "
            f"newest checkpoint) or one checkpoint (--resume {run / 'checkpoints' / 'ckpt-000000005'})",
        ),
        (
            ["--resume", str(run / "final")],
            f"this is a model folder (weights and config.json, as a run's best/ and final/), which "
            f"holds no optimizer state or position; to continue its run, --resume {run}; to train "
            f"from its weights, model.pretrained={run / 'final'} without --resume",
        ),
        (["--resume", str(tmp_path), "--config", str(DEMO)], "drop --config"),
        (["data.dataset=folder", f"data.root={tmp_path}"], "data.train_split='train'"),
    ]
    for argv, message in cases:
        assert main(argv) == 2, argv  # no --config: the packaged demo recipe
        err = capsys.readouterr().err
        assert message in err and "Traceback" not in err, err

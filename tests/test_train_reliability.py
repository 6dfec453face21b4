"""What a checkpoint handed to ``--resume`` can and cannot do, and what a crash or a full disk leaves.

Resume runs no pickled code, deletes nothing of a newer timeline, names a damaged file and the last
good checkpoint, refuses a missing random state (or records an inexact resume); ``best/`` is never a
mix of two epochs; two writers of one run are refused; a full disk or a read-only folder is one line.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file
from test_train_support import single_thread, tiny_config  # noqa: F401 (autouse fixture)

import vit5.runtime
from vit5.cli import train as cli
from vit5.errors import StorageError, Vit5Error
from vit5.files import LOCK_NAME
from vit5.train import ResumeError, TrainConfigError, Trainer
from vit5.train.checkpointing import list_checkpoints, save_model_dir

RUN_ARGS = (
    "checkpoint.every_steps=10",
)  # checkpoints at steps 10, 20, 30, 40 and 44 (the epoch end)


class Killed(BaseException):
    """Stands in for SIGKILL: nothing after it runs (not even ``except Exception``)."""


@pytest.fixture(scope="module")
def trained(tmp_path_factory) -> Path:
    """One finished tiny run (1 epoch, 5 checkpoints); tests work on copies of it."""
    out = tmp_path_factory.mktemp("trained")
    torch.set_num_threads(1)
    Trainer(tiny_config(out, *RUN_ARGS)).fit()
    return out / "tiny"


@pytest.fixture
def run(trained, tmp_path) -> Path:
    copy = tmp_path / "runs" / "tiny"
    shutil.copytree(trained, copy)
    return copy


def ckpt(run: Path, step: int) -> Path:
    return run / "checkpoints" / f"ckpt-{step:09d}"


def resume(run_or_checkpoint: Path, *overrides: str, capsys=None) -> tuple[int, str]:
    """``train.py --resume PATH ...`` in-process: exit status and stderr."""
    status = cli.main(["--resume", str(run_or_checkpoint), *overrides])
    return status, capsys.readouterr().err if capsys is not None else ""


def rewrite_manifest(checkpoint: Path) -> None:
    """Do what an attacker can: make the manifest vouch for the modified files."""
    manifest_path = checkpoint / "checkpoint.json"
    if manifest_path.exists():
        manifest = json.loads(manifest_path.read_text())
        for name in manifest["files"]:
            data = (checkpoint / name).read_bytes()
            manifest["files"][name] = {
                "bytes": len(data),
                "sha256": hashlib.sha256(data).hexdigest(),
            }
        manifest_path.write_text(json.dumps(manifest))


class Payload:
    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_resume_never_runs_code_from_the_checkpoint_folder(run, tmp_path, capsys):
    marker = tmp_path / "pwned"
    latest = ckpt(run, 44)
    pickles = [p for p in latest.iterdir() if p.suffix in (".pkl", ".bin", ".pt")]
    assert pickles
    for path in pickles:  # every file that goes through a pickle loader carries the payload
        torch.save({"state": Payload(marker), "param_groups": []}, path)
    rewrite_manifest(latest)
    status, err = resume(run, capsys=capsys)
    assert not marker.exists(), "the checkpoint ran code"
    assert status == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: ")
    assert "optimizer.pt" in err and "posix.system" in err and "refuses to execute" in err


def test_a_pickle_based_checkpoint_is_refused_not_loaded(run, tmp_path, capsys):
    marker = tmp_path / "pwned"
    legacy = ckpt(run, 44)
    for path in legacy.iterdir():
        path.unlink()
    torch.save({"epoch": Payload(marker)}, legacy / "custom_checkpoint_0.pkl")
    status, err = resume(run, capsys=capsys)
    assert status == 2 and not marker.exists()
    assert "not a complete training checkpoint" in err and "checkpoint.json" in err


def test_resuming_an_older_checkpoint_forks_and_deletes_nothing(run):
    before = {
        p.name: sorted(f.name for f in p.iterdir()) for p in list_checkpoints(run / "checkpoints")
    }
    best_before = (run / "best" / "model.safetensors").read_bytes()
    trainer = Trainer(
        tiny_config(run.parent, *RUN_ARGS, "checkpoint.keep_last=1"), resume=ckpt(run, 20)
    )
    fork = run.parent / "tiny-2"
    assert trainer.run_dir == fork
    assert (fork / "checkpoints" / ckpt(run, 20).name / "checkpoint.json").is_file()
    assert "forked from" in (fork / "config.yaml").read_text()
    summary = trainer.fit()  # saves 30, 40, 44 in the fork; keep_last=1 prunes the fork only
    after = {
        p.name: sorted(f.name for f in p.iterdir()) for p in list_checkpoints(run / "checkpoints")
    }
    assert after == before, "the original run lost or changed checkpoints"
    assert (run / "best" / "model.safetensors").read_bytes() == best_before
    assert [p.name for p in list_checkpoints(fork / "checkpoints")] == ["ckpt-000000044"]
    assert summary["forked_from"] == str(ckpt(run, 20)) and summary["resume_exact"] is True
    assert "forked from" in (fork / "summary.txt").read_text()


def test_a_fork_that_cannot_start_leaves_no_directory(run, capsys):
    path = ckpt(run, 20) / "optimizer.pt"
    path.write_bytes(path.read_bytes()[:-1])
    status, err = resume(ckpt(run, 20), capsys=capsys)
    assert status == 2 and f"{path} is damaged" in err
    assert sorted(p.name for p in run.parent.iterdir()) == ["tiny"]


def test_resuming_the_latest_checkpoint_continues_in_place(run):
    trainer = Trainer(tiny_config(run.parent, *RUN_ARGS, "schedule.epochs=2"), resume=ckpt(run, 44))
    assert trainer.run_dir == run and not (run.parent / "tiny-2").exists()
    trainer.close()


@pytest.mark.parametrize(
    ("name", "damage"),
    [
        ("model.safetensors", lambda b: b[: len(b) // 2]),  # truncated
        ("model_ema.safetensors", lambda b: b""),  # emptied
        ("optimizer.pt", lambda b: os.urandom(len(b))),  # random bytes
        ("train_state.json", lambda b: b.replace(b'"epoch"', b'"epocj"')),  # modified
        ("checkpoint.json", lambda b: b[:10]),  # the manifest itself
    ],
)
def test_a_damaged_checkpoint_file_is_one_error_naming_it_and_the_last_good_one(
    run, capsys, name, damage
):
    path = ckpt(run, 44) / name
    path.write_bytes(damage(path.read_bytes()))
    status, err = resume(run, capsys=capsys)
    assert status == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: "), err
    assert str(path) in err and "damaged" in err
    assert f"last good checkpoint of this run is {ckpt(run, 40)}" in err


def test_a_missing_random_state_is_an_error_unless_an_inexact_resume_is_allowed(run, capsys):
    latest = ckpt(run, 44)
    (rng,) = [p for p in latest.iterdir() if p.name.startswith(("rng_state", "random_states"))]
    rng.write_bytes(rng.read_bytes()[:50])
    status, err = resume(run, "schedule.epochs=2", capsys=capsys)
    assert status == 2 and str(rng) in err and "allow_inexact_resume=true" in err

    status = cli.main(
        ["--resume", str(run), "schedule.epochs=2", "checkpoint.allow_inexact_resume=true"]
    )
    out = capsys.readouterr().out
    assert status == 0
    assert "WARNING" in out and "not an exact continuation" in out
    summary = json.loads((run / "summary.json").read_text())
    assert (
        summary["resume_exact"] is False
        and "resume_exact     false" in (run / "summary.txt").read_text()
    )


def test_resume_checks_the_config_the_checkpoint_was_written_with(run):
    config = run / "config.yaml"
    config.write_text(
        config.read_text().replace("batch_size: 32", "batch_size: 64")
    )  # edited by hand
    with pytest.raises(ResumeError, match=r"cannot change data\.batch_size: 32 -> 64"):
        cli.resolve(cli.parse_args(["--resume", str(run)]), Path("unused.yaml"))


def test_a_second_writer_of_a_run_is_refused_naming_the_first(run, capsys):
    first = Trainer(tiny_config(run.parent, *RUN_ARGS, "schedule.epochs=2"), resume=ckpt(run, 44))
    status, err = resume(run, "schedule.epochs=2", capsys=capsys)
    assert status == 2 and f"in use by pid {os.getpid()}" in err and "kill" in err
    first.close()
    # a lock left by a process that is gone (its record names a dead pid) is simply taken over
    (run / LOCK_NAME).write_text(json.dumps({"pid": 999999, "host": "elsewhere"}))
    second = Trainer(tiny_config(run.parent, *RUN_ARGS, "schedule.epochs=2"), resume=ckpt(run, 44))
    assert json.loads((run / LOCK_NAME).read_text())["pid"] == os.getpid()
    second.close()


def test_a_kill_while_best_is_written_leaves_the_old_best_whole(run):
    trainer = Trainer(tiny_config(run.parent, *RUN_ARGS, "schedule.epochs=2"), resume=ckpt(run, 44))
    best = run / "best"
    old = {f.name: f.read_bytes() for f in best.iterdir()}
    state_dict, calls = trainer.raw_model.state_dict, []

    def dies_while_writing(*args, **kwargs):  # the weights are being written
        calls.append(1)
        if len(calls) == 1:
            raise Killed
        return state_dict(*args, **kwargs)

    trainer.raw_model.state_dict = dies_while_writing
    with torch.no_grad():
        trainer.raw_model.head.bias.add_(1.0)
    with pytest.raises(Killed):
        save_model_dir(trainer.accelerator, trainer.model, trainer.ema, best, {"epoch": 99})
    assert {f.name: f.read_bytes() for f in best.iterdir()} == old, "best/ mixes two epochs"
    del trainer.raw_model.state_dict
    trainer.close()
    Trainer(tiny_config(run.parent, *RUN_ARGS, "schedule.epochs=2"), resume=ckpt(run, 44)).close()
    assert sorted(p.name for p in run.iterdir() if p.name.startswith(".")) == [LOCK_NAME], (
        "stray files"
    )


def test_a_full_disk_during_a_save_is_one_error_and_keeps_the_last_checkpoint(
    run, monkeypatch, capsys
):
    trainer = Trainer(tiny_config(run.parent, *RUN_ARGS, "schedule.epochs=2"), resume=ckpt(run, 44))
    before = sorted(p.name for p in (run / "checkpoints").iterdir())

    def disk_full(fd, data):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "write", disk_full)
    with pytest.raises(
        StorageError, match=r"cannot write .*ckpt-000000099.*no space left on device"
    ):
        trainer.checkpoints.save(99)
    for name in ("final", "best"):
        with pytest.raises(StorageError, match=r"no space left on device"):
            save_model_dir(
                trainer.accelerator, trainer.model, trainer.ema, run / name, {"epoch": 1}
            )
    monkeypatch.undo()
    assert sorted(p.name for p in (run / "checkpoints").iterdir()) == before  # nothing partial left
    assert load_file(run / "final" / "model.safetensors")  # the old final/ is intact
    assert sorted(p.name for p in run.iterdir() if p.name.startswith(".")) == [
        LOCK_NAME
    ]  # no .tmp-best
    trainer.close()


def test_a_read_only_output_folder_is_one_line(tmp_path, monkeypatch, capsys):
    def read_only(path, mode=0o777, **kwargs):
        raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(os, "mkdir", read_only)
    status = cli.main(
        ["data.dataset=digits", f"run.output_dir={tmp_path / 'ro' / 'runs'}", "run.name=x"]
    )
    err = capsys.readouterr().err
    assert status == 2 and err.count("\n") == 1
    assert "read-only file system" in err and str(tmp_path / "ro") in err


def test_a_model_or_a_step_too_large_is_refused_before_allocation(tmp_path, monkeypatch):
    with pytest.raises(TrainConfigError, match=r"depth 100000.*model\.max_params"):
        tiny_config(tmp_path, "model.overrides.depth=100000")
    assert (
        tiny_config(
            tmp_path, "model.overrides.depth=100000", "model.max_params=1e12"
        ).model.max_params
        == 1e12
    )
    monkeypatch.setattr(vit5.runtime, "available_memory", lambda device: 2**20)  # 1 MiB left
    with pytest.raises(
        Vit5Error,
        match=r"training vit5_tiny at 16px \(9 tokens per image\) with data.batch_size=32 "
        r"needs about .* but cpu has 1.00 MiB available; lower data.batch_size",
    ):
        Trainer(tiny_config(tmp_path))
    assert not (tmp_path / "tiny").exists()  # refused before the run directory was made

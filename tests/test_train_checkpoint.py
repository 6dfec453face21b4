"""Checkpoints are atomic (a kill during a save leaves the previous one loadable), the last K are kept,
and ``--resume`` restores weights, optimizer, EMA and progress."""

from pathlib import Path

import pytest
import torch
from test_train_support import single_thread, tiny_config  # noqa: F401 (autouse fixture)

from vit5.train import ResumeError, Trainer, checkpointing
from vit5.train.checkpointing import resolve_resume


class Killed(BaseException):
    """Stands in for SIGKILL: nothing after it runs (not even ``except Exception``)."""


def names(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir())


def test_kill_during_save_leaves_the_previous_checkpoint_loadable(tmp_path, monkeypatch):
    trainer = Trainer(tiny_config(tmp_path, "checkpoint.keep_last=2"))
    with pytest.raises(ResumeError, match="no complete checkpoint yet"):
        resolve_resume(trainer.run_dir)
    with torch.no_grad():
        trainer.raw_model.head.bias.add_(1.0)
    trainer.state.num_updates, trainer.state.batch, trainer.state.epoch_samples = 5, 5, 5 * 32
    good = trainer.checkpoints.save(5)
    saved_bias = trainer.raw_model.head.bias.detach().clone()

    def dies_halfway(path, data, durable=True):
        Path(path).write_bytes(data[:100])  # the process died while writing the weights
        raise Killed

    monkeypatch.setattr(checkpointing, "atomic_write_bytes", dies_halfway)
    with torch.no_grad():
        trainer.raw_model.head.bias.add_(1.0)
    trainer.state.num_updates = 9
    with pytest.raises(Killed):
        trainer.checkpoints.save(9)
    checkpoints = trainer.run_dir / "checkpoints"
    assert names(checkpoints) == [".tmp-ckpt-000000009", "ckpt-000000005"]
    assert resolve_resume(trainer.run_dir) == (trainer.run_dir, good)

    monkeypatch.undo()
    trainer.close()  # the killed process's lock is gone with it
    resumed = Trainer(tiny_config(tmp_path, "checkpoint.keep_last=2"), resume=good)
    torch.testing.assert_close(resumed.raw_model.head.bias, saved_bias, rtol=0, atol=0)
    assert (resumed.state.num_updates, resumed.state.batch) == (5, 5)
    for n in (6, 7, 8):
        resumed.state.num_updates = n
        resumed.checkpoints.save(n)
    assert names(checkpoints) == [
        "ckpt-000000007",
        "ckpt-000000008",
    ]  # keep_last=2, the partial one cleaned up


def test_resume_restores_optimizer_and_ema(tmp_path):
    cfg = tiny_config(tmp_path, "schedule.epochs=1", "checkpoint.every_steps=20")
    trainer = Trainer(cfg)
    ema_at_save, save = {}, trainer.checkpoints.save

    def save_and_snapshot(num_updates):
        ema_at_save[num_updates] = {
            k: v.clone() for k, v in trainer.ema.module.state_dict().items()
        }
        return save(num_updates)

    trainer.checkpoints.save = save_and_snapshot
    trainer.fit()
    ckpt = trainer.run_dir / "checkpoints" / "ckpt-000000020"
    changed = tiny_config(
        tmp_path, "schedule.epochs=1", "checkpoint.every_steps=20", "optim.weight_decay=0.3"
    )
    resumed = Trainer(changed, resume=ckpt)
    assert (resumed.state.epoch, resumed.state.batch, resumed.state.num_updates) == (0, 20, 20)
    state = resumed.optimizer.state_dict()["state"]
    assert state and all(int(s["step"]) == 20 for s in state.values())
    for name, value in resumed.ema.module.state_dict().items():
        torch.testing.assert_close(
            value, ema_at_save[20][name], rtol=0, atol=0
        )  # the EMA of step 20
    decays = {g["weight_decay"] for g in resumed.optimizer.param_groups}
    assert decays == {0.0, 0.3}  # the setting changed on resume wins over the checkpoint's groups
    assert resumed.state.history == []  # the epoch-1 row was written after this checkpoint


def test_resume_refuses_changes_the_checkpoint_depends_on(tmp_path):
    from vit5.cli.train import parse_args, resolve

    cfg = tiny_config(tmp_path, "schedule.epochs=1")
    Trainer(cfg).fit()
    run_dir = tmp_path / cfg.run.name
    args = parse_args(["--resume", str(run_dir), "data.batch_size=128", "optim.lr=1e-4"])
    with pytest.raises(
        ResumeError, match=r"cannot change data\.batch_size: 32 -> 128.*model\.pretrained="
    ):
        resolve(args, Path("unused.yaml"))
    _, _, notes = resolve(
        parse_args(["--resume", str(run_dir), "optim.lr=1e-4"]), Path("unused.yaml")
    )
    assert notes == [f"changed on resume: optim.lr: {cfg.optim.lr!r} -> 0.0001"]


def write_v1_checkpoint(folder: Path, trainer: Trainer, fmt: str) -> dict[str, object]:
    """A 10-step checkpoint laid out by hand as vit5-train-checkpoint/1 (cda8667) writes it, with no
    vit5 writer involved; returns the draws its random states give next."""
    import base64
    import hashlib
    import json
    import random

    import numpy as np
    from safetensors.torch import save_file

    folder.mkdir(parents=True)
    save_file(trainer.raw_model.state_dict(), folder / "model.safetensors")
    save_file(trainer.ema.module.state_dict(), folder / "model_ema.safetensors")
    torch.save(trainer.optimizer.state_dict(), folder / "optimizer.pt")
    position = {"epoch": 0, "batch": 10, "epoch_samples": 320, "num_updates": 10}
    times = {"train_seconds": 1.5, "wall_seconds": 2.0, "images_seen": 320, "history": []}
    state = position | {"best_top1": -1.0, "best_epoch": -1} | times
    record = {"train_state": state, "accelerator_step": 10, "grad_scaler": None}
    (folder / "train_state.json").write_text(json.dumps(record, indent=1))
    random.seed(1)
    np.random.seed(2)
    torch.manual_seed(3)
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    numpy_state = dict(
        kind=kind, keys=keys.tolist(), pos=pos, has_gauss=has_gauss, cached_gaussian=cached
    )
    rng = {
        "format": "vit5-rng/1",
        "python": {"version": version, "state": list(internal), "gauss_next": gauss},
        "numpy": numpy_state,
        "torch": base64.b64encode(torch.get_rng_state().numpy().tobytes()).decode("ascii"),
        "cuda": [],
    }
    (folder / "rng_state_0.json").write_text(json.dumps(rng, indent=1))
    draws = {"python": random.random(), "numpy": np.random.rand(), "torch": torch.rand(3)}
    files = {}
    for path in sorted(folder.iterdir()):
        data = path.read_bytes()
        files[path.name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    manifest = {"format": fmt} | position | {"num_processes": 1, "ema": True}
    manifest |= {"config": trainer.checkpoints.config, "files": files}
    (folder / "checkpoint.json").write_text(json.dumps(manifest, indent=1))
    return draws


def test_a_checkpoint_written_the_format_1_way_resumes_exactly(tmp_path):
    import json
    import random

    import numpy as np

    first = Trainer(tiny_config(tmp_path))
    with torch.no_grad():
        first.raw_model.head.bias.add_(1.0)
    saved_bias = first.raw_model.head.bias.detach().clone()
    checkpoint = first.run_dir / "checkpoints" / "ckpt-000000010"
    draws = write_v1_checkpoint(checkpoint, first, "vit5-train-checkpoint/1")
    first.close()
    resumed = Trainer(tiny_config(tmp_path), resume=checkpoint)
    assert resumed.run_dir == first.run_dir and resumed.resume_exact is True
    state = resumed.state
    assert (state.epoch, state.batch, state.epoch_samples, state.num_updates) == (0, 10, 320, 10)
    torch.testing.assert_close(resumed.raw_model.head.bias, saved_bias, rtol=0, atol=0)
    assert random.random() == draws["python"] and np.random.rand() == draws["numpy"]
    torch.testing.assert_close(torch.rand(3), draws["torch"], rtol=0, atol=0)
    written = resumed.checkpoints.save(10)  # saved again now: format 2, swapped in place
    manifest = json.loads((written / "checkpoint.json").read_text())
    assert manifest["format"] == "vit5-train-checkpoint/2", manifest["format"]
    assert sorted(p.name for p in written.glob("rng_state_*")) == ["rng_state_0.pt"]
    resumed.close()


def test_a_checkpoint_of_another_format_is_one_error_naming_it_and_the_fix(tmp_path):
    first = Trainer(tiny_config(tmp_path))
    checkpoint = first.run_dir / "checkpoints" / "ckpt-000000010"
    write_v1_checkpoint(checkpoint, first, "vit5-train-checkpoint/3")
    first.close()
    expected = (
        r"checkpoint\.json is damaged or from another vit5 \(format='vit5-train-checkpoint/3' must be "
        r"'vit5-train-checkpoint/2' or 'vit5-train-checkpoint/1', the formats this vit5 reads: resume "
        r"the run with the vit5 that wrote it, or start from its weights \(vit5 train \.\.\. "
        r"model\.pretrained=RUN/final\)\)"
    )
    with pytest.raises(ResumeError, match=expected):
        Trainer(tiny_config(tmp_path), resume=checkpoint)


def test_a_crafted_format_1_random_state_is_one_error_naming_the_file(tmp_path):
    import hashlib
    import json

    first = Trainer(tiny_config(tmp_path))
    checkpoint = first.run_dir / "checkpoints" / "ckpt-000000010"
    write_v1_checkpoint(checkpoint, first, "vit5-train-checkpoint/1")
    first.close()
    rng = checkpoint / "rng_state_0.json"
    record = json.loads(rng.read_text())
    record["numpy"]["pos"] = 10**6
    rng.write_text(json.dumps(record))
    manifest = json.loads((checkpoint / "checkpoint.json").read_text())
    data = rng.read_bytes()
    manifest["files"][rng.name] = {"bytes": len(data), "sha256": hashlib.sha256(data).hexdigest()}
    (checkpoint / "checkpoint.json").write_text(json.dumps(manifest))
    with pytest.raises(ResumeError) as info:
        Trainer(tiny_config(tmp_path), resume=checkpoint)
    message = str(info.value)
    assert f"{rng} is damaged" in message and "mt19937[:, 624]=[624, 1000000]" in message, message

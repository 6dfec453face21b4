"""Elastic resume (issue 18, part 2) and stop signals under several processes (gloo on the CPU): a
checkpoint written by 2 processes continues on 1 and one of 1 on 2. Weights, optimizer, EMA, counters and
the lr-schedule position carry over; the rest of the epoch trains exactly the samples an uninterrupted run
had left (the epoch's global order depends on seed and epoch only). A stop signal on one rank stops both at
the same step."""

from __future__ import annotations

import json
import signal
from pathlib import Path

import torch
from safetensors.torch import load_file
from test_train_support import TINY, launch_two, single_thread, tiny_config  # noqa: F401 (autouse fixture)

from vit5.data import DigitsDataset, build_transform
from vit5.train import Trainer
from vit5.train.checkpointing import list_checkpoints

WORKER = '''
import json, os, signal, sys
from pathlib import Path
import torch
torch.set_num_threads(1)
from vit5.data import DigitsDataset, build_transform
from vit5.train import Trainer, TrainingInterrupted, load_config

trainer = None
class Recording(DigitsDataset):
    """Digits that remember which samples this process loaded, and in which epoch."""
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen = []
    def __getitem__(self, index):
        self.seen.append([trainer.state.epoch, int(index)])
        return super().__getitem__(index)

out, resume, signal_rank, signal_step = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
train = Recording("train", build_transform("none", 16), size=16)
val = DigitsDataset("val", build_transform("eval", 16), size=16)
trainer = Trainer(load_config(None, sys.argv[5:]), resume=Path(resume) if resume else None,
                  train_set=train, val_set=val)
acc = trainer.accelerator
def hook(optimizer, args, kwargs):
    if acc.process_index == signal_rank and trainer.state.num_updates == signal_step - 1:
        os.kill(os.getpid(), signal.SIGUSR1)
trainer.optimizer.optimizer.register_step_pre_hook(hook)
stopped = None
try:
    trainer.fit()
except TrainingInterrupted as e:
    stopped = e.exit_code
record = dict(rank=acc.process_index, seen=train.seen, stopped=stopped, updates=trainer.state.num_updates,
              header_lr=trainer.schedule.lr)
Path(out, f"rank{acc.process_index}.json").write_text(json.dumps(record))
'''
ARGS = [*TINY, "schedule.epochs=2", "checkpoint.every_steps=10", "checkpoint.keep_last=10"]
SEED_EPOCH_2 = 42 + 1  # run.seed + epoch (0-based)


def launch(
    tmp_path: Path, name: str, resume: str, signal_rank: int, signal_step: int, runs: Path
) -> list[dict]:
    out = tmp_path / name
    out.mkdir()
    args = (str(out), resume, str(signal_rank), str(signal_step), *ARGS, f"run.output_dir={runs}")
    result = launch_two(tmp_path / "worker.py", WORKER, *args)
    return [
        json.loads((out / f"rank{r}.json").read_text()) | {"stdout": result.stdout} for r in (0, 1)
    ]


def epoch_2_order() -> list[int]:
    """The independent reference: epoch 2's permutation of the 1438 training digits (no repeats)."""
    return torch.randperm(1438, generator=torch.Generator().manual_seed(SEED_EPOCH_2)).tolist()


def interleave(a: list[int], b: list[int]) -> list[int]:
    return [x for pair in zip(a, b, strict=True) for x in pair]


class Recording(DigitsDataset):
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen: list[int] = []

    def __getitem__(self, index):
        self.seen.append(int(index))
        return super().__getitem__(index)


def test_two_processes_stop_together_then_resume_on_one_and_back_on_two(tmp_path):
    runs = tmp_path / "runs"
    run = runs / "tiny"
    # --- 2 processes; only rank 1 receives SIGUSR1, in step 29; the request rides on the next step's
    # loss check (no collective of its own), so both stop after step 30 (epoch 2, batch 8 of 22)
    ranks = launch(tmp_path, "two", "", signal_rank=1, signal_step=29, runs=runs)
    assert [r["stopped"] for r in ranks] == [128 + signal.SIGUSR1] * 2 and [
        r["updates"] for r in ranks
    ] == [
        30,
        30,
    ]
    ckpt_30 = run / "checkpoints" / "ckpt-000000030"
    assert list_checkpoints(run / "checkpoints")[-1] == ckpt_30
    assert sorted(p.name for p in ckpt_30.glob("rng_state_*")) == [
        "rng_state_0.pt",
        "rng_state_1.pt",
    ]
    consumed_two = interleave(*[[i for e, i in r["seen"] if e == 1] for r in ranks])
    assert len(consumed_two) == 8 * 32 * 2 == 512
    assert consumed_two == epoch_2_order()[:512]

    # --- 2 -> 1: the same weights, optimizer, EMA, counters and schedule position; the rest of epoch 2
    train = Recording("train", build_transform("none", 16), size=16)
    val = DigitsDataset("val", build_transform("eval", 16), size=16)
    cfg = tiny_config(
        runs, "schedule.epochs=2", "checkpoint.every_steps=10", "checkpoint.keep_last=10"
    )
    trainer = Trainer(cfg, resume=ckpt_30, train_set=train, val_set=val)
    state = trainer.state
    assert (state.epoch, state.epoch_samples, state.num_updates, state.batch) == (1, 512, 30, 16)
    for file, module in (
        ("model.safetensors", trainer.raw_model),
        ("model_ema.safetensors", trainer.ema.module),
    ):
        saved = load_file(ckpt_30 / file)
        assert all(torch.equal(module.state_dict()[k], v) for k, v in saved.items()), file
    saved_optimizer = torch.load(ckpt_30 / "optimizer.pt", weights_only=True)
    restored = trainer.optimizer.state_dict()
    assert all(
        torch.equal(restored["state"][k]["exp_avg"], v["exp_avg"])
        for k, v in saved_optimizer["state"].items()
    )
    # 30 of 44 two-process steps == 60 of 88 one-process steps: the same point of the schedule
    assert abs(trainer.schedule.lr - saved_optimizer["param_groups"][0]["lr"]) < 1e-12
    assert "elastic resume" in trainer.resume_warning and "Not exact" in trainer.resume_warning
    summary = trainer.fit()
    rest = train.seen
    assert (
        rest == epoch_2_order()[512 : 512 + (1438 - 512) // 32 * 32]
    )  # exactly what was left, in order
    assert summary["resume_exact"] is False and summary["resumed_from_processes"] == 2
    assert "elastic resume" in summary["resume_note"]
    assert summary["updates"] == 30 + (1438 - 512) // 32  # 58

    # --- 1 -> 2: the 1-process checkpoint at step 40 (epoch 2, 512 + 10 x 32 samples in) on 2 processes
    ckpt_40 = run / "checkpoints" / "ckpt-000000040"
    ranks = launch(tmp_path, "back", str(ckpt_40), signal_rank=-1, signal_step=0, runs=runs)
    assert (
        "elastic resume: ckpt-000000040 was written by 1 process(es), this run has 2"
        in ranks[0]["stdout"]
    )
    consumed = 512 + 10 * 32
    left_per_rank = (1438 - consumed) // 2 // 32 * 32
    resumed_two = interleave(*[[i for e, i in r["seen"] if e == 1] for r in ranks])
    assert resumed_two == epoch_2_order()[consumed : consumed + 2 * left_per_rank]
    assert [r["stopped"] for r in ranks] == [None, None]
    fork = json.loads(
        (runs / "tiny-2" / "summary.json").read_text()
    )  # ckpt-40 is not the latest: a fork
    assert (
        fork["num_processes"] == 2
        and fork["resumed_from_processes"] == 1
        and fork["resume_exact"] is False
    )

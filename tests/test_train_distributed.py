"""``accelerate launch --multi_gpu --num_processes 2`` on CPU (torchrun + gloo; ``--cpu`` would start a single
process): disjoint training shards (the rank-aware sampler is not
sharded a second time), validation over both processes counted once, one process prints and writes."""

import json
import subprocess

from test_train_support import GROUP_FREED, TINY, accelerate_command, launch_two

WORKER = '''
import json, sys
from pathlib import Path
import torch
torch.set_num_threads(1)
from vit5.data import DigitsDataset, build_transform
from vit5.train import Trainer, load_config

class Recording(DigitsDataset):
    """Digits that remember which samples this process loaded."""
    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self.seen = []
    def __getitem__(self, index):
        self.seen.append(int(index))
        return super().__getitem__(index)

train = Recording("train", build_transform("none", 16), size=16)
val = Recording("val", build_transform("eval", 16), size=16)
trainer = Trainer(load_config(None, sys.argv[2:]), train_set=train, val_set=val)
summary = trainer.fit()
acc = trainer.accelerator
record = dict(world=acc.num_processes, train=train.seen, val=val.seen, images_seen=summary["images_seen"],
              val_images=summary["val_images"], val_top1=summary["final_top1"])
Path(sys.argv[1], f"rank{acc.process_index}.json").write_text(json.dumps(record))
'''


def test_two_cpu_processes_shard_disjointly_and_reduce_metrics(tmp_path):
    script, out = tmp_path / "worker.py", tmp_path / "records"
    out.mkdir()
    result = launch_two(script, WORKER, str(out), *TINY, f"run.output_dir={tmp_path / 'runs'}")
    ranks = [json.loads((out / f"rank{r}.json").read_text()) for r in (0, 1)]

    assert [r["world"] for r in ranks] == [2, 2]
    train0, train1 = set(ranks[0]["train"]), set(ranks[1]["train"])
    assert not train0 & train1  # disjoint shards
    per_rank = 1438 // 2 // 32 * 32  # 22 full batches of 32 each; a second sharding would leave 11
    assert len(ranks[0]["train"]) == len(ranks[1]["train"]) == per_rank
    # val: Accelerate's shards (whole batches, the last ones padded with repeats so both processes run as
    # many), evaluated twice (raw and EMA weights); gather_for_metrics drops the padding: 359 images
    val0, val1 = ranks[0]["val"], ranks[1]["val"]
    assert len(val0) == len(val1) and val0[: len(val0) // 2] == val0[len(val0) // 2 :]
    assert (
        set(val0) | set(val1) == set(range(359)) and len(val0) // 2 + len(val1) // 2 < 359 + 2 * 48
    )
    for r in ranks:  # reduced: both processes report the totals over both shards
        assert r["images_seen"] == 2 * per_rank and r["val_images"] == 359
    assert ranks[0]["val_top1"] == ranks[1]["val_top1"]

    assert result.stdout.count("run directory") == 1 and result.stdout.count("epoch 1/1 |") == 1
    assert "processes      2 x cpu" in result.stdout
    assert [p.name for p in (tmp_path / "runs").iterdir()] == [
        "tiny"
    ]  # one run directory, not one per process
    summary = json.loads((tmp_path / "runs" / "tiny" / "summary.json").read_text())
    assert summary["num_processes"] == 2 and summary["images_seen"] == 2 * per_rank

    # --resume under 2 processes: every process verifies and loads; when only rank 1's random state is
    # damaged, both stop with one error line (neither waits at a barrier for the other)
    (checkpoint,) = (tmp_path / "runs" / "tiny" / "checkpoints").iterdir()
    assert sorted(p.name for p in checkpoint.glob("rng_state_*.pt")) == [
        "rng_state_0.pt",
        "rng_state_1.pt",
    ]
    (checkpoint / "rng_state_1.pt").write_text("{}")
    # `vit5 train`, then the check that the command destroyed its process group, error or not
    command = tmp_path / "command.py"
    command.write_text(
        f"import sys\nfrom vit5.cli import main\nstatus = main(sys.argv[1:])\n{GROUP_FREED}\n"
        "sys.exit(status)\n"
    )
    resume, env = accelerate_command(
        command, "train", "--resume", str(tmp_path / "runs" / "tiny"), "schedule.epochs=2"
    )
    result = subprocess.run(
        resume, check=False, cwd=tmp_path, env=env, capture_output=True, text=True, timeout=120
    )
    assert result.returncode != 0
    errors = [line for line in result.stderr.splitlines() if line.startswith("error: ")]
    assert len(errors) == 1 and "rng_state_1.pt is damaged" in errors[0], result.stderr[-3000:]
    assert result.stdout.count("process group freed") == 2

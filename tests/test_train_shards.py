"""Training on WebDataset shards: 2 CPU processes (torchrun + gloo through ``accelerate launch``) with 2
loader workers each read every training sample once per epoch and every validation sample once per
evaluation; a mid-epoch resume reads exactly the samples the interruption left."""

import json
from pathlib import Path

import pytest
from shard_support import read_records, recording_shards, write_indexed_folder
from test_train_support import TINY, launch_two

from vit5.data import write_shards
from vit5.train import Trainer, load_config
from vit5.train.errors import TrainConfigError

WORKER = """
import os, sys
from pathlib import Path
import torch
torch.set_num_threads(1)
from shard_support import recording_shards
from vit5.train import Trainer, load_config
from vit5.train.errors import TrainConfigError

out, shards, cfg = Path(sys.argv[1]), Path(sys.argv[2]), load_config(None, sys.argv[3:])
common = dict(num_replicas=int(os.environ["WORLD_SIZE"]), rank=int(os.environ["RANK"]),
              num_workers=cfg.data.num_workers, seed=cfg.run.seed)
train = recording_shards(shards, "train", out, cfg.data.batch_size, **common)
val = recording_shards(shards, "val", out, 6, **common)
summary = Trainer(cfg, train_set=train, val_set=val).fit()
if common["rank"] == 0:
    Path(out, "summary.json").write_text(__import__("json").dumps(summary, default=str))
"""

SHARDED = [
    *TINY,
    "data.batch_size=4",
    "data.num_workers=2",
    "data.persistent_workers=true",
    "ema.enabled=false",
]


@pytest.fixture(scope="module")
def shards(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("wds")
    write_indexed_folder(root / "src" / "train", 70, classes=3)  # 5 shards (16, 16, 16, 16, 6)
    write_indexed_folder(root / "src" / "val", 21, classes=3)  # 2 shards: fewer than 2 x 2 readers
    write_shards(root / "src" / "train", root / "shards" / "train", 16)
    write_shards(root / "src" / "val", root / "shards" / "val", 11)
    return root / "shards"


def test_two_processes_two_workers_read_every_sample_once(tmp_path, shards):
    out = tmp_path / "records"
    out.mkdir()
    args = (
        str(out),
        str(shards),
        *SHARDED,
        "schedule.epochs=2",
        f"run.output_dir={tmp_path / 'runs'}",
    )
    result = launch_two(tmp_path / "worker.py", WORKER, *args)

    train = read_records(out, "train")
    assert (
        max(train.values()) == 1
    )  # no sample read twice in an epoch, over 2 processes x 2 workers
    for epoch in (0, 1):
        seen = {i for e, i in train if e == epoch}
        assert len(seen) == 70 // 8 * 8 and seen <= set(
            range(70)
        )  # 8 batches per process, 6 left over
    assert {i for e, i in train if e == 0} != {
        i for e, i in train if e == 1
    }  # the 6 left over change
    assert read_records(out, "val") == {
        (0, i): 2 for i in range(21)
    }  # 2 evaluations, each image once
    summary = json.loads((out / "summary.json").read_text())
    assert (
        summary["val_images"] == 21
        and summary["images_seen"] == 2 * 64
        and summary["bad_files"] == 0
    )
    assert "each epoch trains on all but 6 samples" in result.stdout


def test_mid_epoch_resume_reads_exactly_what_was_left(tmp_path, shards):
    cfg = load_config(
        None, [*SHARDED, f"run.output_dir={tmp_path / 'runs'}", "checkpoint.every_steps=5"]
    )

    def fit(folder: Path, resume: Path | None = None) -> None:
        folder.mkdir()
        train = recording_shards(shards, "train", folder, 4, num_workers=2)
        val = recording_shards(shards, "val", folder, 6, num_workers=2)
        Trainer(cfg, resume=resume, train_set=train, val_set=val).fit()

    fit(tmp_path / "whole")
    whole = read_records(tmp_path / "whole", "train")
    assert sum(whole.values()) == 70 // 4 * 4 and max(whole.values()) == 1
    # the first 5 batches: the loader takes its 2 workers in turn: worker 0's first 3, worker 1's first 2
    order = {w: _indices(next((tmp_path / "whole").glob(f"train-{w}-*"))) for w in (0, 1)}
    consumed = set(order[0][: 3 * 4]) | set(order[1][: 2 * 4])

    fit(tmp_path / "resumed", resume=tmp_path / "runs" / "tiny" / "checkpoints" / "ckpt-000000005")
    resumed = read_records(tmp_path / "resumed", "train")
    assert max(resumed.values()) == 1
    assert {i for _, i in resumed} == {
        i for _, i in whole
    } - consumed  # exactly the 12 batches left


def _indices(record: Path) -> list[int]:
    return [int(line.split()[1]) for line in record.read_text().splitlines()]


def test_the_config_asks_for_shards_and_refuses_repeated_augmentation():
    with pytest.raises(TrainConfigError) as error:
        load_config(None, ["data.dataset=wds", "aug.repeated_aug=3"], check_paths=False)
    message = str(error.value)
    assert "set aug.repeated_aug=1 with data.dataset=wds" in message
    assert "data.train_shards=None: data.dataset=wds needs a brace pattern" in message
    shards = ["data.train_shards=[a.tar,b.tar]", "data.val_shards=v"]
    cfg = load_config(None, ["data.dataset=wds", "aug.repeated_aug=1", *shards], check_paths=False)
    assert cfg.data.train_shards == ["a.tar", "b.tar"] and cfg.data.val_shards == "v"

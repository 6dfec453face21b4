"""Training on an ImageFolder tree (the exported digits) with planted bad files: the run goes on and
the summary counts and lists the skipped files."""

import json
from pathlib import Path

import pytest
from test_train_support import single_thread, tiny_config  # noqa: F401 (autouse fixture)

from vit5.data import export_digits_imagefolder
from vit5.outputs import read_csv
from vit5.train import Trainer


def plant_bad_files(root: Path) -> list[str]:
    good = (root / "val" / "7").iterdir().__next__().read_bytes()
    (root / "val" / "7" / "truncated.png").write_bytes(good[: len(good) // 2])
    (root / "val" / "3" / "notes.png").write_text("this is not an image")
    (root / "train" / "1" / "empty.jpg").write_bytes(b"")
    return ["empty.jpg", "notes.png", "truncated.png"]


@pytest.mark.filterwarnings("ignore::vit5.data.BadImageWarning")  # expected: planted
@pytest.mark.parametrize("preload", [False, True])
def test_folder_training_end_to_end_skips_and_counts_bad_files(tmp_path, preload):
    root = tmp_path / "digits"
    export_digits_imagefolder(root, size=16)
    planted = plant_bad_files(root)
    cfg = tiny_config(
        tmp_path,
        "data.dataset=folder",
        f"data.root={root}",
        "schedule.epochs=2",
        f"data.preload={preload}",
    )
    summary = Trainer(cfg).fit()

    assert (
        summary["status"] == "completed" and summary["final_top1"] > 25
    )  # it learned despite the bad files
    assert summary["bad_files"] == 3
    assert sorted(Path(p).name for p in summary["bad_file_paths"]) == planted
    run = Path(summary["run_dir"])
    assert json.loads((run / "summary.json").read_text())["bad_files"] == 3
    text = (run / "summary.txt").read_text()
    assert "skipped files    3" in text and "truncated.png" in text
    rows = read_csv(run / "metrics.csv")
    assert [r["epoch"] for r in rows] == [1, 2] and rows[-1]["bad_files"] == 3
    assert {p.name for p in run.iterdir()} >= {
        "config.yaml",
        "metrics.csv",
        "curves.png",
        "summary.txt",
        "summary.json",
        "best",
        "final",
        "checkpoints",
    }

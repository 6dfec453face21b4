"""The register study at smoke size: canvases, twins, resumable training, trajectories and the verdict."""

import hashlib
import json
import os
import shlex
from dataclasses import replace

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from vit5.cli.viz import main as viz_main
from vit5.cli.viz import parse_settings
from vit5.data.digits.canvases import CanvasConfig, CanvasSource, label_of
from vit5.errors import InputError
from vit5.study.run import (
    SMOKE,
    TWINS,
    build_twins,
    run_study,
    verdict,
)


def main(argv: list[str]) -> int:
    """``vit5 viz study ARGV``."""
    return viz_main(["study", *argv])


def test_labels_by_hand():
    assert label_of((3, 9, 4), "sum") == 16 and label_of((3, 9, 4), "summod") == 6
    assert label_of((3, 9, 4), "count") == 3 and label_of((3, 9, 4), "max") == 9
    np.testing.assert_array_equal(np.nonzero(label_of((3, 9, 3), "multilabel"))[0], [3, 9])


def test_canvases_are_deterministic_flat_where_background_and_split_by_digit():
    cfg = CanvasConfig(
        size=(48, 64), patch_size=8, digits=(2, 3), digit_side=(10, 14), task="count"
    )
    train, val = CanvasSource(cfg, "train", seed=1), CanvasSource(cfg, "val", seed=1)
    a, b = train.batch(5, 6), train.batch(5, 6)
    np.testing.assert_array_equal(a.images, b.images)
    assert not np.array_equal(a.images, train.batch(6, 6).images)
    assert a.images.shape == (6, 48, 64, 3) and a.background.shape == (6, 6, 8)
    assert [len(d) for d in a.digits] == list(a.labels)
    for image, background in zip(a.images, a.background):
        patches = image[..., 0].reshape(6, 8, 8, 8).transpose(0, 2, 1, 3)  # [h, w, 8, 8]
        levels = {int(v) for v in patches[background].ravel()}
        assert (
            len(levels) == 1
        )  # flat background: every background pixel has the canvas's one grey level
        assert all(
            len(np.unique(p)) > 1 for p in patches[~background]
        )  # a digit touches every other patch
    assert not set(map(bytes, train.pool.reshape(len(train.pool), -1))) & set(
        map(bytes, val.pool.reshape(len(val.pool), -1))
    )


def test_twins_differ_only_in_their_registers():
    twins = build_twins(SMOKE)
    a, b = (twins[t].state_dict() for t in TWINS)
    assert set(b) - set(a) == {"reg_token"} and set(a) <= set(b)
    assert all(torch.equal(a[k], b[k]) for k in a)
    cfg_a, cfg_b = (SMOKE.model_config(t) for t in TWINS)
    assert cfg_a.replace(num_registers=SMOKE.registers) == cfg_b
    assert not cfg_a.class_token and cfg_a.global_pool == "avg"


def _final_weights(out):
    return {t: load_file(str(out / t / "final" / "model.safetensors")) for t in TWINS}


def test_smoke_study_resumes_to_the_same_weights(tmp_path, capsys):
    whole = run_study(SMOKE, tmp_path / "whole", progress=False, log=lambda s: None, analyse=False)
    assert whole.complete and [r["step"] for r in whole.trajectories["registers"]] == [0, 3, 6]
    first = run_study(
        SMOKE, tmp_path / "parts", max_minutes=0, progress=False, log=lambda s: None, analyse=False
    )
    assert not first.complete and [r["step"] for r in first.trajectories["no_registers"]] == [0, 3]
    rest = run_study(SMOKE, tmp_path / "parts", progress=False, log=lambda s: None, analyse=False)
    assert rest.complete and [r["step"] for r in rest.trajectories["no_registers"]] == [0, 3, 6]
    for twin in TWINS:
        for key, value in _final_weights(tmp_path / "whole")[twin].items():
            torch.testing.assert_close(
                _final_weights(tmp_path / "parts")[twin][key], value, rtol=0, atol=0
            )
    row = rest.trajectories["registers"][-1]
    assert (
        len(row["metrics"]["outlier_ratio"]) == SMOKE.depth
        and "reused" in row
        and row["num_registers"] == 1
    )
    with pytest.raises(InputError, match="holds a study with other settings .changed: steps"):
        run_study(replace(SMOKE, steps=9), tmp_path / "parts", progress=False, log=lambda s: None)


def test_command_line_smoke_run_with_analyses(tmp_path, capsys):
    assert main(["--out", str(tmp_path), "--preset", "smoke", "--quiet"]) == 0
    out = capsys.readouterr().out
    assert (
        "register study at step 6" in out and "register ablation of registers twin (trained)" in out
    )
    for name in (
        "trajectory.png",
        "verdict.json",
        "heldout/heldout_000.png",
        "analysis/ablation.png",
        "analysis/analysis.json",
    ):
        assert (tmp_path / name).stat().st_size > 100
    assert (
        tmp_path / "no_registers" / "checkpoints" / "step_000003" / "model.safetensors"
    ).is_file()
    doc = json.loads((tmp_path / "analysis" / "analysis.json").read_text())
    assert len(doc["ablation"]) == 9 and "ttr" in doc
    steps = (tmp_path / "registers" / "trajectory.jsonl").read_text()
    assert (
        main(
            [
                "--out",
                str(tmp_path),
                "--preset",
                "smoke",
                "--quiet",
                "--analyse-only",
                "--no-analysis",
            ]
        )
        == 0
    )
    assert (
        tmp_path / "registers" / "trajectory.jsonl"
    ).read_text() == steps  # nothing trained, nothing re-measured
    assert main(["--out", str(tmp_path / "x"), "--preset", "smoke", "--set", "stepz=3"]) == 2
    assert "unknown study setting 'stepz': did you mean 'steps'?" in capsys.readouterr().err


def test_settings_parse_into_the_right_sections():
    cfg = parse_settings(
        SMOKE, ["steps=12", "background=noise", "model.qk_norm=False", "size=(48, 64)"]
    )
    assert cfg.steps == 12 and cfg.canvas.background == "noise" and cfg.canvas.size == (48, 64)
    assert dict(cfg.model_args) == {"qk_norm": False} and not cfg.model_config("registers").qk_norm
    with pytest.raises(InputError, match="may not set"):
        parse_settings(SMOKE, ["model.num_registers=2"])


def _row(step, otr, images_bg, bg_share, received, sink_patch, reg_mass=None, registers=0):
    n = 3
    return {
        "step": step,
        "num_tokens": 16 + registers,
        "num_registers": registers,
        "accuracy": 0.5,
        "images_with_outliers": [images_bg] * n,
        "images_with_background_outliers": [0.0, images_bg, 0.0],
        "outlier_background_share": [bg_share] * n,
        "background_rate": [0.6] * n,
        "metrics": {
            "outlier_ratio": [0.0, otr, 0.0],
            "max_median_ratio": [1.0] * n,
            "sink_rate": [0.5] * n,
            "received_outlier_mass": [None, 0.0, received],
            "sink_rate_patch": [0.0, 0.0, sink_patch],
            "sink_rate_register": [0.0, 0.0, 0.4],
            "patch_register_mass": [reg_mass] * n,
        },
    }


def test_verdict_reads_the_block_with_background_outliers_and_each_criterion():
    good = {
        "no_registers": [_row(10, 0.1, 0.8, 0.9, 0.4, 0.25)],
        "registers": [_row(10, 0.005, 0.1, 0.5, 0.0, 0.0, reg_mass=0.5, registers=4)],
    }
    v = verdict(good)
    assert v["success"] and v["layer"] == 1 and v["next_layer"] == 2 and all(v["checks"].values())
    weak = {"no_registers": [_row(10, 0.1, 0.8, 0.9, 0.15, 0.25)], "registers": good["registers"]}
    assert not verdict(weak)["checks"][
        "outliers_draw_attention"
    ]  # 0.15 < 2 x the outliers' share 0.1
    close = {
        "no_registers": good["no_registers"],
        "registers": [_row(10, 0.02, 0.1, 0.5, 0.0, 0.0, 0.5, 4)],
    }
    assert not verdict(close)["checks"]["registers_10x_fewer_outliers"]  # 0.02 * 10 > 0.1
    digits = {"no_registers": [_row(10, 0.1, 0.8, 0.3, 0.4, 0.25)], "registers": good["registers"]}
    assert not verdict(digits)["checks"][
        "outliers_on_background"
    ]  # 0.3 below the background rate 0.6
    idle = {
        "no_registers": good["no_registers"],
        "registers": [_row(10, 0.005, 0.1, 0.5, 0.0, 0.0, 0.3, 4)],
    }
    assert not verdict(idle)["checks"][
        "registers_hold_attention"
    ]  # 0.3 < twice the registers' uniform share 4/20
    later = {
        "no_registers": [*digits["no_registers"], _row(20, 0.0, 0.0, 0.0, 0.0, 0.0)],
        "registers": good["registers"],
    }
    assert verdict(later)["step"] == 10  # the latest step both twins reached


def test_background_sinks_by_hand():
    from vit5 import TokenLayout
    from vit5.study.run import background_sinks
    from vit5.viz import TokenStats

    layout = TokenLayout((1, 3), num_cls=0, num_registers=1, registers_first=False)  # p, p, p, reg
    received = np.array(
        [
            [
                [
                    [0.1, 0.8, 0.05, 0.05],
                    [0.25, 0.25, 0.25, 0.25],
                ],  # block 0: head 0 sinks on patch 1
                [[0.05, 0.05, 0.1, 0.8], [0.6, 0.2, 0.1, 0.1]],
            ]
        ]
    )  # block 1: register sink, patch 0 sink
    stats = TokenStats(
        "toy",
        layout,
        [0, 1],
        ["a"],
        8,
        norms=np.ones((1, 2, 4)),
        received=received,
        rollout=np.zeros((1, 4)),
    )
    background = np.array([[[False, True, True]]])
    assert background_sinks(stats, background) == [
        1.0,
        0.0,
    ]  # patch 1 is background, patch 0 is not
    assert background_sinks(stats, background, eps=0.9) == [None, None]


class _Payload:
    """Unpickling this runs a shell command (what a crafted checkpoint can do to torch.load)."""

    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {shlex.quote(str(self.marker))}",))


def test_resume_refuses_a_planted_pickle_and_runs_nothing(tmp_path):
    from vit5.train import ResumeError

    marker = tmp_path / "payload_ran"
    out = tmp_path / "study"
    # an older vit5's pickled state.pt, as a folder someone hands over might hold it
    (out / "no_registers").mkdir(parents=True)
    torch.save({"model": _Payload(marker), "step": 3}, out / "no_registers" / "state.pt")
    run_study(SMOKE, out, max_minutes=0, progress=False, log=lambda s: None, analyse=False)
    assert not marker.exists()  # a pickle outside the safe format is never read

    # the twin's checkpoint (the Trainer's safe format) with optimizer.pt swapped for the pickle
    # (hash recomputed)
    (state,) = (out / "no_registers" / "run" / "checkpoints").glob("ckpt-*")
    torch.save({"state": _Payload(marker), "param_groups": []}, state / "optimizer.pt")
    manifest = json.loads((state / "checkpoint.json").read_text())
    data = (state / "optimizer.pt").read_bytes()
    manifest["files"]["optimizer.pt"] = {
        "bytes": len(data),
        "sha256": hashlib.sha256(data).hexdigest(),
    }
    (state / "checkpoint.json").write_text(json.dumps(manifest))
    with pytest.raises(
        ResumeError, match=r"optimizer\.pt contains pickled objects .*posix\.system"
    ):
        run_study(SMOKE, out, progress=False, log=lambda s: None, analyse=False)
    assert not marker.exists()
    torch.load(
        state / "optimizer.pt", weights_only=False
    )  # the payload is live: loading it unsafely runs it
    assert marker.exists()


def test_a_study_folder_of_the_old_state_format_is_refused_by_name(tmp_path):
    (tmp_path / "no_registers" / "state").mkdir(parents=True)
    with pytest.raises(InputError, match="older vit5 .state/.*use another --out"):
        run_study(SMOKE, tmp_path, progress=False, log=lambda s: None, analyse=False)

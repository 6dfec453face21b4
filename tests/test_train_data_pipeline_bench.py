"""The data-pipeline benchmark compares like with like: same files, same output, both sides measured."""

import tempfile

import cv2
import pytest
import torch

from vit5.bench.data_pipeline import (
    IMAGENET_LIKE_SIZES,
    eval_agreement,
    make_jpegs,
    measure_pipelines,
    run_data_index,
    torchvision_pipelines,
    vit5_pipelines,
)
from vit5.bench.measure import BenchConfig, BenchContext


def test_both_pipelines_turn_the_same_jpegs_into_the_same_tensors(tmp_path):
    paths = make_jpegs(tmp_path, 3)
    assert [cv2.imread(str(p)).shape[:2] for p in paths] == list(IMAGENET_LIKE_SIZES[:3])
    for pipelines in (vit5_pipelines(), torchvision_pipelines()):
        for kind in ("train", "eval"):
            out = pipelines[kind](paths[0])
            assert out.shape == (3, 224, 224) and out.dtype == torch.float32
    # deterministic eval: resize 224 + centre crop, normalised; only the resampling kernels differ
    assert eval_agreement(paths) < 0.1
    results = measure_pipelines(paths, rounds=1)
    for kind in ("train", "eval"):
        r = results[kind]
        assert r["opencv_albumentations"] > 0 and r["torchvision_pil"] > 0
        assert r["speedup"] == pytest.approx(
            r["opencv_albumentations"] / r["torchvision_pil"]
        )  # one round


def test_index_section_in_its_smallest_form(tmp_path, monkeypatch):
    # the data_index section of `vit5 bench` (smoke profile: a 200-file tree, 8 photos): every indexer
    # finds every file, the tree is deleted, folder and shard pipelines both decode
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    cfg = BenchConfig.profile("smoke")
    assert cfg.index_sizes == (200,)
    section = run_data_index(BenchContext(cfg, tmp_path, log=lambda _: None))
    index = section.data["index"]["200"]
    assert {name: m["files"] for name, m in index.items()} == {
        "vit5": 200,
        "torchvision": 200,
        "timm": 200,
    }
    assert all(m["seconds"] > 0 and m["peak_bytes"] >= 0 for m in index.values())
    assert not list((tmp_path / "tmp").iterdir())  # trees and shards deleted
    rates = section.data["decode_images_per_s"]
    assert set(rates) == {"folder", "shards"} and min(rates.values()) > 0
    assert [t.name for t in section.targets] == [
        "vit5 index time at 200 files vs torchvision",
        "vit5 index peak memory at 200 files vs torchvision",
    ]

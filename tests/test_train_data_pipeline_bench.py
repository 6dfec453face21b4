"""The data-pipeline benchmark compares like with like: same files, same output, both sides measured."""

import cv2
import pytest
import torch

from vit5.bench.data_pipeline import (
    IMAGENET_LIKE_SIZES,
    eval_agreement,
    make_jpegs,
    measure_pipelines,
    torchvision_pipelines,
    vit5_pipelines,
)


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
        assert r["speedup"] == pytest.approx(r["opencv_albumentations"] / r["torchvision_pil"])  # one round

"""Joint bilateral upsampling (Kopf et al. 2007) against an explicit float64 loop over pixels
and window cells, written here from the paper's equation."""

import math

import pytest
import torch

from vit5.errors import InputError
from vit5.eval.upsample import JointBilateral, joint_bilateral_upsample


def _loop(features, guide, radius, sigma_s, sigma_r):
    f = features.double()
    g = guide.double()
    b, c, h, w = f.shape
    size_h, size_w = g.shape[-2:]
    out = torch.zeros(b, c, size_h, size_w, dtype=torch.float64)
    for n in range(b):
        for y in range(size_h):
            for x in range(size_w):
                py = (y + 0.5) * h / size_h - 0.5
                px = (x + 0.5) * w / size_w - 0.5
                acc = torch.zeros(c, dtype=torch.float64)
                total = 0.0
                for qy in range(round(py) - radius, round(py) + radius + 1):
                    for qx in range(round(px) - radius, round(px) + radius + 1):
                        if not (0 <= qy < h and 0 <= qx < w):
                            continue
                        rows = slice(qy * size_h // h, (qy + 1) * size_h // h)
                        cols = slice(qx * size_w // w, (qx + 1) * size_w // w)
                        cell = g[n, :, rows, cols].mean(dim=(1, 2))
                        spatial = math.exp(-((qy - py) ** 2 + (qx - px) ** 2) / (2 * sigma_s**2))
                        colour = float(((g[n, :, y, x] - cell) ** 2).sum())
                        weight = spatial * math.exp(-colour / (2 * sigma_r**2))
                        acc += weight * f[n, :, qy, qx]
                        total += weight
                out[n, :, y, x] = acc / total
    return out


@pytest.mark.parametrize("radius", [1, 2])
def test_matches_an_explicit_float64_loop(radius):
    torch.manual_seed(0)
    features = torch.randn(2, 3, 3, 4)
    guide = torch.rand(2, 3, 12, 16)
    settings = JointBilateral(radius=radius, sigma_spatial=0.8, sigma_range=0.2)
    fast = joint_bilateral_upsample(features, guide, settings)
    slow = _loop(features, guide, radius, 0.8, 0.2)
    torch.testing.assert_close(fast.double(), slow, atol=1e-5, rtol=1e-5)


def test_follows_an_edge_of_the_guide_that_bilinear_blurs():
    # two cells, a black and a white half; the guide's edge sits inside the left cell
    features = torch.tensor([[[[0.0, 1.0]]]])
    guide = torch.zeros(1, 3, 8, 16)
    guide[..., 6:] = 1.0
    sharp = joint_bilateral_upsample(features, guide, JointBilateral(sigma_range=0.05))[0, 0, 0]
    assert sharp[7] > 0.95 and sharp[5] < 0.05  # the white pixels of the left cell take 1


def test_bad_settings_are_one_clear_error():
    with pytest.raises(InputError, match="sigma_range"):
        JointBilateral(sigma_range=0)

"""Position-artifact probe (Yang et al., "Denoising Vision Transformers", arXiv 2401.02957, Fig. 3): block
outputs for constant images (any difference between patches is position alone) and uniform noise, as norm
and PCA maps (grey = the mean feature, full colour a deviation of ``COLOUR_SPAN`` of its norm) and two
numbers, :func:`constant_spatial_share` and :func:`position_share`."""

from __future__ import annotations

import textwrap
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch
from matplotlib.figure import Figure
from torch import nn

from vit5.errors import InputError
from vit5.introspect import describe
from vit5.model import take_indices
from vit5.model.vit import unwrap
from vit5.outputs import write_json
from vit5.viz.collect import capture
from vit5.viz.figures import MapStyle, Panel, panel_grid
from vit5.viz.images import LoadedImage, to_batch

# PCA maps: a deviation of this share of the mean feature norm saturates the colour
COLOUR_SPAN = 0.1


@dataclass(frozen=True)
class PositionProbeConfig:
    # (height, width); default: the model's own input size
    size: tuple[int, int] | None = None
    # grey levels of the constant images, in [0, 1]
    levels: tuple[float, ...] = (0.0, 0.25, 0.5, 0.75, 1.0)
    noise_images: int = 16
    layer: int = -1  # block whose output is probed
    seed: int = 0
    device: str = "cpu"

    def __post_init__(self) -> None:
        if not self.levels or any(not 0.0 <= v <= 1.0 for v in self.levels):
            raise InputError(f"grey levels must be in [0, 1], got {list(self.levels)}")
        if self.noise_images < 2:
            needs = "the position share over noise images needs at least 2 images"
            raise InputError(f"{needs}, got {self.noise_images}")


def probe_images(
    size: tuple[int, int], cfg: PositionProbeConfig
) -> tuple[list[LoadedImage], list[LoadedImage]]:
    """The constant images (one per grey level) and the uniform-noise images, as uint8 RGB."""
    shape = (*size, 3)
    rng = np.random.default_rng(cfg.seed)
    constant = []
    for v in cfg.levels:
        grey = np.full(shape, round(v * 255), np.uint8)
        constant.append(LoadedImage(name=f"constant_{v:g}", rgb=grey))
    noise = []
    for i in range(cfg.noise_images):
        pixels = rng.integers(0, 256, shape, np.uint8)
        noise.append(LoadedImage(name=f"noise_{i}", rgb=pixels))
    return constant, noise


def constant_spatial_share(features: np.ndarray) -> np.ndarray:
    """``[B, P, C]`` -> ``[B]``: energy of the deviations from the image's mean patch feature over the total
    energy."""
    f = features.astype(np.float64)
    deviation = ((f - f.mean(axis=1, keepdims=True)) ** 2).sum(axis=-1).mean(axis=1)
    total = (f**2).sum(axis=-1).mean(axis=1)
    return np.where(total > 0, deviation / np.where(total > 0, total, 1.0), 0.0)


def pca_map(features: np.ndarray, grid: tuple[int, int]) -> np.ndarray:
    """``[P, C]`` -> ``[h, w, 3]``: the first three principal components on the absolute scale of
    :data:`COLOUR_SPAN`."""
    f = features.astype(np.float64)
    centred = f - f.mean(axis=0)
    comps = centred @ np.linalg.svd(centred, full_matrices=False)[2][:3].T
    # fewer than 3 components: grey
    comps = np.pad(comps, ((0, 0), (0, 3 - comps.shape[1])))
    scale = COLOUR_SPAN * np.sqrt((f**2).sum(axis=-1).mean())
    scale = scale if scale > 0 else 1.0
    colours = np.clip(0.5 + 0.5 * comps / scale, 0.0, 1.0)
    return colours.reshape(*grid, 3)


def position_share(features: np.ndarray) -> float:
    """``[M, P, C]`` -> ``s2_position / (s2_position + s2_within)``, with position means ``mu_p``,
    ``s2_within = sum ||f_mp - mu_p||^2 / (P (M - 1))`` and ``s2_position = mean_p ||mu_p - mu||^2 -
    s2_within / M`` (the sampling noise of ``mu_p`` removed), clipped to [0, 1]."""
    f = features.astype(np.float64)
    m, p = f.shape[:2]
    means = f.mean(axis=0)  # [P, C]
    within = ((f - means) ** 2).sum() / (p * (m - 1))
    spread = ((means - means.mean(axis=0)) ** 2).sum(axis=-1).mean()
    position = max(spread - within / m, 0.0)
    return float(position / (position + within)) if position + within > 0 else 0.0


@dataclass
class PositionProbe:
    model: str
    layer: int
    grid: tuple[int, int]
    patch_size: int
    levels: tuple[float, ...]
    constant_norms: np.ndarray  # [levels, h, w]
    constant_pca: np.ndarray  # [levels, h, w, 3]
    noise_norms: np.ndarray  # [h, w] mean over noise images
    constant_spatial_share: float
    noise_position_share: float
    notes: tuple[str, ...] = ()

    def summary(self) -> dict:
        keys = (
            "model",
            "layer",
            "grid",
            "levels",
            "constant_spatial_share",
            "noise_position_share",
        )
        cv = float(np.mean([m.std() / m.mean() for m in self.constant_norms]))
        found = {k: getattr(self, k) for k in keys}
        return found | {"constant_norm_cv": cv, "notes": list(self.notes)}


@torch.no_grad()
def _block_features(
    net: nn.Module,
    images: Sequence[LoadedImage],
    layer: int,
    device: str,
) -> np.ndarray:
    info = describe(net)
    layout = info.layout(images[0].rgb.shape[:2])
    with capture(net, layers=[layer], attention=False) as rec:
        net.forward_features(to_batch(images, info.mean, info.std).to(device))
    return layout.patches(rec.tokens[layer]).float().cpu().numpy()


def run_position_probe(
    model: nn.Module,
    label: str,
    cfg: PositionProbeConfig = PositionProbeConfig(),
    notes: Sequence[str] = (),
) -> PositionProbe:
    info = describe(model)
    size = tuple(cfg.size or info.img_size)
    info.grid(size)
    layer = take_indices(info.depth, [cfg.layer])[0]
    net = unwrap(model).eval().to(cfg.device)
    constant, noise = probe_images(size, cfg)
    f_const = _block_features(net, constant, layer, cfg.device)  # [levels, P, C]
    f_noise = _block_features(net, noise, layer, cfg.device)  # [M, P, C]
    grid = info.layout(size).grid
    constant_pca = np.stack([pca_map(f, grid) for f in f_const])  # one PCA per image
    norms = np.linalg.norm(f_const, axis=-1).reshape(len(constant), *grid)
    noise_norms = np.linalg.norm(f_noise, axis=-1).mean(axis=0).reshape(grid)
    return PositionProbe(
        model=label,
        layer=layer,
        grid=grid,
        patch_size=info.patch_size,
        levels=tuple(cfg.levels),
        constant_norms=norms,
        constant_pca=constant_pca,
        noise_norms=noise_norms,
        constant_spatial_share=float(constant_spatial_share(f_const).mean()),
        noise_position_share=position_share(f_noise),
        notes=tuple(notes),
    )


def position_figure(probes: Sequence[PositionProbe], style: MapStyle, level: float = 0.5) -> Figure:
    """Rows: models; columns: norm and PCA maps of a constant image, and the mean norm map of the noise
    images (no PCA of those: few images still hold their content's average). Each norm column shares one
    colour scale across models."""
    rows = []
    for p in probes:
        i = int(np.argmin(np.abs(np.asarray(p.levels) - level)))
        constant = f"constant {p.levels[i]:g}"
        patch = p.patch_size
        name = f"{textwrap.fill(p.model, 42)}\n{constant}: norms"
        pca = f"{constant}: PCA (share {p.constant_spatial_share:.2f})"
        noise = f"noise: mean norms (position share {p.noise_position_share:.2f})"
        norms = Panel(name, p.constant_norms[i], group="constant norms", patch=patch)
        noise_norms = Panel(noise, p.noise_norms, group="noise norms", patch=patch)
        rows.append([norms, Panel(pca, rgb=p.constant_pca[i], patch=patch), noise_norms])
    layer = ", ".join(sorted({str(p.layer) for p in probes}))
    notes = sorted({n for p in probes for n in p.notes})
    notes.append(
        "constant share: patch-feature energy varying with position on a constant image; "
        "noise share: feature variance over noise images due to position "
        "(intraclass correlation); PCA: one per map, grey = the mean feature, "
        f"full colour = a deviation of {COLOUR_SPAN:.0%} of the mean feature norm"
    )
    title = f"Position-artifact probe: block {layer} outputs for inputs without content"
    return panel_grid(rows, style, title, notes)


def write_probes(probes: Sequence[PositionProbe], out: str | Path) -> Path:
    Path(out).mkdir(parents=True, exist_ok=True)
    return write_json(Path(out) / "position_probe.json", [p.summary() for p in probes])

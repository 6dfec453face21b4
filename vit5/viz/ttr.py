"""Test-time registers (Jiang et al., arXiv 2506.08010, Algorithms 1 and 2; official code
nickjiang2378/test-time-registers ``shared/algorithms.py``, ``shared/hook_fn.py``): find the MLP
neurons that write high-norm outliers (Algorithm 1, here) and move their activation into added
tokens (Algorithm 2, :mod:`vit5.eval.registers`, re-exported). While active, ``describe`` reports
the tokens as registers after the trained ones, so collection, metrics and figures treat them as
registers. For vit5, timm ``VisionTransformer`` / ``Eva`` (RoPE, DINOv3) and transformers DINOv2 /
DINOv3 / ViT models, with or without trained registers; what differs between them is
:func:`~vit5.eval.registers.register_sites`."""

from __future__ import annotations

from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from vit5.errors import InputError
from vit5.eval.registers import (
    RegisterNeuron,
    RegisterSites,
    check_test_time_registers,
    mlp_input_hooks,
    read_neurons,
    register_sites,
    use_test_time_registers,
)
from vit5.introspect import describe
from vit5.model import take_indices
from vit5.model.vit import unwrap
from vit5.viz.artifacts import layer_thresholds, log_mad_threshold, outlier_ratio
from vit5.viz.collect import capture
from vit5.viz.images import LoadedImage, batches

__all__ = ["NeuronSearch", "NeuronSearchResult", "RegisterNeuron", "check_test_time_registers"]
__all__ += ["RegisterSites", "find_register_neurons", "read_neurons", "register_sites"]
__all__ += ["use_test_time_registers"]


@dataclass(frozen=True)
class NeuronSearch:
    """Settings of Algorithm 1 (``None``: chosen from the images, see :func:`find_register_neurons`)."""

    detect_layer: int | None = None  # block whose output outliers define O
    top_layer: int | None = None  # only neurons of blocks <= this
    top_k: int = 10
    # the outlier threshold: log-norm median + k MAD over all patches of the set
    k: float = 5.0
    threshold: float | None = None  # an explicit norm threshold instead
    batch_size: int = 16
    device: str = "cpu"

    def __post_init__(self) -> None:
        bad_threshold = self.threshold is not None and self.threshold <= 0
        if self.top_k < 1 or self.k <= 0 or self.batch_size < 1 or bad_threshold:
            needs = "top_k >= 1, k > 0, batch_size >= 1 and a positive threshold"
            raise InputError(f"register-neuron search needs {needs}")


@dataclass
class NeuronSearchResult:
    neurons: list[RegisterNeuron]
    detect_layer: int
    top_layer: int
    threshold: float
    images_with_outliers: int
    num_images: int
    # per block, with each block's own log-MAD threshold (picks the detect block)
    outlier_ratio: list[float]

    def describe(self) -> str:
        listed = ", ".join(f"{n.layer}:{n.neuron} ({n.score:.3g})" for n in self.neurons)
        images = f"{self.images_with_outliers}/{self.num_images} images"
        return (
            f"register neurons (block:unit (mean |activation| at outliers)): {listed}; "
            f"outliers read at block {self.detect_layer} above norm {self.threshold:.3g} "
            f"in {images}; neurons searched in blocks <= {self.top_layer}"
        )


@torch.no_grad()
def find_register_neurons(
    model: nn.Module, images: Sequence[LoadedImage], search: NeuronSearch = NeuronSearch()
) -> NeuronSearchResult:
    """Algorithm 1 of Jiang et al.: the outliers ``O`` are the patch tokens of block ``detect_layer``'s
    output above the threshold (log-norm median + k MAD, not an absolute norm; images without any are
    skipped); each MLP hidden unit (the input of its output projection, ``mlp.fc2`` or
    ``mlp.down_proj``, :func:`~vit5.eval.registers.register_sites`) of blocks <= ``top_layer`` scores
    its mean over images of ``mean_{p in O} |a(p)|``, and the ``top_k`` best over all blocks are the
    register neurons. Without ``detect_layer`` the block with the highest outlier ratio (own log-MAD
    threshold per block) is used; ``top_layer`` defaults to it."""
    info = describe(model)
    if info.test_registers:
        raise InputError(
            "find register neurons on the model itself, not inside use_test_time_registers()",
        )
    sites = register_sites(model)  # an MLP to search in
    net = unwrap(model).eval().to(search.device)
    layout = info.layout(images[0].rgb.shape[:2])
    inputs = list(batches(images, info, search.batch_size, search.device))
    norms = []
    rows: dict[int, torch.Tensor] = {}

    def patch_norms_of(block: int, attention, tokens: torch.Tensor) -> None:
        # each block's output is reduced to its patch norms [B, P] at once and dropped
        rows[block] = layout.patches(tokens).float().norm(dim=-1)

    with capture(net, attention=False, on_layer=patch_norms_of):
        for x in inputs:
            net.forward_features(x)
            norms.append(torch.stack([rows.pop(i) for i in range(info.depth)], 1))
    patch_norms = torch.cat(norms).cpu().numpy()  # [M, L, P]
    thresholds = layer_thresholds(patch_norms, search.k)
    per_block = outlier_ratio(patch_norms, thresholds).mean(axis=0)
    detect = search.detect_layer
    if detect is None:
        detect = int(np.argmax(per_block))
    detect = take_indices(info.depth, [detect])[0]
    top = search.top_layer
    if top is None:
        top = detect
    top = take_indices(info.depth, [top])[0]
    # a given threshold is positive, so `or` falls back only when none is given
    tau = search.threshold or log_mad_threshold(patch_norms[:, detect], search.k)
    # [L, H]: summed over the images with outliers; each MLP's hidden activation [B, N, H] is
    # reduced in its hook, so memory holds one block's at a time (high resolution)
    scores = torch.zeros(top + 1, sites.width, device=search.device)
    used = 0
    start = 0
    weights = None

    def add_scores(layer: int, hidden: torch.Tensor) -> None:
        patches = layout.patches(hidden).abs().float()
        # [b, 1, P] @ [b, P, H]: the mean over each image's outliers, summed over images
        scores[layer] += (weights @ patches)[:, 0].sum(dim=0)

    for x in inputs:
        above = patch_norms[start : start + len(x), detect] > tau
        outliers = torch.from_numpy(above).to(x.device)  # [b, P]
        start += len(x)
        counts = outliers.sum(dim=1, keepdim=True).clamp_min(1)
        weights = (outliers / counts).unsqueeze(1)  # images without outliers add zeros
        with ExitStack() as stack:
            mlp_input_hooks(stack, sites, range(top + 1), add_scores)
            net.forward_features(x)
        used += int(outliers.any(dim=1).sum())
    if used == 0:
        raise InputError(
            f"no image has a patch above norm {tau:.3g} at block {detect}: "
            "there are no outliers to trace (lower --k or give --threshold)"
        )
    mean = (scores / used).cpu().flatten()
    order = torch.argsort(mean, descending=True)[: search.top_k]
    width = scores.shape[1]
    neurons = []
    for i in order.tolist():
        neurons.append(RegisterNeuron(layer=i // width, neuron=i % width, score=float(mean[i])))
    return NeuronSearchResult(
        neurons=neurons,
        detect_layer=detect,
        top_layer=top,
        threshold=float(tau),
        images_with_outliers=used,
        num_images=len(images),
        outlier_ratio=[float(v) for v in per_block],
    )

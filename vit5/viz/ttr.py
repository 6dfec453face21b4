"""Test-time registers (Jiang et al., arXiv 2506.08010, Algorithms 1 and 2; official code
nickjiang2378/test-time-registers ``shared/algorithms.py``, ``shared/hook_fn.py``): find the MLP neurons
that write high-norm outliers and move their activation into an appended token. While active, ``describe``
reports the tokens as registers at the end, so collection, metrics and figures treat them as registers."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass

import numpy as np
import torch
from torch import nn

from vit5.errors import InputError
from vit5.introspect import TEST_REGISTERS_ATTR, ModelInfo, describe
from vit5.layers import RopeTable
from vit5.model import take_indices
from vit5.model.vit import unwrap
from vit5.viz.artifacts import layer_thresholds, log_mad_threshold, outlier_ratio
from vit5.viz.collect import capture
from vit5.viz.images import LoadedImage, batches


@dataclass(frozen=True)
class RegisterNeuron:
    layer: int  # block index
    neuron: int  # hidden unit of the block's MLP
    score: float  # mean |activation| at the outlier positions


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


def _mlp_input_hooks(stack: ExitStack, net: nn.Module, layers: Sequence[int], hook) -> None:
    """``hook(layer, hidden [B, N, H]) -> new hidden or None`` on each block's MLP hidden activation."""
    for layer in layers:
        fc2 = getattr(getattr(net.blocks[layer], "mlp", None), "fc2", None)
        if not isinstance(fc2, nn.Module):
            raise InputError(
                f"block {layer} has no mlp.fc2 to read hidden activations from (unsupported MLP)"
            )

        def pre(module, args, layer=layer):
            new = hook(layer, args[0])
            return None if new is None else (new, *args[1:])

        stack.callback(fc2.register_forward_pre_hook(pre, prepend=True).remove)


@torch.no_grad()
def find_register_neurons(
    model: nn.Module, images: Sequence[LoadedImage], search: NeuronSearch = NeuronSearch()
) -> NeuronSearchResult:
    """Algorithm 1 of Jiang et al.: the outliers ``O`` are the patch tokens of block ``detect_layer``'s output
    above the threshold (log-norm median + k MAD, not an absolute norm; images without any are skipped); each
    MLP hidden unit (``mlp.fc2``'s input) of blocks <= ``top_layer`` scores its mean over images of
    ``mean_{p in O} |a(p)|``, and the ``top_k`` best over all blocks are the register neurons. Without
    ``detect_layer`` the block with the highest outlier ratio (own log-MAD threshold per block) is used;
    ``top_layer`` defaults to it."""
    info = describe(model)
    if info.test_registers:
        raise InputError(
            "find register neurons on the model itself, not inside use_test_time_registers()",
        )
    net = unwrap(model).eval().to(search.device)
    layout = info.layout(images[0].rgb.shape[:2])
    inputs = list(batches(images, info, search.batch_size, search.device))
    norms = []
    with capture(net, attention=False) as rec:
        for x in inputs:
            net.forward_features(x)
            blocks = [rec.tokens[i] for i in range(info.depth)]
            block_norms = [layout.patches(t).float().norm(dim=-1) for t in blocks]
            norms.append(torch.stack(block_norms, 1))
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
    # [L, H]: summed over the images with outliers
    scores = 0.0
    used = 0
    start = 0
    hidden: dict[int, torch.Tensor] = {}

    def keep(layer: int, h: torch.Tensor) -> None:
        hidden[layer] = h.abs()

    for x in inputs:
        with ExitStack() as stack:
            _mlp_input_hooks(stack, net, range(top + 1), keep)
            net.forward_features(x)
        above = patch_norms[start : start + len(x), detect] > tau
        outliers = torch.from_numpy(above).to(x.device)  # [b, P]
        start += len(x)
        counts = outliers.sum(dim=1, keepdim=True).clamp_min(1)
        weights = (outliers / counts).unsqueeze(1)  # [b, 1, P]
        layers = range(top + 1)
        per_image = [(weights @ layout.patches(hidden[i]).float())[:, 0] for i in layers]
        # images without outliers add zeros
        scores = scores + torch.stack(per_image, dim=1).sum(dim=0)
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


def check_test_time_registers(model: nn.Module) -> ModelInfo:
    """``model``'s description if test-time registers can be appended to it; else an InputError
    (a model with trained registers, a timm Eva), raised before any neuron search."""
    info = describe(model)
    if info.num_registers:
        raise InputError(
            f"{info.name} already has {info.num_registers} trained registers: "
            "test-time registers are for models trained without them"
        )
    if type(unwrap(model)).__name__ == "Eva":
        raise InputError(
            "timm Eva models apply RoPE to exactly the patch tokens, so no token can be appended: "
            "test-time registers support vit5 and timm VisionTransformer models"
        )
    return info


@contextmanager
def use_test_time_registers(
    model: nn.Module, neurons: Sequence[RegisterNeuron], count: int = 1
) -> Iterator[None]:
    """Algorithm 2 of Jiang et al.: ``count`` zero tokens are appended after every other token (no position
    embedding, no RoPE rotation) before the first block and dropped before the final norm; at each register
    neuron they take the neuron's maximum over all tokens and the patch tokens are zeroed
    (CLS keeps its value, as in the official hook, which edits image 0 only; this edits every image)."""
    info = check_test_time_registers(model)
    net = unwrap(model)
    if info.test_registers:
        raise InputError("test-time registers are already active on this model")
    if count < 1 or not neurons:
        raise InputError("test-time registers need count >= 1 and at least one register neuron")
    by_layer: dict[int, list[int]] = {}
    for n in neurons:
        by_layer.setdefault(take_indices(info.depth, [n.layer])[0], []).append(n.neuron)
    state: dict = {}

    # the model's own layout (info predates the context)
    def remember_size(module, args) -> None:
        state["layout"] = info.layout(tuple(args[0].shape[-2:]))
        state["n"] = state["layout"].num_tokens

    def append(module, args):
        x = args[0]
        if x.shape[1] == state["n"]:  # first block: append the zero tokens
            x = torch.cat([x, x.new_zeros(x.shape[0], count, x.shape[2])], dim=1)
        rope = args[1] if len(args) > 1 else None
        if not (isinstance(rope, RopeTable) and rope.num_tokens == state["n"]):
            return (x, *args[1:])
        # vit5: unrotated rows for the new tokens, one table per forward
        if state.get("rope_in") is not rope:
            width = rope.cos.shape[1]
            cos = torch.cat([rope.cos, rope.cos.new_ones(count, width)])
            sin = torch.cat([rope.sin, rope.sin.new_zeros(count, width)])
            state["rope_in"] = rope
            state["rope_out"] = RopeTable(cos, sin, rope.layout)
        return (x, state["rope_out"], *args[2:])

    def drop(module, args):
        return (args[0][:, : state["n"]], *args[1:])

    def move(layer: int, hidden: torch.Tensor) -> torch.Tensor:
        index = torch.tensor(by_layer[layer], device=hidden.device)
        hidden = hidden.clone()
        # [B, 1, k]: each neuron's max over all tokens
        peak = hidden[:, :, index].amax(dim=1, keepdim=True)
        hidden[:, -count:, index] = peak.expand(-1, count, -1)
        hidden[:, state["layout"].patch_slice, index] = 0
        return hidden

    with ExitStack() as stack:
        sizing = net.patch_embed.register_forward_pre_hook(remember_size, prepend=True)
        stack.callback(sizing.remove)
        for block in net.blocks:
            stack.callback(block.register_forward_pre_hook(append, prepend=True).remove)
        stack.callback(net.norm.register_forward_pre_hook(drop, prepend=True).remove)
        _mlp_input_hooks(stack, net, sorted(by_layer), move)
        setattr(net, TEST_REGISTERS_ATTR, count)
        stack.callback(delattr, net, TEST_REGISTERS_ATTR)
        yield

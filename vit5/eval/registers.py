"""Test-time registers at inference (Jiang et al., arXiv 2506.08010, Algorithm 2; official code
nickjiang2378/test-time-registers ``shared/hook_fn.py``): untrained zero tokens added before the
first block, fed at chosen MLP "register neurons" with the neuron's maximum over the image while
the patches' activations are zeroed. The neuron search (Algorithm 1) is
:func:`vit5.viz.ttr.find_register_neurons`; this module sits in eval so that dense features can
use the tokens (eval is below viz, docs/architecture.md).

One algorithm for every family; what differs between families is found once by
:func:`register_sites` (:class:`RegisterSites`): each block's MLP output projection (its input is
the hidden activation the neurons live in) and which attentions count the unrotated leading
tokens. Where the tokens go: right after the model's trained registers, so that the registers stay
one block of the :class:`~vit5.model.TokenLayout` (``describe`` counts them while active):

- vit5 ``[CLS | patches | registers | test-time]``: at the end, with angle 0 in the model's
  :class:`~vit5.layers.RopeTable` (unrotated, as CLS is);
- timm ``[CLS | registers | test-time | patches]``: after the prefix tokens. timm ``Eva`` models
  (EVA-02, DINOv3) rotate exactly the tokens after their ``num_prefix_tokens`` (timm
  ``eva.py``, ``EvaAttention.forward``), so each attention's count is raised by the new tokens:
  they stay unrotated like CLS and the registers. A ``VisionTransformer`` has no position in its
  attention, and its position embedding is added before the tokens exist;
- transformers (:class:`~vit5.introspect.hf.HFBackbone`) ``[CLS | registers | test-time |
  patches]``, as timm. ``DINOv3ViTModel`` rotates only the last ``num_patches`` tokens, the rows
  of its RoPE table, and takes every token before them as a prefix token (transformers
  ``models/dinov3_vit/modeling_dinov3_vit.py``, ``apply_rotary_pos_emb``: ``num_prefix_tokens =
  num_tokens - num_patches``), so the new tokens stay unrotated with nothing changed; DINOv2 and
  ViT add their position embedding before the tokens exist. SigLIP has no CLS and SigLIP 2 masks
  its attention by the patch count: both are refused.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Required, TypedDict

import torch
from torch import nn

from vit5.errors import InputError
from vit5.files import read_json
from vit5.introspect import TEST_REGISTERS_ATTR, ModelInfo, describe
from vit5.layers import RopeTable
from vit5.model import take_indices
from vit5.model.vit import unwrap


@dataclass(frozen=True)
class RegisterNeuron:
    layer: int  # block index
    neuron: int  # hidden unit of the block's MLP
    score: float  # mean |activation| at the outlier positions


class NeuronsFile(TypedDict, total=False):
    """``register_neurons.json``: what ``vit5 viz ttr`` found (its ``NeuronSearchResult``), of
    which only the neurons are required (a hand-written file may list just them). The keys are
    ``NeuronSearchResult``'s fields (``vit5/viz/ttr.py``, a layer above, which writes the file): a
    field added there is an unknown key here, which
    ``tests/test_viz_ttr.py::test_neurons_read_back_from_the_json_of_viz_ttr`` catches."""

    neurons: Required[list[RegisterNeuron]]
    detect_layer: int
    top_layer: int
    threshold: float
    images_with_outliers: int
    num_images: int
    outlier_ratio: list[float]


def read_neurons(path: str | Path) -> list[RegisterNeuron]:
    """The register neurons of a ``register_neurons.json`` written by ``vit5 viz ttr``, the file
    checked as a :class:`NeuronsFile` (one error naming the field that breaks it)."""
    neurons = read_json(path, NeuronsFile)["neurons"]
    if not neurons:
        raise InputError(
            f"{path} lists no neurons: give the register_neurons.json of `vit5 viz ttr`"
        )
    return neurons


# the MLP output projection, whose input is the hidden activation: vit5, timm and transformers
# ViT / DINOv2 / SigLIP ``fc2``; transformers DINOv3 and DINOv2 SwiGLU ``down_proj``
MLP_OUTPUTS = ("fc2", "down_proj")
# transformers backbones that take test-time registers (SigLIP: no CLS, a patch-count mask)
TRANSFORMERS_TTR = ("Dinov2Model", "Dinov2WithRegistersModel", "DINOv3ViTModel", "ViTModel")
TRANSFORMERS_TTR += ("Dinov2ForImageClassification", "ViTForImageClassification")
SUPPORTED_TTR = "vit5 models, timm VisionTransformer / Eva (DINOv3) and transformers "
SUPPORTED_TTR += ", ".join(TRANSFORMERS_TTR)


@dataclass(frozen=True)
class RegisterSites:
    """What test-time registers touch in one model, the only family-specific part of
    Algorithms 1 and 2 (the module docstring says where each family keeps it)."""

    info: ModelInfo  # the model's own description (test-time registers off)
    # per block: the MLP output projection, whose input [B, N, H] holds the neurons
    projections: tuple[nn.Linear, ...]
    # attentions that leave their first ``num_prefix_tokens`` unrotated (timm Eva), raised while on
    prefix_counters: tuple[nn.Module, ...]

    @property
    def width(self) -> int:
        """The MLP hidden units per block."""
        return self.projections[0].in_features

    @property
    def insert_at(self) -> int:
        """The sequence index of the first test-time register: after the trained registers
        (-1: at the end, vit5)."""
        info = self.info
        if info.registers_first:
            return info.num_cls + info.num_registers
        return -1


def _mlp_output(block: nn.Module) -> nn.Linear | None:
    mlp = getattr(block, "mlp", None)
    for name in MLP_OUTPUTS:
        found = getattr(mlp, name, None)
        if isinstance(found, nn.Linear):
            return found
    return None


def register_sites(model: nn.Module) -> RegisterSites:
    """The :class:`RegisterSites` of ``model`` if test-time registers can be added to it: a vit5
    model, a timm ``VisionTransformer`` / ``Eva`` or a transformers DINOv2 / DINOv3 / ViT, with
    or without trained registers; raised before any search."""
    info = describe(model)
    if info.test_registers:
        raise InputError("test-time registers are already active on this model")
    if info.family == "transformers" and info.name not in TRANSFORMERS_TTR:
        raise InputError(
            f"test-time registers cannot be added to a transformers {info.name} "
            f"(no CLS token, or an attention mask sized to the patches): supported are {SUPPORTED_TTR}"
        )
    net = unwrap(model)
    projections = []
    for i, block in enumerate(net.blocks):
        found = _mlp_output(block)
        if found is None:
            raise InputError(
                f"block {i} has no mlp.{' or mlp.'.join(MLP_OUTPUTS)} to read hidden activations "
                f"from (unsupported MLP): supported are {SUPPORTED_TTR}"
            )
        projections.append(found)
    counters = []
    if info.family == "timm":
        for block in net.blocks:
            if isinstance(getattr(block.attn, "num_prefix_tokens", None), int):
                counters.append(block.attn)
    return RegisterSites(
        info=info,
        projections=tuple(projections),
        prefix_counters=tuple(counters),
    )


def check_test_time_registers(model: nn.Module) -> ModelInfo:
    """``model``'s description if test-time registers can be added to it (:func:`register_sites`)."""
    return register_sites(model).info


def mlp_input_hooks(stack: ExitStack, sites: RegisterSites, layers: Sequence[int], hook) -> None:
    """``hook(layer, hidden [B, N, H]) -> new hidden or None`` on each block's MLP hidden
    activation (the input of its output projection)."""
    for layer in layers:

        def pre(module, args, layer=layer):
            new = hook(layer, args[0])
            return None if new is None else (new, *args[1:])

        handle = sites.projections[layer].register_forward_pre_hook(pre, prepend=True)
        stack.callback(handle.remove)


def _unrotated(rope: RopeTable, count: int) -> RopeTable:
    """``rope`` with ``count`` rows of angle 0 at the end."""
    width = rope.cos.shape[1]
    cos = torch.cat([rope.cos, rope.cos.new_ones(count, width)])
    sin = torch.cat([rope.sin, rope.sin.new_zeros(count, width)])
    return RopeTable(cos, sin, rope.layout)


@contextmanager
def use_test_time_registers(
    model: nn.Module, neurons: Sequence[RegisterNeuron], count: int = 1
) -> Iterator[None]:
    """Algorithm 2 of Jiang et al.: ``count`` zero tokens (no position embedding, no rotation)
    are added after the trained registers before the first block and dropped before the final
    norm; at each register neuron they take the neuron's maximum over all tokens and the patch
    tokens are zeroed (CLS keeps its value, as in the official hook, which edits image 0 only;
    this edits every image)."""
    sites = register_sites(model)
    info = sites.info
    net = unwrap(model)
    if count < 1 or not neurons:
        raise InputError("test-time registers need count >= 1 and at least one register neuron")
    by_layer: dict[int, list[int]] = {}
    for n in neurons:
        by_layer.setdefault(take_indices(info.depth, [n.layer])[0], []).append(n.neuron)
    too_big = [n.neuron for n in neurons if n.neuron >= sites.width]
    if too_big:
        raise InputError(
            f"register neurons {too_big} do not exist: the MLPs have {sites.width} hidden units "
            "(neurons found on another model?)"
        )
    start = sites.insert_at
    active = replace(info, test_registers=count)
    state: dict = {}

    # the model's own layout (info predates the context)
    def remember_size(module, args) -> None:
        size = tuple(args[0].shape[-2:])
        plain = info.layout(size)
        state["n"] = plain.num_tokens
        at = plain.num_tokens if start < 0 else start
        state["new"] = slice(at, at + count)
        state["patches"] = active.layout(size).patch_slice

    def add(module, args):
        x = args[0]
        if x.shape[1] == state["n"]:  # first block: add the zero tokens
            at = state["new"].start
            zeros = x.new_zeros(x.shape[0], count, x.shape[2])
            x = torch.cat([x[:, :at], zeros, x[:, at:]], dim=1)
        rope = args[1] if len(args) > 1 else None
        if not (isinstance(rope, RopeTable) and rope.num_tokens == state["n"]):
            return (x, *args[1:])
        # vit5: unrotated rows for the new tokens, one table per forward
        if state.get("rope_in") is not rope:
            state["rope_in"] = rope
            state["rope_out"] = _unrotated(rope, count)
        return (x, state["rope_out"], *args[2:])

    def drop(module, args):
        x = args[0]
        new = state["new"]
        if x.shape[1] != state["n"] + count:
            return None
        return (torch.cat([x[:, : new.start], x[:, new.stop :]], dim=1), *args[1:])

    def move(layer: int, hidden: torch.Tensor) -> torch.Tensor:
        index = torch.tensor(by_layer[layer], device=hidden.device)
        hidden = hidden.clone()
        # [B, 1, k]: each neuron's max over all tokens
        peak = hidden[:, :, index].amax(dim=1, keepdim=True)
        hidden[:, state["new"], index] = peak.expand(-1, count, -1)
        hidden[:, state["patches"], index] = 0
        return hidden

    with ExitStack() as stack:
        sizing = net.patch_embed.register_forward_pre_hook(remember_size, prepend=True)
        stack.callback(sizing.remove)
        for block in net.blocks:
            stack.callback(block.register_forward_pre_hook(add, prepend=True).remove)
        for attn in sites.prefix_counters:
            # Eva: the new tokens join the unrotated prefix
            stack.callback(setattr, attn, "num_prefix_tokens", attn.num_prefix_tokens)
            attn.num_prefix_tokens += count
        stack.callback(net.norm.register_forward_pre_hook(drop, prepend=True).remove)
        mlp_input_hooks(stack, sites, sorted(by_layer), move)
        setattr(net, TEST_REGISTERS_ATTR, count)
        stack.callback(delattr, net, TEST_REGISTERS_ATTR)
        yield

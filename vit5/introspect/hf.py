"""transformers backbones as the tools see them: :func:`load_transformers` turns a hub id or a
``save_pretrained`` folder into an :class:`HFBackbone`, a wrapper with timm's model contract
(``blocks``, ``patch_embed``, ``norm``, ``forward_features``, ``forward_intermediates``,
``forward_head``), so eval, viz and predict treat it as a timm ViT; :func:`record_transformers`
records its attention and block outputs.

Attention keeps transformers' fused path: the model is loaded with ``attn_implementation=
"vit5_sdpa"``, transformers' own ``sdpa_attention_forward`` registered under that name through
its ``AttentionInterface`` (https://huggingface.co/docs/transformers/attention_interface). Each
layer's attention module hands the registered function its queries and keys after its own
projections and (DINOv3) RoPE; a recorder set on the module takes them and
:func:`vit5.model.capture.summarise_attention` computes the softmax. Without a recorder it is plain SDPA.

Hidden states: transformers' ``hidden_states[0]`` is the embedding output and
``hidden_states[i + 1]`` the output of layer ``i``, before the final layernorm (checked by
tests/test_transformers_backbones.py); ``norm=True`` applies the model's final layernorm.
transformers is imported only when a ``transformers:`` spec is loaded."""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vit5.errors import InputError
from vit5.model.capture import Recording
from vit5.model.vit import take_indices

# class -> what it is; a config whose architecture is none of these loads by its model type
BACKBONES = {
    "Dinov2Model": "DINOv2",
    "Dinov2WithRegistersModel": "DINOv2 with registers",
    "DINOv3ViTModel": "DINOv3 ViT (RoPE)",
    "ViTModel": "ViT",
    "SiglipVisionModel": "SigLIP vision tower",
    "Siglip2VisionModel": "SigLIP 2 vision tower",
}
HEADS = {
    "ViTForImageClassification": "ViT classifier",
    "Dinov2ForImageClassification": "DINOv2 classifier",
}
SUPPORTED_CLASSES = {**BACKBONES, **HEADS}
BY_MODEL_TYPE = {
    "dinov2": "Dinov2Model",
    "dinov2_with_registers": "Dinov2WithRegistersModel",
    "dinov3_vit": "DINOv3ViTModel",
    "vit": "ViTModel",
    "siglip_vision_model": "SiglipVisionModel",
    "siglip": "SiglipVisionModel",
    "siglip2_vision_model": "Siglip2VisionModel",
    "siglip2": "Siglip2VisionModel",
}
NO_CLS = ("siglip_vision_model", "siglip2_vision_model")
ATTENTION = "vit5_sdpa"
RECORDER = "vit5_recorder"
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
PROCESSOR_FILE = "preprocessor_config.json"
INSTALL = "pip install 'vit5[transformers]'"


def _import_transformers():
    try:
        import transformers
    except ImportError as err:
        raise InputError(
            f"transformers: model specs need the transformers package, which is not installed: {INSTALL}",
        ) from err
    return transformers


def _register_attention() -> None:
    """Register ``vit5_sdpa``: transformers' SDPA that first hands q, k and the scale to
    the module's recorder, if one is set (idempotent)."""
    from transformers import AttentionInterface
    from transformers.integrations.sdpa_attention import sdpa_attention_forward
    from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

    def recorded_sdpa(module, query, key, value, attention_mask, **kwargs):
        recorder = getattr(module, RECORDER, None)
        if recorder is not None:
            if attention_mask is not None:
                message = "attention with a padding mask cannot be recorded"
                raise InputError(message)
            scale = kwargs.get("scaling") or query.shape[-1] ** -0.5
            recorder(query.detach(), key.detach(), scale)
        return sdpa_attention_forward(
            module,
            query,
            key,
            value,
            attention_mask,
            **kwargs,
        )

    AttentionInterface.register(ATTENTION, recorded_sdpa)
    AttentionMaskInterface.register(ATTENTION, sdpa_mask)


class ImageEntry(nn.Identity):
    """Where the image ``[B, 3, H, W]`` enters the model: timm's ``patch_embed``
    hook point, where the tools read the input size."""


class HFBackbone(nn.Module):
    """A transformers vision backbone (or classifier) with timm's model contract.

    ``pretrained_cfg`` is timm's data config (input size, mean, std, crop), read from
    the folder's ``preprocessor_config.json``."""

    def __init__(
        self,
        model: nn.Module,
        pretrained_cfg: dict[str, Any],
    ) -> None:
        super().__init__()
        self.hf = model
        self.patch_embed = ImageEntry()
        self.pretrained_cfg = pretrained_cfg
        config = _backbone(model).config
        self.arch = type(model).__name__
        self.model_type = config.model_type
        self.depth = config.num_hidden_layers
        self.embed_dim = config.hidden_size
        self.num_heads = config.num_attention_heads
        self.patch_size = config.patch_size
        self.img_size = _image_size(config)
        self.has_cls = self.model_type not in NO_CLS
        self.num_registers = getattr(config, "num_register_tokens", 0)
        self.num_prefix_tokens = int(self.has_cls) + self.num_registers
        self.has_head = self.arch in HEADS
        self.num_classes = model.config.num_labels if self.has_head else 0

    @property
    def base(self) -> nn.Module:
        return _backbone(self.hf)

    @property
    def blocks(self) -> nn.ModuleList:
        """The transformer layers (the ModuleList of ``depth`` modules)."""
        for module in self.base.modules():
            is_list = isinstance(module, nn.ModuleList)
            if is_list and len(module) == self.depth:
                return module
        raise InputError(f"{self.arch}: no list of {self.depth} layers found")

    @property
    def norm(self) -> nn.Module:
        """The final layernorm (``layernorm``, ``norm`` or ``post_layernorm``)."""
        for name in ("layernorm", "norm", "post_layernorm"):
            module = getattr(self.base, name, None)
            if isinstance(module, nn.LayerNorm):
                return module
        raise InputError(f"{self.arch}: no final layernorm found")

    def attention_modules(self) -> list[nn.Module]:
        """Each layer's attention module: the one transformers records
        ``attentions`` from (``_can_record_outputs``)."""
        kind = self.base._can_record_outputs["attentions"]
        found = []
        for block in self.blocks:
            inner = [m for m in block.modules() if isinstance(m, kind)]
            found.append(inner[0] if len(inner) == 1 else None)
        return found

    @property
    def unrecordable(self) -> str:
        """Why the attention cannot be recorded; "" when it can."""
        if self.hf.config._attn_implementation != ATTENTION:
            return (
                f"this {self.arch} was not loaded through vit5's loader "
                f"(attn_implementation={ATTENTION!r}); its attention cannot be recorded"
            )
        if None in self.attention_modules():
            return f"{self.arch}: a layer has no single attention module to record"
        return ""

    def _inputs(self, x: torch.Tensor) -> dict[str, Any]:
        """The keyword arguments of the transformers forward for images ``x``."""
        x = self.patch_embed(x)
        if self.model_type == "siglip2_vision_model":
            return _siglip2_inputs(x, self.patch_size)
        inputs = {"pixel_values": x}
        if self.model_type in ("vit", "siglip_vision_model"):
            inputs["interpolate_pos_encoding"] = True
        return inputs

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """All tokens ``[B, N, C]`` after the final layernorm."""
        return self.base(**self._inputs(x)).last_hidden_state

    def forward_head(
        self,
        tokens: torch.Tensor,
        pre_logits: bool = False,
    ) -> torch.Tensor:
        """The pooled feature (CLS; SigLIP: its attention-pooling head, else
        the patch mean), or with a head its logits, computed as transformers does
        (ViT: the CLS; DINOv2: CLS and the mean of the other tokens)."""
        if not pre_logits and self.has_head:
            classifier = self.hf.classifier
            if self.arch == "Dinov2ForImageClassification":
                rest = tokens[:, 1:].mean(dim=1)
                return classifier(torch.cat([tokens[:, 0], rest], dim=1))
            return classifier(tokens[:, 0])
        if self.has_cls:
            return tokens[:, 0]
        head = getattr(self.base, "head", None)
        if head is not None:
            return head(tokens)
        return tokens.mean(dim=1)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """Logits with a classification head, else the pooled feature."""
        if self.has_head:
            return self.hf(**self._inputs(x)).logits
        return self.forward_head(self.forward_features(x), pre_logits=True)

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: Sequence[int],
        norm: bool = False,
        return_prefix_tokens: bool = True,
        stop_early: bool = True,
        output_fmt: str = "NCHW",
        intermediates_only: bool = True,
    ) -> list:
        """timm's contract for the outputs of layers ``indices``: the patch grid
        ``[B, C, h, w]`` and the prefix ``[CLS | registers]`` (and any test-time registers), from
        transformers' ``hidden_states`` (``norm``: after the final layernorm). Only the
        intermediates are returned and the forward runs to the end."""
        if output_fmt != "NCHW" or not intermediates_only:
            raise InputError("transformers backbones give NCHW intermediates only")
        grid = (x.shape[-2] // self.patch_size, x.shape[-1] // self.patch_size)
        out = self.base(**self._inputs(x), output_hidden_states=True)
        wanted = take_indices(self.depth, list(indices))
        results = []
        for i in wanted:
            tokens = out.hidden_states[i + 1]
            if norm:
                tokens = self.norm(tokens)
            # the prefix is all before the patches (test-time registers too, vit5.eval.registers)
            start = tokens.shape[1] - grid[0] * grid[1]
            patches = tokens[:, start:].transpose(1, 2).unflatten(-1, grid)
            prefix = tokens[:, :start]
            results.append((patches, prefix) if return_prefix_tokens else patches)
        return results


def _backbone(model: nn.Module) -> nn.Module:
    """The backbone: the model itself, or a classifier's (its ``base_model_prefix``;
    not ``base_model``, which for DINOv3 is the encoder)."""
    if type(model).__name__ in HEADS:
        return getattr(model, model.base_model_prefix)
    return model


def _image_size(config) -> tuple[int, int]:
    """The size the backbone was trained at (SigLIP 2: its position grid)."""
    size = getattr(config, "image_size", None)
    if size is None:
        size = math.isqrt(config.num_patches) * config.patch_size
    if isinstance(size, int):
        return (size, size)
    return tuple(size)


def _siglip2_inputs(x: torch.Tensor, patch: int) -> dict[str, Any]:
    """SigLIP 2 takes patches flattened as its image processor does
    (``convert_image_to_patches``: row-major patches of ``(p, p, C)``)."""
    batch = x.shape[0]
    channels = x.shape[1]
    rows = x.shape[-2] // patch
    cols = x.shape[-1] // patch
    grid = x.reshape(batch, channels, rows, patch, cols, patch)
    patches = grid.permute(0, 2, 4, 3, 5, 1).flatten(3)
    shapes = torch.tensor([[rows, cols]], device=x.device)
    mask = torch.ones(batch, rows * cols, dtype=torch.long)
    return {
        "pixel_values": patches.flatten(1, 2),
        "pixel_attention_mask": mask.to(x.device),
        "spatial_shapes": shapes.expand(batch, 2),
    }


@contextmanager
def record_transformers(
    net: HFBackbone,
    layers: Sequence[int],
    attention: bool,
    tokens: bool,
    layout_of: Callable,
    summariser: Callable[[int], Callable[[torch.Tensor, torch.Tensor, float], None]],
) -> Iterator[Recording]:
    """Record the attention and layer outputs of ``layers``, the model keeping its SDPA path:
    ``summariser(i)`` receives layer ``i``'s queries, keys and scale (after the model's own
    projections and RoPE) and keeps what it needs (:func:`vit5.model.capture.summarise_attention`);
    ``layout_of(image_hw)`` gives the token layout."""
    rec = Recording(
        depth=net.depth,
        attention_layers=list(layers) if attention else [],
        token_layers=list(layers) if tokens else [],
    )
    modules = net.attention_modules()

    def keep_tokens(i: int):
        def keep(module, inputs, output) -> None:
            rec.tokens[i] = output.detach()

        return keep

    def on_image(module, args) -> None:
        rec.layout = layout_of(tuple(args[0].shape[-2:]))

    with ExitStack() as stack:
        entry = net.patch_embed.register_forward_pre_hook(on_image)
        stack.callback(entry.remove)
        for i in rec.attention_layers:
            setattr(modules[i], RECORDER, summariser(i))
            stack.callback(delattr, modules[i], RECORDER)
        for i in rec.token_layers:
            handle = net.blocks[i].register_forward_hook(keep_tokens(i))
            stack.callback(handle.remove)
        yield rec


def load_transformers(source: str) -> tuple[HFBackbone, str]:
    """The backbone of a hub id or a local ``save_pretrained`` folder, and
    what was loaded: safetensors only, no remote code, every weight used."""
    transformers = _import_transformers()
    folder = Path(source).expanduser()
    if folder.is_dir():
        _check_safetensors(folder)
    elif _looks_like_path(source):
        raise InputError(
            f"transformers:{source}: no such folder; give a folder written by "
            "save_pretrained (config.json and model.safetensors) or a hub id (USER/REPO)",
        )
    config = _config(transformers, source)
    arch = _architecture(config, source)
    _register_attention()
    model_class = getattr(transformers, arch)
    try:
        model, report = model_class.from_pretrained(
            source,
            attn_implementation=ATTENTION,
            use_safetensors=True,
            trust_remote_code=False,
            output_loading_info=True,
        )
    except OSError as err:
        raise InputError(_fetch_failure(source, err)) from err
    broken = sorted(report["missing_keys"]) + sorted(report["mismatched_keys"])
    if broken:
        raise InputError(
            f"transformers:{source} does not fit {arch}: missing or mismatched "
            f"weights {', '.join(map(str, broken[:6]))}",
        )
    cfg, note = _data_config(transformers, source, model)
    backbone = HFBackbone(model.eval(), cfg)
    ignored = len(report["unexpected_keys"])
    parts = [f"transformers {arch} {source}", "safetensors"]
    if ignored:
        parts.append(f"{ignored} weights not used by {arch} (a head)")
    if note:
        parts.append(note)
    return backbone, ", ".join(parts)


def _looks_like_path(source: str) -> bool:
    hub_id = source.count("/") <= 1 and not source.startswith((".", "/", "~"))
    return not hub_id


def _check_safetensors(folder: Path) -> None:
    if any(folder.glob("*.safetensors")):
        return
    pickled = sorted(p.name for p in folder.glob("*.bin"))
    pickled += sorted(p.name for p in folder.glob("*.pt*"))
    found = f"only pickle weights ({', '.join(pickled)})" if pickled else "no weights"
    raise InputError(
        f"transformers:{folder} holds {found}: vit5 loads safetensors only (pickle "
        "files can run code); convert it with model.save_pretrained(folder, "
        "safe_serialization=True) where you trust the file",
    )


def _fetch_failure(source: str, err: Exception) -> str:
    return (
        f"cannot load transformers:{source}: it is not a folder, and the Hugging Face "
        f"Hub cannot give it ({str(err).splitlines()[0]}). Offline (HF_HUB_OFFLINE, no "
        "network, or not in the cache under HF_HOME): save the model with "
        "save_pretrained where there is network and give its folder, "
        "transformers:/path/to/folder"
    )


def _config(transformers, source: str):
    """The model's config (JSON only, no remote code)."""
    try:
        return transformers.AutoConfig.from_pretrained(
            source,
            trust_remote_code=False,
        )
    except OSError as err:
        raise InputError(_fetch_failure(source, err)) from err
    except ValueError as err:  # a model type this transformers does not know
        raise InputError(_unknown(source, str(err).splitlines()[0])) from err


def _unknown(source: str, what: str) -> str:
    return f"transformers:{source} is {what}; supported are {', '.join(SUPPORTED_CLASSES)}"


def _architecture(config, source: str) -> str:
    """The class to load: the config's architecture where supported, else the
    backbone of its model type."""
    named = list(getattr(config, "architectures", None) or [])
    for arch in named:
        if arch in SUPPORTED_CLASSES:
            return arch
    arch = BY_MODEL_TYPE.get(config.model_type)
    if arch is None:
        what = f"a {'/'.join(named) or config.model_type} model"
        raise InputError(_unknown(source, what))
    return arch


def _data_config(
    transformers,
    source: str,
    model: nn.Module,
) -> tuple[dict[str, Any], str]:
    """timm's data config from the image processor's config (mean, std, size,
    crop); ImageNet defaults where there is none, with a note saying so."""
    from transformers.utils import cached_file

    path = cached_file(
        source,
        PROCESSOR_FILE,
        _raise_exceptions_for_missing_entries=False,
        _raise_exceptions_for_connection_errors=False,
    )
    processor = json.loads(Path(path).read_text()) if path else {}
    size = _image_size(_backbone(model).config)
    cfg = {
        "input_size": (3, *size),
        "mean": tuple(processor.get("image_mean", IMAGENET_MEAN)),
        "std": tuple(processor.get("image_std", IMAGENET_STD)),
        "crop_pct": 1.0,
        "interpolation": "bicubic",
    }
    _sizes(processor, cfg)
    labels = model.config.id2label if type(model).__name__ in HEADS else None
    if labels:
        cfg["label_names"] = [labels[i] for i in range(len(labels))]
    note = ""
    if "image_mean" not in processor:
        note = f"ImageNet mean/std (no {PROCESSOR_FILE} with image_mean)"
    return cfg, note


def _sizes(processor: dict[str, Any], cfg: dict[str, Any]) -> None:
    """Input size and crop of an image processor config, into ``cfg``."""
    size = processor.get("size") or {}
    crop = processor.get("crop_size") or {}
    if processor.get("do_center_crop") and "height" in crop:
        cfg["input_size"] = (3, crop["height"], crop["width"])
        if "shortest_edge" in size:
            cfg["crop_pct"] = crop["height"] / size["shortest_edge"]
    elif "height" in size:
        cfg["input_size"] = (3, size["height"], size["width"])

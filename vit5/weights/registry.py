"""Every preset as a timm model (``timm.create_model("vit5_small")``), built by ``build_model_with_cfg``:
``pretrained=True`` loads the released weights (a size name such as ``vit5_small`` means its 224 ones)
through vit5's download and reader and :func:`~vit5.weights.checkpoint.checkpoint_filter_fn`;
``features_only=True`` gives timm's ``FeatureGetterNet`` (default: the last 3 blocks)."""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError
from timm.models import build_model_with_cfg, generate_default_cfgs, get_arch_pretrained_cfgs, register_model
from timm.models._builder import resolve_pretrained_cfg

from vit5.model.config import ConfigError
from vit5.model.presets import PRESETS, preset_config
from vit5.model.vit import ViT5, default_pretrained_cfg
from vit5.weights import hub
from vit5.weights.checkpoint import checkpoint_filter_fn, read_checkpoint
from vit5.weights.convert import CheckpointError

default_cfgs = generate_default_cfgs(  # read by timm's register_model (same module)
    {r.name: r.pretrained_cfg() for r in hub.RELEASES.values()}
    | {
        name: default_pretrained_cfg(values.get("img_size", 224))
        for name, values in PRESETS.items()
        if name not in {r.arch for r in hub.RELEASES.values()}
    }
)


def _entrypoint(name: str) -> Callable[..., Any]:
    def build(pretrained: bool = False, **kwargs: Any):
        if not isinstance(pretrained, bool):
            raise CheckpointError(
                f"timm.create_model takes pretrained=True/False, got {pretrained!r}: for a local file use "
                f"pretrained_cfg_overlay=dict(file=PATH), or vit5.create_model({name!r}, pretrained=PATH)"
            )
        tag = kwargs.get("pretrained_cfg")
        if isinstance(tag, str) and f"{name}.{tag}" not in get_arch_pretrained_cfgs(name):
            raise CheckpointError(
                f"unknown pretrained tag {tag!r} for {name}: the released ViT-5 weights are "
                f"{', '.join(hub.RELEASES)}"
            )
        if not kwargs.pop("dynamic_img_size", True):  # vit5 models always take any patch-multiple size
            raise ConfigError(
                f"{name} takes any input size whose sides are patch multiples: drop dynamic_img_size=False"
            )
        variant, release = name, hub.default_release(name)
        if pretrained and tag is None and release is not None and release.arch != name:
            variant, kwargs["pretrained_cfg"] = release.name.split(".")  # a size name means its weights
        feature_cfg = {"feature_cls": "getter", "out_indices": 3, **kwargs.pop("feature_cfg", {})}
        feature_cfg.update({k: kwargs.pop(k) for k in ("out_indices", "feature_cls") if k in kwargs})
        cfg = resolve_pretrained_cfg(
            variant, kwargs.get("pretrained_cfg"), kwargs.get("pretrained_cfg_overlay")
        )
        if pretrained:
            kwargs["pretrained_cfg_overlay"] = pretrained_overlay(cfg, kwargs.get("pretrained_cfg_overlay"))
        try:
            model = build_model_with_cfg(
                lambda **config: ViT5(preset_config(name, **config)),
                variant,
                pretrained,
                pretrained_filter_fn=checkpoint_filter_fn,
                feature_cfg=feature_cfg,
                **kwargs,
            )
        except Exception as err:  # timm's own download or read failed: say what to do
            repo, revision = hub.split_revision(cfg.hf_hub_id or "")
            filename = cfg.hf_hub_filename or "pytorch_model.bin"
            if isinstance(err, (EntryNotFoundError, HfHubHTTPError)):
                with hub.clear_hub_errors(repo, filename, revision):
                    raise
            path = hub.cached_path(repo, filename, revision) if pretrained and repo else None
            if path is not None:  # an unreadable cached download: raise that, with the fix
                _read_cached(path, err)
            raise
        vit = model.model if hasattr(model, "model") else model  # a features_only wrapper holds it
        model.pretrained_cfg["input_size"] = (vit.cfg.in_chans, *vit.cfg.img_size)  # as built (img_size=)
        return model

    build.__name__ = build.__qualname__ = name
    build.__module__ = __name__
    build.__doc__ = f"vit5 preset {name!r}: {PRESETS[name]}"
    return build


def _read_cached(path: Any, cause: BaseException | None = None) -> dict[str, Any]:
    """The state dict of a cached download; an unreadable one says which files to delete."""
    try:
        return read_checkpoint(path).state_dict
    except CheckpointError as bad:
        raise CheckpointError(f"{bad}\n  {hub.cached_copy_advice(path)}") from cause or bad


def pretrained_overlay(cfg: Any, overlay: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """timm's ``pretrained_cfg_overlay`` with the Hub weights ``cfg`` names already downloaded (cache first,
    :func:`vit5.weights.hub.download`) and read by :func:`read_checkpoint` (sizes checked, no pickled code),
    so timm neither retries the network nor unpickles; unchanged when ``cfg`` names no Hub weights (a URL, a
    file, or an ``hf-hub:`` model, which timm resolves itself)."""
    get = cfg.get if isinstance(cfg, dict) else lambda key: getattr(cfg, key, None)
    if not get("hf_hub_id") or get("source") == "hf-hub" or get("file") or get("state_dict") is not None:
        return overlay
    repo, revision = hub.split_revision(get("hf_hub_id"))
    path = hub.download(repo, get("hf_hub_filename") or ("model.safetensors", "pytorch_model.bin"), revision)
    return {**(overlay or {}), "state_dict": _read_cached(path)}


def register_presets() -> None:
    for name in PRESETS:
        register_model(_entrypoint(name))

"""Every preset as a timm model: ``timm.create_model("vit5_small")``, pretrained configs, features.

Entry points are generated from the preset table (presets are data, not one function each) and
built by timm's own ``build_model_with_cfg``, so timm's keywords behave as for its ViTs:

- ``pretrained=True`` loads the released weights of the name (``vit5_small_patch16_224.in1k``;
  a bare size such as ``vit5_small`` means its 224 weights) from the Hugging Face Hub, through
  timm's loader (``weights_only``) and :func:`~vit5.weights.checkpoint.checkpoint_filter_fn`, the
  strict official converter; ``num_classes`` / ``in_chans`` adapt the head / stem as timm does.
- ``features_only=True`` wraps the model in timm's ``FeatureGetterNet`` over
  ``forward_intermediates`` (``out_indices`` default: the last 3 blocks); ``feature_cls``,
  ``feature_cfg`` and ``out_indices`` are consumed here, never passed to :class:`ViT5Config`.
- every preset has a pretrained config (data config, classifier, first conv), so timm's test
  filters (``name_matches_cfg``) and ``resolve_model_data_config`` see it.
- ``dynamic_img_size=True`` (what timm users pass to ViTs) is accepted: it is how vit5 models
  always work (any patch-multiple size; the APE is resampled, RoPE built for the grid).
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
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

_FEATURE_DEFAULTS = {
    "feature_cls": "getter",
    "out_indices": 3,
}  # timm's ViTs: a getter over the last 3 blocks


def _pretrained_cfgs() -> dict[str, dict[str, Any]]:
    """``ARCH.TAG`` cfgs with weights for the releases; a weightless cfg for every other preset."""
    released = {r.arch for r in hub.RELEASES.values()}
    cfgs: dict[str, dict[str, Any]] = {r.name: r.pretrained_cfg() for r in hub.RELEASES.values()}
    for name, values in PRESETS.items():
        if name not in released:
            cfgs[name] = default_pretrained_cfg(values.get("img_size", 224))
    return cfgs


default_cfgs = generate_default_cfgs(_pretrained_cfgs())  # read by timm's register_model (same module)


def _build(name: str, **kwargs: Any) -> ViT5:
    return ViT5(preset_config(name, **kwargs))


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
        release = hub.default_release(name)
        if pretrained and tag is None and release is not None and release.arch != name:
            kwargs["pretrained_cfg"] = release.name.partition(".")[
                2
            ]  # a size name means its released weights
            name_for_cfg = release.arch
        else:
            name_for_cfg = name
        if not kwargs.pop("dynamic_img_size", True):
            raise ConfigError(
                f"{name} takes any input size whose sides are patch multiples: drop dynamic_img_size=False"
            )
        feature_cfg = {**_FEATURE_DEFAULTS, **kwargs.pop("feature_cfg", {})}
        if "out_indices" in kwargs:
            feature_cfg["out_indices"] = kwargs.pop("out_indices")
        if "feature_cls" in kwargs:
            feature_cfg["feature_cls"] = kwargs.pop("feature_cls")
        cfg_source = {
            "variant": name_for_cfg,
            "pretrained_cfg": kwargs.get("pretrained_cfg"),
            "pretrained_cfg_overlay": kwargs.get("pretrained_cfg_overlay"),
        }
        if pretrained:
            kwargs["pretrained_cfg_overlay"] = pretrained_overlay(
                resolve_pretrained_cfg(**cfg_source), kwargs.get("pretrained_cfg_overlay")
            )
        try:
            model = build_model_with_cfg(
                partial(_build, name),
                name_for_cfg,
                pretrained,
                pretrained_filter_fn=checkpoint_filter_fn,
                feature_cfg=feature_cfg,
                **kwargs,
            )
        except (EntryNotFoundError, HfHubHTTPError):  # timm's own download failed: say what to do
            repo, filename, revision = _hub_source(**cfg_source)
            with hub.clear_hub_errors(repo, filename, revision):
                raise
        except Exception as err:  # timm read a file it could not load: if it is our damaged download, say so
            if pretrained:
                _explain_damaged_download(err, **cfg_source)
            raise
        # the data config describes the model as built (img_size=... given), as ViT5's own does
        vit = model.model if hasattr(model, "model") else model
        model.pretrained_cfg["input_size"] = (vit.cfg.in_chans, *vit.cfg.img_size)
        return model

    build.__name__ = build.__qualname__ = name
    build.__module__ = __name__
    build.__doc__ = f"vit5 preset {name!r}: {PRESETS[name]}"
    return build


def pretrained_overlay(cfg: Any, overlay: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """timm's ``pretrained_cfg_overlay`` with the weights of ``cfg`` already read: downloaded by
    :func:`vit5.weights.hub.timm_weights_file` (cache first, one short network attempt) and read by
    :func:`read_checkpoint` (sizes checked before loading, no pickled code), so timm neither retries
    the network nor unpickles the file itself. Unchanged when ``cfg`` names no Hub weights."""
    path = hub.timm_weights_file(cfg)
    if path is None:
        return overlay
    try:
        state_dict = read_checkpoint(path).state_dict
    except CheckpointError as bad:
        raise CheckpointError(f"{bad}\n  {hub.cached_copy_advice(path)}") from bad
    return {**(overlay or {}), "state_dict": state_dict}


def _hub_source(
    variant: str, pretrained_cfg: Any, pretrained_cfg_overlay: Any
) -> tuple[str, str, str | None]:
    cfg = resolve_pretrained_cfg(variant, pretrained_cfg, pretrained_cfg_overlay)
    repo, revision = hub.split_revision(cfg.hf_hub_id or "")
    return repo, cfg.hf_hub_filename or "pytorch_model.bin", revision


def _explain_damaged_download(err: BaseException, **cfg_source: Any) -> None:
    """If the failure comes from an unreadable cached download, raise that, with the fix."""
    repo, filename, revision = _hub_source(**cfg_source)
    path = hub.cached_path(repo, filename, revision) if repo else None
    if path is None:
        return
    try:
        read_checkpoint(path)
    except CheckpointError as bad:
        raise CheckpointError(f"{bad}\n  {hub.cached_copy_advice(path)}") from err


def register_presets() -> None:
    for name in PRESETS:
        register_model(_entrypoint(name))

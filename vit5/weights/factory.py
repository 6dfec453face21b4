"""The model factories, every load strict: :func:`create_model` (a preset, optionally with weights),
:func:`load_model` (the architecture read from the checkpoint) and every preset as a timm model
(``timm.create_model("vit5_small")``, ``build_model_with_cfg``; its weights through vit5's download and
reader; ``features_only=True`` gives timm's ``FeatureGetterNet``, default: the last 3 blocks)."""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any

from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError
from timm.models import build_model_with_cfg, generate_default_cfgs, get_arch_pretrained_cfgs, register_model
from timm.models._builder import resolve_pretrained_cfg

from vit5.model.config import ConfigError, ViT5Config
from vit5.model.footprint import DEFAULT_MAX_PARAMS, check_size
from vit5.model.presets import PRESETS, preset_config
from vit5.model.vit import ViT5, default_pretrained_cfg
from vit5.weights import hub
from vit5.weights.checkpoint import (
    CONFIG_NAME,
    EMA_WEIGHTS_NAME,
    WEIGHTS_NAME,
    Checkpoint,
    Pretrained,
    checkpoint_filter_fn,
    load_weights,
    read_checkpoint,
)
from vit5.weights.convert import CheckpointError, Source, config_from_checkpoint

logger = logging.getLogger("vit5")
_FAMILY_FIELDS = ("embed_dim", "norm", "qkv_bias", "qk_norm", "rope", "num_registers")


def create_model(
    name: str,
    pretrained: Pretrained = None,
    *,
    max_params: float = DEFAULT_MAX_PARAMS,
    log_report: bool = True,
    **overrides: Any,
) -> ViT5:
    """Build preset ``name`` (or a released name, as timm) with config ``overrides``; ``pretrained``: ``True``
    (the name's release), a released name (its image size too), ``"hf-hub:USER/REPO[@REVISION]"`` or a path
    (our directory, an official ``.pth``, a timm checkpoint). A new ``num_classes`` resets the head, a new
    ``img_size`` resamples the APE; ``use_ema=``, ``source=``, ``revision=``, ``cache_dir=`` are taken too.
    Over ``max_params``: refused before allocation. What was loaded: ``model.load_report``."""
    use_ema, source = overrides.pop("use_ema", False), overrides.pop("source", None)
    if hub.is_weights_name(name):  # as timm: "ARCH.TAG" builds ARCH; pretrained=True loads TAG's weights
        name, pretrained = name.partition(".")[0], name if pretrained is True else pretrained
    if pretrained is None or pretrained is False:
        cfg = preset_config(name, **overrides)
        check_size(cfg, max_params)
        return ViT5(cfg)
    if pretrained is True:
        release = hub.default_release(name)
        if release is None:
            raise CheckpointError(
                f"{name} has no released weights (released: {', '.join(hub.RELEASES)}): pass pretrained=PATH "
                "to load your own, or leave pretrained unset for random weights"
            )
        pretrained = release.name
    if isinstance(pretrained, str) and hub.is_weights_name(pretrained) and not Path(pretrained).exists():
        release = hub.release(pretrained)  # checked before any download
        overrides.setdefault("img_size", release.img_size)
        theirs, ours = (
            ", ".join(f"{k} {getattr(cfg, k)}" for k in ("embed_dim", "depth", "num_heads"))
            for cfg in (preset_config(release.arch), preset_config(name, **overrides))
        )
        if theirs != ours:
            raise CheckpointError(
                f"{release.name} holds a {release.arch} ({theirs}), not {name}: "
                f"create_model({release.arch!r}, pretrained=True)"
            )
    ckpt = _read_pretrained(pretrained, overrides, use_ema, source, max_params)
    if ckpt.config is None:
        cfg = preset_config(name, **overrides)
    else:  # our directory format knows its own architecture
        cfg = _stored_config(ckpt, overrides)
        _check_named_preset(name, cfg, pretrained, overrides)
    return _build_and_load(cfg, ckpt, "num_classes" in overrides, max_params, log_report)


def load_model(
    path: Pretrained,
    source: Source | None = None,
    use_ema: bool = False,
    *,
    max_params: float = DEFAULT_MAX_PARAMS,
    log_report: bool = True,
    **overrides: Any,
) -> ViT5:
    """Load any supported checkpoint (a path, ``hf-hub:USER/REPO[@REVISION]`` or a released name) without
    naming a preset: the architecture comes from ``config.json`` (our format) or the tensor shapes
    (official / timm); ``revision=`` and ``cache_dir=`` go to the download."""
    ckpt = _read_pretrained(path, overrides, use_ema, source, max_params)
    if ckpt.config is None:
        cfg = config_from_checkpoint(ckpt.state_dict, ckpt.source, **overrides)
    else:
        cfg = _stored_config(ckpt, overrides)
    return _build_and_load(cfg, ckpt, "num_classes" in overrides, max_params, log_report)


def _read_pretrained(
    pretrained: str | os.PathLike, overrides: dict, use_ema: bool, source: Source | None, max_params: float
) -> Checkpoint:
    """Read the weights ``pretrained`` names (``revision=``, ``cache_dir=`` popped from ``overrides``)."""
    text = os.fspath(pretrained)
    revision, cache_dir = overrides.pop("revision", None), overrides.pop("cache_dir", None)
    if text.startswith(hub.HF_HUB_PREFIX):
        repo_id, pinned = hub.split_revision(text[len(hub.HF_HUB_PREFIX) :])
        config = hub.download(repo_id, CONFIG_NAME, revision or pinned, cache_dir)
        weights = EMA_WEIGHTS_NAME if use_ema else WEIGHTS_NAME  # of the same commit (the config's folder)
        path = hub.download(repo_id, weights, config.parent.name, cache_dir).parent
    elif not Path(text).exists() and hub.is_weights_name(text):
        release = hub.release(text)
        path, source = hub.download(release.repo, release.filename, revision, cache_dir), source or "official"
    else:
        return read_checkpoint(text, use_ema=use_ema, source=source, max_params=max_params)
    ckpt = _read_download(path, f"{text}: ", use_ema=use_ema, source=source, max_params=max_params)
    if not path.is_dir():  # a released file: say which; a directory keeps its path (config.json messages)
        ckpt.path = f"{text} ({path})"
    return ckpt


def _stored_config(ckpt: Checkpoint, overrides: dict[str, Any]) -> ViT5Config:
    """The architecture of a directory's ``config.json`` (validated when read), with ``overrides``."""
    try:
        return ckpt.config.replace(**overrides)  # type: ignore[union-attr]
    except ConfigError as err:
        raise ConfigError(f"{Path(ckpt.path) / CONFIG_NAME} with overrides {overrides}: {err}") from err


def _family(cfg: ViT5Config) -> dict[str, Any]:
    return {**{f: getattr(cfg, f) for f in _FAMILY_FIELDS}, "layer_scale": cfg.layer_scale is not None}


def _check_named_preset(name: str, cfg: ViT5Config, pretrained: Any, overrides: dict[str, Any]) -> None:
    """The directory's config wins (depth, registers, ...), but naming another width or family than the one
    it holds is an error: ``deit3_tiny`` on a ``vit5_tiny`` directory would silently give a ViT-5."""
    named, held = _family(preset_config(name, **overrides)), _family(cfg)
    fix = "or use vit5.load_model(path), which reads the architecture"
    if named["embed_dim"] != held["embed_dim"]:
        raise CheckpointError(
            f"{pretrained} holds a model of width {cfg.embed_dim}, not {name} (width {named['embed_dim']}): "
            f"name the preset it was trained as, {fix}"
        )
    for other in PRESETS if named != held else ():  # a family no preset has (an ablation) loads as named
        with suppress(ConfigError):  # overrides that preset cannot take
            if _family(preset_config(other, **overrides)) == held:
                differ = ", ".join(f"{k}={v!r} (not {named[k]!r})" for k, v in held.items() if v != named[k])
                raise CheckpointError(
                    f"{pretrained} holds a {other}, not a {name}: {differ}. Name the preset it was "
                    f"trained as ({other}), {fix}"
                )


def _build_and_load(
    cfg: ViT5Config, ckpt: Checkpoint, ignore_head: bool, max_params: float, log_report: bool
) -> ViT5:
    check_size(cfg, max_params, source=ckpt.path)
    model = ViT5(cfg)
    report = model.load_report = load_weights(model, ckpt, ignore_head=ignore_head)
    if ckpt.class_names is not None and not report.reset:  # a new head has no names yet
        if len(ckpt.class_names) != model.num_classes:
            raise CheckpointError(
                f"{ckpt.path}/{CONFIG_NAME} names {len(ckpt.class_names)} classes (label_names) but the "
                f"model has {model.num_classes} outputs: the file was edited or belongs to another model"
            )
        model.pretrained_cfg["label_names"] = list(ckpt.class_names)
    if log_report:
        logger.log(logging.WARNING if report.reset or report.resampled else logging.INFO, str(report))
    return model


default_cfgs = generate_default_cfgs(  # read by timm's register_model (same module)
    {  # where each release lives and how its authors evaluated it
        r.name: dict(
            default_pretrained_cfg(r.img_size),
            hf_hub_id=r.repo,
            hf_hub_filename=r.filename,
            paper_ids=hub.PAPER_ID,
            paper_name=hub.PAPER_NAME,
            origin_url="https://github.com/wangf3014/ViT-5",
        )
        for r in hub.RELEASES.values()
    }
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
                _read_download(path)
            raise
        vit = model.model if hasattr(model, "model") else model  # a features_only wrapper holds it
        model.pretrained_cfg["input_size"] = (vit.cfg.in_chans, *vit.cfg.img_size)  # as built (img_size=)
        return model

    build.__name__ = build.__qualname__ = name
    build.__module__ = __name__
    build.__doc__ = f"vit5 preset {name!r}: {PRESETS[name]}"
    return build


def _read_download(path: Path, label: str = "", use_ema: bool = False, **kwargs: Any) -> Checkpoint:
    """:func:`read_checkpoint` of a cached download; an unreadable one says which files to delete."""
    try:
        return read_checkpoint(path, use_ema=use_ema, **kwargs)
    except CheckpointError as err:
        bad = path / (EMA_WEIGHTS_NAME if use_ema else WEIGHTS_NAME) if path.is_dir() else path
        blob = Path(os.path.realpath(bad))  # a cache's snapshot entries link to its blobs
        files = f"{bad}" + (f" and the blob it points to, {blob}" if blob != bad else "")
        advice = (
            f"\n  {bad} is a cached download from the Hugging Face Hub; if it is damaged (an interrupted or "
            f"altered download), delete {files}, then load again to fetch a fresh copy"
        )
        raise CheckpointError(f"{label}{err}{advice if str(bad) in str(err) else ''}") from err


def pretrained_overlay(cfg: Any, overlay: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """timm's ``pretrained_cfg_overlay`` with the Hub weights timm's ``cfg`` names already downloaded (cache
    first) and read (sizes checked, no pickled code): timm neither retries the network nor unpickles.
    Unchanged for a URL, a file, or an ``hf-hub:`` model, which timm resolves itself."""
    if not cfg.hf_hub_id or cfg.source == "hf-hub" or cfg.file or cfg.state_dict is not None:
        return overlay
    repo, revision = hub.split_revision(cfg.hf_hub_id)
    path = hub.download(repo, cfg.hf_hub_filename or ("model.safetensors", "pytorch_model.bin"), revision)
    return {**(overlay or {}), "state_dict": _read_download(path).state_dict}


def register_presets() -> None:
    for name in PRESETS:
        register_model(_entrypoint(name))

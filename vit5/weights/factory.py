"""The model factories: :func:`create_model` (a preset, optionally with weights) and :func:`load_model`
(whatever a checkpoint holds, its architecture read from the checkpoint itself); every load is strict."""

from __future__ import annotations

import logging
import os
from pathlib import Path
from typing import Any

from vit5.model.config import ConfigError, ViT5Config
from vit5.model.footprint import DEFAULT_MAX_PARAMS, check_size
from vit5.model.presets import PRESETS, preset_config
from vit5.model.vit import ViT5
from vit5.weights import hub
from vit5.weights.checkpoint import (
    CONFIG_NAME,
    EMA_WEIGHTS_NAME,
    WEIGHTS_NAME,
    Checkpoint,
    Pretrained,
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
    """Build preset ``name`` (or a released name, as timm) with config ``overrides``; optionally load weights.

    ``pretrained``: ``True`` for the name's released weights, a released name (which also sets the image
    size unless ``img_size`` is given), ``"hf-hub:USER/REPO[@REVISION]"`` or a path (our directory, an
    official ``.pth``, a timm checkpoint). A new ``num_classes`` resets the head, a new ``img_size``
    resamples the APE; ``use_ema=``, ``source=``, ``revision=`` and ``cache_dir=`` are taken too. A model
    over ``max_params`` is refused before it is allocated; what was loaded is ``model.load_report``.
    """
    use_ema, source = overrides.pop("use_ema", False), overrides.pop("source", None)
    where = {"revision": overrides.pop("revision", None), "cache_dir": overrides.pop("cache_dir", None)}
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
        theirs, ours = preset_config(release.arch), preset_config(name, **overrides)
        shape = ("embed_dim", "depth", "num_heads")
        if any(getattr(theirs, k) != getattr(ours, k) for k in shape):
            raise CheckpointError(
                f"{release.name} holds a {release.arch} "
                f"({', '.join(f'{k} {getattr(theirs, k)}' for k in shape)}), "
                f"not {name}: create_model({release.arch!r}, pretrained=True)"
            )
    ckpt = _read_pretrained(pretrained, use_ema, source, max_params, **where)
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
    where = {"revision": overrides.pop("revision", None), "cache_dir": overrides.pop("cache_dir", None)}
    ckpt = _read_pretrained(path, use_ema, source, max_params, **where)
    if ckpt.config is None:
        cfg = config_from_checkpoint(ckpt.state_dict, ckpt.source, **overrides)
    else:
        cfg = _stored_config(ckpt, overrides)
    return _build_and_load(cfg, ckpt, "num_classes" in overrides, max_params, log_report)


def _read_pretrained(
    pretrained: str | os.PathLike,
    use_ema: bool,
    source: Source | None,
    max_params: float,
    revision: str | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> Checkpoint:
    """Read the weights ``pretrained`` names; a damaged download says which cached file to delete."""
    text = os.fspath(pretrained)
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
    try:
        ckpt = read_checkpoint(path, use_ema=use_ema, source=source, max_params=max_params)
    except CheckpointError as err:
        unreadable = path / (EMA_WEIGHTS_NAME if use_ema else WEIGHTS_NAME) if path.is_dir() else path
        advice = f"\n  {hub.cached_copy_advice(unreadable)}" if str(unreadable) in str(err) else ""
        raise CheckpointError(f"{text}: {err}{advice}") from err
    if not path.is_dir():  # a released file: say which; a directory keeps its path (config.json messages)
        ckpt.path = f"{text} ({path})"
    return ckpt


def _stored_config(ckpt: Checkpoint, overrides: dict[str, Any]) -> ViT5Config:
    """The architecture of a directory's ``config.json`` (validated when read), with ``overrides``."""
    try:
        return ckpt.config.replace(**overrides)  # type: ignore[union-attr]
    except ConfigError as err:
        raise ConfigError(f"{Path(ckpt.path) / CONFIG_NAME} with overrides {overrides}: {err}") from err


def _family(cfg: ViT5Config) -> tuple:
    return (*(getattr(cfg, f) for f in _FAMILY_FIELDS), cfg.layer_scale is None)


def _check_named_preset(name: str, cfg: ViT5Config, pretrained: Any, overrides: dict[str, Any]) -> None:
    """The directory's config wins (depth, registers, ...), but naming another width or family than the one
    it holds is an error: ``deit3_tiny`` on a ``vit5_tiny`` directory would silently give a ViT-5."""
    named = preset_config(name, **overrides)
    if named.embed_dim != cfg.embed_dim:
        raise CheckpointError(
            f"{pretrained} holds a model of width {cfg.embed_dim}, not {name} (width {named.embed_dim}): "
            "name the preset it was trained as, or use vit5.load_model(path), which reads the architecture"
        )
    if _family(named) == _family(cfg):
        return
    matching = []
    for other in PRESETS:
        try:
            if _family(preset_config(other, **overrides)) == _family(cfg):
                matching.append(other)
        except ConfigError:
            continue
    if matching:
        differ = [
            f"{f}={getattr(cfg, f)!r} (not {getattr(named, f)!r})"
            for f in _FAMILY_FIELDS
            if getattr(cfg, f) != getattr(named, f)
        ]
        raise CheckpointError(
            f"{pretrained} holds a {matching[0]}, not a {name}: {', '.join(differ)}. Name the preset it was "
            f"trained as ({matching[0]}), or use vit5.load_model(path), which reads the architecture"
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

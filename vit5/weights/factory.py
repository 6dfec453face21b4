"""The model factories: :func:`create_model` (a preset, optionally with weights) and :func:`load_model`
(whatever a checkpoint holds, its architecture read from the checkpoint itself).

Weights are named by a path, by a released name (``vit5_small_patch16_224.in1k``, see
:mod:`vit5.weights.hub`) or by ``hf-hub:USER/REPO[@REVISION]``; the last two download through
huggingface_hub. Every load is strict (:func:`vit5.weights.checkpoint.load_weights`).
"""

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
from vit5.weights.convert import (
    CheckpointError,
    Source,
    config_from_checkpoint,
)

logger = logging.getLogger("vit5")


# ---------------------------------------------------------------------------------- factories
def create_model(
    name: str,
    pretrained: Pretrained = None,
    *,
    max_params: float = DEFAULT_MAX_PARAMS,
    log_report: bool = True,
    **overrides: Any,
) -> ViT5:
    """Build preset ``name`` with config ``overrides``; optionally load weights.

    ``pretrained``: ``True`` for the released weights of the name (``vit5_small`` -> its 224
    weights, ``vit5_base_patch16_384`` -> its 384 ones), a released name
    (``"vit5_base_patch16_384.in1k"``, which also sets the image size unless ``img_size`` is
    given), ``"hf-hub:USER/REPO[@REVISION]"``, or a path (our directory, an official ViT-5 ``.pth``
    or a timm checkpoint). ``name`` may itself be a released name (``"vit5_small_patch16_224.in1k"``).
    Downloads use the Hugging Face cache; ``revision=`` pins one, ``cache_dir=`` moves the cache.

    When ``num_classes`` is overridden and differs from the checkpoint's head, the head is reset
    (fine-tuning); the APE is resampled when ``img_size`` differs. Everything else loads strictly.
    Pass ``use_ema=True`` to take the EMA weights and ``source=`` to force a checkpoint format.
    A model of more than ``max_params`` parameters is refused before it is allocated. What was
    loaded is ``model.load_report``; ``log_report=False`` leaves printing it to the caller.
    """
    use_ema = overrides.pop("use_ema", False)
    source = overrides.pop("source", None)
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
        _check_release_fits(release, name, overrides)
    ckpt = _read_pretrained(pretrained, use_ema, source, max_params, **where)
    if ckpt.config is not None:  # our directory format knows its own architecture
        cfg = _stored_config(ckpt, overrides)
        _check_named_preset(name, cfg, pretrained, overrides)
    else:
        cfg = preset_config(name, **overrides)
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
    """Load any supported checkpoint without naming a preset: the architecture comes from
    ``config.json`` (our format) or is inferred from the tensor shapes (official / timm). A model of
    more than ``max_params`` parameters is refused before it is allocated.

    ``path`` may also be ``"hf-hub:USER/REPO[@REVISION]"`` (a model pushed with
    :func:`push_to_hub`) or a released name (``"vit5_small_patch16_224.in1k"``); ``revision=`` and
    ``cache_dir=`` are passed to the download.
    """
    where = {"revision": overrides.pop("revision", None), "cache_dir": overrides.pop("cache_dir", None)}
    ckpt = _read_pretrained(path, use_ema, source, max_params, **where)
    if ckpt.config is not None:
        cfg = _stored_config(ckpt, overrides)
    else:
        cfg = config_from_checkpoint(ckpt.state_dict, ckpt.source, **overrides)
    return _build_and_load(cfg, ckpt, "num_classes" in overrides, max_params, log_report)


def _read_pretrained(
    pretrained: str | os.PathLike,
    use_ema: bool,
    source: Source | None,
    max_params: float = DEFAULT_MAX_PARAMS,
    revision: str | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> Checkpoint:
    """Read the weights ``pretrained`` names: ``hf-hub:REPO``, a released name or a path."""
    text = os.fspath(pretrained)
    if text.startswith(hub.HF_HUB_PREFIX):
        repo = text[len(hub.HF_HUB_PREFIX) :]
        if revision is not None:
            repo = f"{hub.split_revision(repo)[0]}@{revision}"
        directory = hub.download_model_dir(repo, EMA_WEIGHTS_NAME if use_ema else WEIGHTS_NAME, cache_dir)
        return _read_cached(directory, use_ema, source, max_params, label=text)
    if not Path(text).exists() and hub.is_weights_name(text):
        release = hub.release(text)
        path = hub.download(release.repo, release.filename, revision, cache_dir)
        return _read_cached(path, use_ema, source or "official", max_params, label=text)
    return read_checkpoint(text, use_ema=use_ema, source=source, max_params=max_params)


def _read_cached(
    path: Path, use_ema: bool, source: Source | None, max_params: float, label: str
) -> Checkpoint:
    """Read a downloaded checkpoint; a damaged cached copy says which files to delete."""
    try:
        ckpt = read_checkpoint(path, use_ema=use_ema, source=source, max_params=max_params)
    except CheckpointError as err:
        unreadable = path / (EMA_WEIGHTS_NAME if use_ema else WEIGHTS_NAME) if path.is_dir() else path
        advice = f"\n  {hub.cached_copy_advice(unreadable)}" if str(unreadable) in str(err) else ""
        raise CheckpointError(f"{label}: {err}{advice}") from err
    if not path.is_dir():  # a released file: say which; a directory keeps its path (config.json messages)
        ckpt.path = f"{label} ({path})"
    return ckpt


def _check_release_fits(release: hub.Release, name: str, overrides: dict[str, Any]) -> None:
    """Released weights fit a preset of their own size only: say which one to name instead."""
    theirs = preset_config(release.arch)
    ours = preset_config(name, **overrides)
    shape = ("embed_dim", "depth", "num_heads")
    if any(getattr(theirs, k) != getattr(ours, k) for k in shape):
        raise CheckpointError(
            f"{release.name} holds a {release.arch} "
            f"({', '.join(f'{k} {getattr(theirs, k)}' for k in shape)}), "
            f"not {name}: create_model({release.arch!r}, pretrained=True)"
        )


def _stored_config(ckpt: Checkpoint, overrides: dict[str, Any]) -> ViT5Config:
    """The architecture recorded in a directory's ``config.json``, with ``overrides``; any malformed
    value (a list, a wrong type, NaN, a negative size) is a ConfigError naming the file. That it
    describes these very weights was checked from the weights file's header, before reading them
    (:func:`vit5.weights.checkpoint.read_checkpoint`)."""
    config_file = Path(ckpt.path) / CONFIG_NAME
    try:
        stored = ViT5Config.from_dict(ckpt.config)  # type: ignore[arg-type]
    except ConfigError as err:
        raise ConfigError(f"{config_file}: {err}") from err
    try:
        return stored.replace(**overrides)
    except ConfigError as err:
        raise ConfigError(f"{config_file} with overrides {overrides}: {err}") from err


_FAMILY_FIELDS = ("embed_dim", "norm", "qkv_bias", "qk_norm", "rope", "num_registers")


def _family(cfg: ViT5Config) -> tuple:
    return (*(getattr(cfg, f) for f in _FAMILY_FIELDS), cfg.layer_scale is None)


def _check_named_preset(name: str, cfg: ViT5Config, pretrained: Any, overrides: dict[str, Any]) -> None:
    """The directory's config wins (its depth, registers, ...), but naming another family or width
    than the one it holds is an error: ``deit3_tiny`` on a ``vit5_tiny`` directory would otherwise
    silently give a ViT-5."""
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
    cfg: ViT5Config, ckpt: Checkpoint, ignore_head: bool, max_params: float, log_report: bool = True
) -> ViT5:
    check_size(cfg, max_params, source=ckpt.path)
    model = ViT5(cfg)
    report = load_weights(model, ckpt, ignore_head=ignore_head)
    model.load_report = report
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

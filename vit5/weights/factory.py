"""The model factories, every load strict: :func:`create_model` (a preset, optionally with weights),
:func:`load_model` (the architecture read from the checkpoint), and every preset as a timm model.

``timm.create_model("vit5_small")`` goes through ``build_model_with_cfg``, its weights through
vit5's download and reader; ``features_only=True`` gives timm's ``FeatureGetterNet`` (default: the
last 3 blocks). Importing this module registers every preset in timm (at its end, once): importing
``vit5.weights`` or using any public name of ``vit5`` does it.
"""

from __future__ import annotations

import logging
import os
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from huggingface_hub.errors import EntryNotFoundError, HfHubHTTPError
from timm.models import (
    build_model_with_cfg,
    generate_default_cfgs,
    get_arch_pretrained_cfgs,
    is_model,
    model_entrypoint,
    register_model,
)
from timm.models._builder import resolve_pretrained_cfg

from vit5.model.config import ConfigError, ViT5Config
from vit5.model.footprint import DEFAULT_MAX_PARAMS, check_size
from vit5.model.presets import PRESETS, preset_config
from vit5.model.vit import ViT5, default_pretrained_cfg
from vit5.weights import catalog
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
from vit5.weights.convert import (
    CheckpointError,
    OverrideMismatchError,
    Source,
    config_from_checkpoint,
)

logger = logging.getLogger("vit5")
_FAMILY_FIELDS = ("embed_dim", "norm", "qkv_bias", "qk_norm", "rope", "num_registers")
_SIZE_FIELDS = ("embed_dim", "depth", "num_heads")
# the config fields that decide the weights' shapes; img_size and patch_size are resampled,
# num_classes is a new head
_SHAPE_FIELDS = (
    "in_chans",
    "embed_dim",
    "depth",
    "num_heads",
    "num_kv_heads",
    "mlp",
    "mlp_ratio",
    "mlp_bias",
    "swiglu_multiple_of",
    "norm",
    "qkv_bias",
    "qk_norm",
    "class_token",
    "num_registers",
    "ape",
    "layer_scale",
    "rope",
    "register_rope",
)


@dataclass(frozen=True)
class _ReadOptions:
    """How to read weights: which copy, which format, which Hub revision and cache, how large."""

    use_ema: bool = False
    source: Source | None = None
    revision: str | None = None
    cache_dir: catalog.CacheDir = None
    max_params: float = DEFAULT_MAX_PARAMS


def create_model(
    name: str,
    pretrained: Pretrained = None,
    *,
    max_params: float = DEFAULT_MAX_PARAMS,
    log_report: bool = True,
    **overrides: Any,
) -> ViT5:
    """Build preset ``name`` (or a released name, as timm) with config ``overrides``.

    ``pretrained``: ``True`` (the name's release), a released name (its image size too),
    ``"hf-hub:USER/REPO[@REVISION]"`` or a path (our directory, an official ``.pth``, a timm
    checkpoint). A new ``num_classes`` resets the head, a new ``img_size`` resamples the APE, a new
    ``patch_size`` the patch embedding; ``use_ema=``, ``source=``, ``revision=``, ``cache_dir=``
    are taken too. Over ``max_params``: refused before allocation. What was loaded:
    ``model.load_report``.
    """
    options = _ReadOptions(
        use_ema=overrides.pop("use_ema", False),
        source=overrides.pop("source", None),
        revision=overrides.pop("revision", None),
        cache_dir=overrides.pop("cache_dir", None),
        max_params=max_params,
    )
    # as timm: "ARCH.TAG" builds ARCH; pretrained=True loads TAG's weights
    if catalog.is_weights_name(name):
        if pretrained is True:
            pretrained = name
        name = name.partition(".")[0]
    if pretrained is None or pretrained is False:
        cfg = preset_config(name, **overrides)
        check_size(cfg, max_params)
        return ViT5(cfg)
    if pretrained is True:
        pretrained = _default_weights(name)
    if _is_release(pretrained):
        release = catalog.release(pretrained)  # checked before any download
        overrides.setdefault("img_size", release.img_size)
        _check_release_fits(release, name, overrides)
    ckpt = _read_pretrained(pretrained, options)
    if ckpt.config is None:
        cfg = preset_config(name, **overrides)
    else:  # our directory format knows its own architecture
        cfg = _stored_config(ckpt, overrides)
        _check_named_preset(name, cfg, pretrained, overrides)
    return _build_and_load(cfg, ckpt, overrides, max_params, log_report)


def _default_weights(name: str) -> str:
    """The released weights ``pretrained=True`` means for preset ``name``."""
    release = catalog.default_release(name)
    if release is None:
        raise CheckpointError(
            f"{name} has no released weights (released: {catalog.RELEASED_NAMES}): "
            "pass pretrained=PATH to load your own, or leave pretrained unset for random weights"
        )
    return release.name


def _is_release(pretrained: Pretrained) -> bool:
    """Whether ``pretrained`` names released weights rather than a file."""
    if not isinstance(pretrained, str):
        return False
    return catalog.is_weights_name(pretrained) and not Path(pretrained).exists()


def _sizes(cfg: ViT5Config) -> str:
    return ", ".join(f"{k} {getattr(cfg, k)}" for k in _SIZE_FIELDS)


def _check_release_fits(release: catalog.Release, name: str, overrides: dict[str, Any]) -> None:
    """Before any download: preset ``name`` with ``overrides`` has the width, depth and heads of
    ``release``; when only the overrides differ, the error names them."""
    held = preset_config(release.arch)
    asked = preset_config(name, **overrides)
    if _sizes(held) == _sizes(asked):
        return
    if _sizes(held) == _sizes(preset_config(name)):
        settings = _differing(overrides, asked, held, _SIZE_FIELDS)
        raise _override_error(release.name, settings)
    raise CheckpointError(
        f"{release.name} holds a {release.arch} ({_sizes(held)}), not {name}: "
        f"create_model({release.arch!r}, pretrained=True)"
    )


def _differing(
    overrides: dict[str, Any],
    asked: ViT5Config,
    held: ViT5Config,
    fields: tuple[str, ...],
) -> dict[str, tuple[Any, Any]]:
    """The overrides among ``fields`` whose value differs from what the weights hold."""
    settings = {}
    for key in overrides:
        if key not in fields:
            continue
        mine = getattr(asked, key)
        theirs = getattr(held, key)
        if key == "layer_scale":  # its shape is only on or off
            mine = mine is not None
            theirs = theirs is not None
        if mine != theirs:
            settings[key] = (getattr(asked, key), getattr(held, key))
    return settings


def _override_error(
    what: str, settings: dict[str, tuple[Any, Any]], details: str = ""
) -> OverrideMismatchError:
    """One error that names the overrides the weights cannot take and the values that fit."""
    asked = ", ".join(f"{k}={mine!r}" for k, (mine, _) in settings.items())
    fits = ", ".join(f"{k}={theirs!r}" for k, (_, theirs) in settings.items())
    message = (
        f"{what} cannot be loaded into a model built with {asked}: the weights hold {fits}. "
        f"Drop the override, or set {fits} (patch_size and img_size may differ: "
        "they are resampled)"
    )
    if details:
        message += f"\n{details}"
    return OverrideMismatchError(message, settings)


def load_model(
    path: Pretrained,
    source: Source | None = None,
    use_ema: bool = False,
    *,
    max_params: float = DEFAULT_MAX_PARAMS,
    log_report: bool = True,
    **overrides: Any,
) -> ViT5:
    """Load any supported checkpoint (a path, ``hf-hub:USER/REPO[@REVISION]`` or a released name)
    without naming a preset: the architecture comes from ``config.json`` (our format) or the tensor
    shapes (official / timm); ``revision=`` and ``cache_dir=`` go to the download."""
    options = _ReadOptions(
        use_ema=use_ema,
        source=source,
        revision=overrides.pop("revision", None),
        cache_dir=overrides.pop("cache_dir", None),
        max_params=max_params,
    )
    ckpt = _read_pretrained(path, options)
    if ckpt.config is None:
        cfg = config_from_checkpoint(ckpt.state_dict, ckpt.source, **overrides)
    else:
        cfg = _stored_config(ckpt, overrides)
    return _build_and_load(cfg, ckpt, overrides, max_params, log_report)


def _read_pretrained(pretrained: str | os.PathLike, options: _ReadOptions) -> Checkpoint:
    """Read the weights ``pretrained`` names: a Hub repo, released weights or a local path."""
    text = os.fspath(pretrained)
    source = options.source
    if text.startswith(catalog.HF_HUB_PREFIX):
        path = _download_folder(text, options)
    elif _is_release(text):
        release = catalog.release(text)
        path = catalog.download(release.repo, release.filename, options.revision, options.cache_dir)
        source = source or "official"
    else:
        return read_checkpoint(
            text,
            use_ema=options.use_ema,
            source=source,
            max_params=options.max_params,
        )
    ckpt = _read_download(
        path, f"{text}: ", use_ema=options.use_ema, source=source, max_params=options.max_params
    )
    # a released file: say which; a directory keeps its path (config.json messages)
    if not path.is_dir():
        ckpt.path = f"{text} ({path})"
    return ckpt


def _download_folder(spec: str, options: _ReadOptions) -> Path:
    """The cached folder of ``hf-hub:USER/REPO[@REVISION]``: its config and weights of one
    commit."""
    repo_id, pinned = catalog.split_revision(spec.removeprefix(catalog.HF_HUB_PREFIX))
    revision = options.revision or pinned
    config = catalog.download(repo_id, CONFIG_NAME, revision, options.cache_dir)
    weights = EMA_WEIGHTS_NAME if options.use_ema else WEIGHTS_NAME
    # of the same commit: the config's snapshot folder names it
    commit = config.parent.name
    return catalog.download(repo_id, weights, commit, options.cache_dir).parent


def _stored_config(ckpt: Checkpoint, overrides: dict[str, Any]) -> ViT5Config:
    """The architecture of a directory's ``config.json`` (validated when read), with
    ``overrides``."""
    try:
        return ckpt.config.replace(**overrides)  # type: ignore[union-attr]
    except ConfigError as err:
        where = Path(ckpt.path) / CONFIG_NAME
        raise ConfigError(f"{where} with overrides {overrides}: {err}") from err


def _family(cfg: ViT5Config) -> dict[str, Any]:
    family = {f: getattr(cfg, f) for f in _FAMILY_FIELDS}
    family["layer_scale"] = cfg.layer_scale is not None
    return family


def _check_named_preset(
    name: str,
    cfg: ViT5Config,
    pretrained: Any,
    overrides: dict[str, Any],
) -> None:
    """The directory's config wins (depth, registers, ...), but naming another width or family than
    the one it holds is an error: ``deit3_tiny`` on a ``vit5_tiny`` directory would silently give
    a ViT-5."""
    named = _family(preset_config(name, **overrides))
    held = _family(cfg)
    fix = "or use vit5.load_model(path), which reads the architecture"
    if named["embed_dim"] != held["embed_dim"]:
        raise CheckpointError(
            f"{pretrained} holds a model of width {cfg.embed_dim}, "
            f"not {name} (width {named['embed_dim']}): name the preset it was trained as, {fix}"
        )
    if named == held:
        return
    # a family no preset has (an ablation) loads as named
    for other in PRESETS:
        with suppress(ConfigError):  # overrides that preset cannot take
            if _family(preset_config(other, **overrides)) != held:
                continue
            changed = [k for k, v in held.items() if v != named[k]]
            differ = ", ".join(f"{k}={held[k]!r} (not {named[k]!r})" for k in changed)
            raise CheckpointError(
                f"{pretrained} holds a {other}, not a {name}: {differ}. "
                f"Name the preset it was trained as ({other}), {fix}"
            )


def _build_and_load(
    cfg: ViT5Config,
    ckpt: Checkpoint,
    overrides: dict[str, Any],
    max_params: float,
    log_report: bool,
) -> ViT5:
    """Build ``cfg`` and load ``ckpt`` into it; a new ``num_classes`` override starts a new
    head."""
    check_size(cfg, max_params, source=ckpt.path)
    model = ViT5(cfg)
    try:
        report = load_weights(model, ckpt, ignore_head="num_classes" in overrides)
    except CheckpointError as err:
        settings = _overrides_at_fault(ckpt, cfg, overrides)
        if not settings:
            raise
        raise _override_error(ckpt.path, settings, str(err)) from err
    model.load_report = report
    # a new head has no names yet
    if ckpt.class_names is not None and not report.reset:
        if len(ckpt.class_names) != model.num_classes:
            raise CheckpointError(
                f"{ckpt.path}/{CONFIG_NAME} names {len(ckpt.class_names)} classes "
                f"(label_names) but the model has {model.num_classes} outputs: "
                "the file was edited or belongs to another model"
            )
        model.pretrained_cfg["label_names"] = list(ckpt.class_names)
    if log_report:
        changed = report.reset or report.resampled
        logger.log(logging.WARNING if changed else logging.INFO, str(report))
    return model


def _overrides_at_fault(
    ckpt: Checkpoint, cfg: ViT5Config, overrides: dict[str, Any]
) -> dict[str, tuple[Any, Any]]:
    """The overrides that gave the model shapes other than the checkpoint's: compared with its
    stored config, or the one its shapes imply (empty when that cannot be read)."""
    held = ckpt.config
    if held is None:
        with suppress(CheckpointError):
            held = config_from_checkpoint(ckpt.state_dict, ckpt.source)
    if held is None:
        return {}
    return _differing(overrides, cfg, held, _SHAPE_FIELDS)


# read by timm's register_model (same module): where each release lives and how its authors
# evaluated it
_RELEASE_CFGS = {
    r.name: dict(
        default_pretrained_cfg(r.img_size),
        hf_hub_id=r.repo,
        hf_hub_filename=r.filename,
        paper_ids=catalog.PAPER_ID,
        paper_name=catalog.PAPER_NAME,
        origin_url="https://github.com/wangf3014/ViT-5",
    )
    for r in catalog.RELEASES.values()
}
_RELEASED_ARCHS = {r.arch for r in catalog.RELEASES.values()}
_PRESET_CFGS = {
    name: default_pretrained_cfg(values.get("img_size", 224))
    for name, values in PRESETS.items()
    if name not in _RELEASED_ARCHS
}
default_cfgs = generate_default_cfgs(_RELEASE_CFGS | _PRESET_CFGS)


def _entrypoint(name: str) -> Callable[..., Any]:
    """The timm entry point of preset ``name``: ``timm.create_model(name, ...)`` calls it."""

    def build(pretrained: bool = False, **kwargs: Any):
        _check_timm_arguments(name, pretrained, kwargs)
        variant = name
        release = catalog.default_release(name)
        tag = kwargs.get("pretrained_cfg")
        if pretrained and tag is None and release is not None and release.arch != name:
            # a size name means its weights
            variant = release.arch
            kwargs["pretrained_cfg"] = release.name.partition(".")[2]
        feature_cfg = {"feature_cls": "getter", "out_indices": 3}
        feature_cfg.update(kwargs.pop("feature_cfg", {}))
        for key in ("out_indices", "feature_cls"):
            if key in kwargs:
                feature_cfg[key] = kwargs.pop(key)
        overlay = kwargs.get("pretrained_cfg_overlay")
        cfg = resolve_pretrained_cfg(variant, kwargs.get("pretrained_cfg"), overlay)
        if pretrained:
            kwargs["pretrained_cfg_overlay"] = pretrained_overlay(cfg, overlay)
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
            _explain_timm_failure(err, cfg, pretrained)
            raise
        # a features_only wrapper holds the model
        vit = model.model if hasattr(model, "model") else model
        # as built (img_size=)
        model.pretrained_cfg["input_size"] = (vit.cfg.in_chans, *vit.cfg.img_size)
        return model

    build.__name__ = name
    build.__qualname__ = name
    build.__module__ = __name__
    build.__doc__ = f"vit5 preset {name!r}: {PRESETS[name]}"
    return build


def _check_timm_arguments(name: str, pretrained: Any, kwargs: dict[str, Any]) -> None:
    """Refuse what ``timm.create_model`` may pass that a vit5 preset cannot take; pops
    ``dynamic_img_size`` (vit5 models always take any patch-multiple size)."""
    if not isinstance(pretrained, bool):
        raise CheckpointError(
            f"timm.create_model takes pretrained=True/False, got {pretrained!r}: "
            "for a local file use pretrained_cfg_overlay=dict(file=PATH), "
            f"or vit5.create_model({name!r}, pretrained=PATH)"
        )
    tag = kwargs.get("pretrained_cfg")
    if isinstance(tag, str) and f"{name}.{tag}" not in get_arch_pretrained_cfgs(name):
        raise CheckpointError(
            f"unknown pretrained tag {tag!r} for {name}: "
            f"the released ViT-5 weights are {catalog.RELEASED_NAMES}"
        )
    if not kwargs.pop("dynamic_img_size", True):
        sizes = "any input size whose sides are patch multiples"
        raise ConfigError(f"{name} takes {sizes}: drop dynamic_img_size=False")


def _explain_timm_failure(err: Exception, cfg: Any, pretrained: bool) -> None:
    """Raise a Hub failure inside timm's builder as one error with the fix; an unreadable cached
    download as the reader's error, with the files to delete. Else return (the caller
    re-raises)."""
    repo, revision = catalog.split_revision(cfg.hf_hub_id or "")
    filename = cfg.hf_hub_filename or "pytorch_model.bin"
    if isinstance(err, (EntryNotFoundError, HfHubHTTPError)):
        with catalog.clear_hub_errors(repo, filename, revision):
            raise err
    if pretrained and repo:
        path = catalog.cached_path(repo, filename, revision)
        if path is not None:
            _read_download(path)


def _read_download(path: Path, label: str = "", use_ema: bool = False, **kwargs: Any) -> Checkpoint:
    """:func:`read_checkpoint` of a cached download; an unreadable one says which files to
    delete."""
    try:
        return read_checkpoint(path, use_ema=use_ema, **kwargs)
    except CheckpointError as err:
        if path.is_dir():
            bad = path / (EMA_WEIGHTS_NAME if use_ema else WEIGHTS_NAME)
        else:
            bad = path
        if str(bad) not in str(err):
            raise CheckpointError(f"{label}{err}") from err
        # a cache's snapshot entries link to its blobs
        blob = Path(os.path.realpath(bad))
        files = f"{bad}"
        if blob != bad:
            files += f" and the blob it points to, {blob}"
        raise CheckpointError(
            f"{label}{err}\n  {bad} is a cached download from the Hugging Face Hub; "
            "if it is damaged (an interrupted or altered download), "
            f"delete {files}, then load again to fetch a fresh copy"
        ) from err


def pretrained_overlay(cfg: Any, overlay: dict[str, Any] | None = None) -> dict[str, Any] | None:
    """timm's ``pretrained_cfg_overlay`` with the Hub weights timm's ``cfg`` names already
    downloaded (cache first) and read (sizes checked, no pickled code): timm neither retries the
    network nor unpickles. Unchanged for a URL, a file, or an ``hf-hub:`` model, which timm
    resolves itself."""
    own_source = cfg.source == "hf-hub" or cfg.file or cfg.state_dict is not None
    if not cfg.hf_hub_id or own_source:
        return overlay
    repo, revision = catalog.split_revision(cfg.hf_hub_id)
    filenames = cfg.hf_hub_filename or ("model.safetensors", "pytorch_model.bin")
    path = catalog.download(repo, filenames, revision)
    state_dict = _read_download(path).state_dict
    return {**(overlay or {}), "state_dict": state_dict}


def register_presets() -> None:
    """Register every preset in timm (``timm.create_model("vit5_small")``); a name this module
    registered already is left as it is, so a second call changes nothing."""
    for name in PRESETS:
        if is_model(name) and model_entrypoint(name).__module__ == __name__:
            continue
        register_model(_entrypoint(name))


register_presets()  # importing the factory is what puts the presets in timm's registry

"""Read a :class:`~vit5.train.config.TrainConfig` from YAML plus dotted ``key=value`` overrides.

A key that is not a setting is named with the closest valid key and the file or argument it came
from; a value of the wrong type names the expected type; ``???`` in a recipe marks a setting the
user must give. The merged config then goes through :func:`~vit5.train.config_checks.validate_config`.
"""

from __future__ import annotations

import dataclasses
import difflib
import importlib.resources
import os
import typing
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from omegaconf import DictConfig, OmegaConf
from omegaconf.errors import OmegaConfBaseException

from vit5.train.config import TrainConfig
from vit5.train.config_checks import validate_config
from vit5.train.errors import TrainConfigError

_FREE_FORM = {"model.overrides"}  # dict sections whose keys are checked by ViT5Config instead
DEMO_RECIPE = "demo_digits"  # what `vit5 train` runs with no --config


def recipes() -> dict[str, Path]:
    """The recipes that ship inside the package (``vit5/configs/*.yaml``, also ``configs/`` in the
    repository), by name: ``{"vit5_small_in1k": Path(...), ...}``."""
    folder = Path(str(importlib.resources.files("vit5").joinpath("configs")))
    return {p.stem: p for p in sorted(folder.glob("*.yaml"))}


def recipe_path(recipe: str | os.PathLike[str]) -> Path:
    """A recipe by name (``vit5_small_in1k``, with or without ``.yaml``) or by path.

    An existing file wins; otherwise a bare name is looked up among the packaged :func:`recipes`.

    Raises:
        TrainConfigError: neither a file nor a packaged recipe, naming the packaged ones.
    """
    path = Path(recipe).expanduser()
    if path.is_file():
        return path
    packaged = recipes()
    name = path.name.removesuffix(".yaml")
    if path.parent == Path(".") and name in packaged:
        return packaged[name]
    hint = f"; packaged recipes (give one by name): {', '.join(packaged)}" if packaged else ""
    if path.parent != Path(".") and path.parent.is_dir():
        nearby = sorted(p.name for p in path.parent.glob("*.yaml"))
        hint = f". Configs in {path.parent}: {nearby}" if nearby else hint
    raise TrainConfigError(f"config file {path} does not exist{hint}")


def load_config(
    path: str | os.PathLike[str] | None = None,
    overrides: Sequence[str] = (),
    *,
    check_paths: bool = True,
) -> TrainConfig:
    """Defaults <- YAML file ``path`` <- ``overrides`` (``"optim.lr=1e-3"``), then validate.

    Args:
        path: a YAML file, or the name of a packaged recipe (:func:`recipe_path`).
        check_paths: also check that ``data.root`` / ``model.pretrained`` exist (off to inspect
            a recipe on a machine without the data).

    Raises:
        TrainConfigError: listing every problem found.
    """
    merged = OmegaConf.structured(TrainConfig)
    required: set[str] = set()  # `???` in the file: the user must give these on the command line
    if path is not None:
        path = recipe_path(path)
        loaded = _read_yaml(path)
        required = set(OmegaConf.missing_keys(loaded))
        merged = _merge(merged, loaded, where=str(path))
    for item in overrides:
        merged = _merge(merged, _parse_override(item), where=f"command line '{item}'")
        required.discard(item.partition("=")[0].strip())
    if required:
        example = " ".join(f"{k}=..." for k in sorted(required))
        raise TrainConfigError(
            f"{path}: required setting(s) {', '.join(sorted(required))} not given; add {example}"
        )
    cfg = typing.cast(TrainConfig, OmegaConf.to_object(merged))
    validate_config(cfg, check_paths=check_paths)
    return cfg


def config_from_dict(values: Mapping[str, Any], where: str) -> TrainConfig:
    """A config from its ``dataclasses.asdict`` form (as recorded in a checkpoint), validated
    without checking paths.

    Raises:
        TrainConfigError: naming ``where`` the values came from.
    """
    if not isinstance(values, Mapping):
        raise TrainConfigError(f"{where}: expected a mapping of sections")
    merged = _merge(OmegaConf.structured(TrainConfig), OmegaConf.create(dict(values)), where=where)
    cfg = typing.cast(TrainConfig, OmegaConf.to_object(merged))
    validate_config(cfg, check_paths=False)
    return cfg


def config_to_yaml(cfg: TrainConfig) -> str:
    """The full config (every setting, defaults included) as YAML, loadable by :func:`load_config`."""
    return OmegaConf.to_yaml(OmegaConf.structured(cfg))


def config_diff(old: TrainConfig, new: TrainConfig) -> list[str]:
    """``"section.key: old -> new"`` for every setting that differs."""
    flat_old, flat_new = _flatten(dataclasses.asdict(old)), _flatten(dataclasses.asdict(new))
    return [
        f"{k}: {flat_old.get(k)!r} -> {flat_new.get(k)!r}"
        for k in sorted(flat_new)
        if flat_old.get(k) != flat_new[k]
    ]


# ---------------------------------------------------------------------------------- reading
def _read_yaml(path: Path) -> DictConfig:
    try:
        loaded = OmegaConf.load(path)
    except Exception as e:  # yaml.YAMLError and friends; keep the parser's line/column message
        raise TrainConfigError(f"{path} is not valid YAML: {e}") from e
    if not isinstance(loaded, DictConfig):
        raise TrainConfigError(f"{path} must hold a mapping of sections (model:, data:, ...), not a list")
    return loaded


def _parse_override(item: str) -> DictConfig:
    key, sep, _ = item.partition("=")
    if not sep or not key.strip():
        raise TrainConfigError(
            f"command-line argument {item!r} is not a key=value override; write e.g. optim.lr=1e-3 "
            f"or data.root=/path/to/imagenet"
        )
    if key.startswith("-"):
        raise TrainConfigError(f"unknown option {key!r}; options are --config FILE and --resume [DIR]")
    try:
        return OmegaConf.from_dotlist([item])
    except OmegaConfBaseException as e:
        raise TrainConfigError(f"cannot parse override {item!r}: {e}") from e


def _merge(base: DictConfig, update: DictConfig, where: str) -> DictConfig:
    _check_keys(OmegaConf.to_container(update), TrainConfig, prefix="", where=where)
    try:
        return typing.cast(DictConfig, OmegaConf.merge(base, update))
    except OmegaConfBaseException as e:
        key = getattr(e, "full_key", None)
        reason = str(getattr(e, "msg", None) or e).splitlines()[0]
        if not key:
            raise TrainConfigError(f"{where}: bad value: {reason}") from e
        raise TrainConfigError(
            f"{where}: bad value for {key}: {reason} (expected {_expected_type(key)})"
        ) from e


def _check_keys(node: Any, schema: type, prefix: str, where: str) -> None:
    if not isinstance(node, Mapping):
        if prefix:
            raise TrainConfigError(
                f"{where}: {prefix.rstrip('.')} is a section; give it keys, e.g. {prefix}KEY=VALUE"
            )
        raise TrainConfigError(f"{where}: expected a mapping of sections")
    fields = {f.name: f for f in dataclasses.fields(schema)}
    hints = typing.get_type_hints(schema)
    for key, value in node.items():
        full = f"{prefix}{key}"
        if key not in fields:
            raise TrainConfigError(f"{where}: {full} is not a setting. {_suggest(str(key), fields, prefix)}")
        if dataclasses.is_dataclass(hints[key]) and full not in _FREE_FORM:
            _check_keys(value, typing.cast(type, hints[key]), prefix=f"{full}.", where=where)


def _suggest(key: str, choices: Iterable[str], prefix: str) -> str:
    choices = sorted(choices)
    close = difflib.get_close_matches(key, choices, n=1, cutoff=0.5)
    hint = f"Did you mean {prefix}{close[0]}? " if close else ""
    section = prefix.rstrip(".") or "the top level"
    return f"{hint}Valid keys in {section}: {', '.join(choices)}."


def _expected_type(full_key: str) -> str:
    schema: Any = TrainConfig
    hint: Any = None
    for part in full_key.split("."):
        if not dataclasses.is_dataclass(schema):
            break
        hint = typing.get_type_hints(schema).get(part)
        schema = hint
    if hint is None:
        return "see vit5/train/config.py"
    return hint.__name__ if isinstance(hint, type) else str(hint).replace("typing.", "")


def _flatten(tree: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    flat: dict[str, Any] = {}
    for key, value in tree.items():
        if isinstance(value, Mapping) and f"{prefix}{key}" not in _FREE_FORM:
            flat.update(_flatten(value, f"{prefix}{key}."))
        else:
            flat[f"{prefix}{key}"] = value
    return flat

"""Files read as types: a document loaded from JSON (or from a ``weights_only`` torch file) checked
against a type annotation, so each file format is one typed schema (a dataclass or a TypedDict) and
a crafted or damaged file is one error naming the field that breaks it, not a traceback from the
code that would have used it. :func:`vit5.files.read_json` reads a JSON file through it; the
training checkpoints (``vit5.train.checkpointing``) and the register neurons of ``vit5 viz ttr``
(``vit5.eval.registers.NeuronsFile``) are its schemas.

torch is imported by the callers, never here: a schema that names ``torch.Tensor`` exists only
where torch is imported already."""

from __future__ import annotations

import dataclasses
import functools
import math
import re
import sys
from types import UnionType
from typing import (
    Annotated,
    Any,
    Literal,
    Required,
    get_args,
    get_origin,
    get_type_hints,
    is_typeddict,
)

from vit5.errors import shorten


def check(ok: bool, where: str, value: Any, must: str) -> None:
    """``ValueError("where=value must be must")`` unless ``ok``: the one message of a refused field
    (also for the rules a schema's ``__post_init__`` adds across fields)."""
    if not ok:
        raise ValueError(f"{where}={shown(value)} must be {must}")


def shown(value: Any) -> str:
    """``value`` on one line: a tensor by dtype, shape and range, anything else by its repr."""
    tensor = _tensor_type()
    if tensor is None or not isinstance(value, tensor):
        return re.sub(r"\s*\n\s*", " ", shorten(value))  # a tensor in a list: still one line
    span = (
        "" if value.is_complex() or not value.numel() else f", values {value.min()}..{value.max()}"
    )
    return f"a {value.dtype} tensor of shape {tuple(value.shape)}{span}"


def parse(schema: Any, value: Any, where: str = "", null: str = "") -> Any:
    """``value`` (read from JSON or a ``weights_only`` torch file) as ``schema``, a type annotation;
    ``ValueError`` naming the first field that breaks it. A dataclass or TypedDict: a dict with each
    field (a TypedDict's not ``Required`` ones may be absent) and no other, built with the checked
    fields (so a dataclass's ``__post_init__`` adds its rules across fields); ``X | None``;
    ``list[X]``; ``dict[str, X]``; ``Literal[...]``; ``bool``; ``str``; ``int``: at least 0;
    ``float``: any number. In ``Annotated[T, m]`` a number ``m`` is T's least value (a float's then
    also finite), a text ``m`` follows T's "must be"; ``Annotated[torch.Tensor, dtype, shape]``: a
    tensor of that dtype and shape (-1: any size)."""
    origin = get_origin(schema)
    args = get_args(schema)
    if schema is Any:
        return value
    if origin is Required:
        return parse(args[0], value, where)
    if origin is UnionType:  # X | None
        return None if value is None else parse(args[0], value, where, " or null")
    if dataclasses.is_dataclass(schema) or is_typeddict(schema):
        return _parse_record(schema, value, where)
    if origin is list:
        check(isinstance(value, list), where, value, "a list" + null)
        return [parse(args[0], item, f"{where}[{i}]") for i, item in enumerate(value)]
    if origin is dict:
        check(isinstance(value, dict), where, value, "a JSON object" + null)
        return {key: parse(args[1], item, f"{where}[{key!r}]") for key, item in value.items()}
    meta = args[1] if origin is Annotated else None
    kind = args[0] if origin is Annotated else schema
    least = meta if isinstance(meta, (int, float)) else (0 if kind is int else None)
    note = f", {meta}" if isinstance(meta, str) else ""
    number = isinstance(value, (int, float)) and not isinstance(value, bool)
    if kind is not None and kind is _tensor_type():
        ok = isinstance(value, kind) and value.dtype == meta and _shaped(value, args[2])
        must = f"a {meta} tensor of shape {args[2]}"
    elif get_origin(kind) is Literal:
        ok = any(type(value) is type(c) and value == c for c in get_args(kind))
        must = " or ".join(repr(choice) for choice in get_args(kind))
    elif kind is int:
        ok = number and isinstance(value, int) and value >= least
        must = f"an integer >= {least}"
    elif kind is float and least is not None:
        ok = number and math.isfinite(value) and value >= least
        must = f"a finite number >= {least}"
    else:
        ok = number if kind is float else isinstance(value, kind)
        must = {float: "a number", bool: "true or false", str: "a string"}[kind]
    check(ok, where, value, must + null + note)
    return value


def _tensor_type() -> type | None:
    """``torch.Tensor`` when torch is imported (only then can a value or a schema be one)."""
    torch = sys.modules.get("torch")
    return torch.Tensor if torch is not None else None


def _shaped(tensor: Any, shape: tuple[int, ...]) -> bool:
    sizes = tuple(tensor.shape)
    return len(sizes) == len(shape) and all(s in (-1, n) for s, n in zip(shape, sizes))


@functools.cache
def _hints(schema: Any) -> dict[str, Any]:
    return get_type_hints(schema, include_extras=True)


def _parse_record(schema: Any, value: Any, where: str) -> Any:
    """A dataclass or TypedDict ``schema`` from a dict, its fields checked in order."""
    said = where or "the file"
    check(isinstance(value, dict), said, value, "a dict of named fields")
    hints = _hints(schema)
    fields = {}
    for name, hint in hints.items():
        optional = is_typeddict(schema) and get_origin(hint) is not Required
        if name not in value and not optional:
            raise ValueError(f"{said} has no field {name!r}")
        if name in value:
            fields[name] = parse(hint, value[name], f"{where}.{name}" if where else name)
    unknown = [key for key in value if key not in hints]
    if unknown:
        raise ValueError(f"{said} has an unknown field {shorten(unknown[0])}")
    return schema(**fields)  # the one construction of a schema from fields, each checked above

"""vit5.schema.parse, the one reader of typed files, and vit5.files.read_json on top of it: each
rule of the docstring accepts what it should, and refuses the rest with the field named."""

import json
import subprocess
import sys
from dataclasses import dataclass
from typing import Annotated, Literal, Required, TypedDict

import pytest
import torch

from vit5.errors import InputError
from vit5.files import read_json
from vit5.schema import check, parse


@dataclass(frozen=True)
class Point:
    x: int
    y: Annotated[float, 0.5]

    def __post_init__(self) -> None:
        check(self.x < 10, "x", self.x, "below 10")


class Doc(TypedDict, total=False):
    kind: Required[Literal["a", "b"]]
    points: list[Point]
    names: dict[str, str]
    note: str | None
    offset: Annotated[int, -3]
    state: Annotated[torch.Tensor, torch.uint8, (2, -1)]


def test_a_valid_document_is_built_as_its_schema():
    value = {"kind": "a", "points": [{"x": 1, "y": 0.5}], "names": {"k": "v"}, "note": None}
    parsed = parse(Doc, value | {"offset": -3, "state": torch.zeros(2, 5, dtype=torch.uint8)})
    assert parsed["points"] == [Point(x=1, y=0.5)]
    assert parsed["note"] is None
    assert parse(Doc, {"kind": "b"}) == {"kind": "b"}  # not Required: may be absent


@pytest.mark.parametrize(
    ("value", "message"),
    [
        ([], r"the file=\[\] must be a dict of named fields"),
        ({}, "the file has no field 'kind'"),
        ({"kind": "c"}, "kind='c' must be 'a' or 'b'"),
        ({"kind": "a", "typo": 1}, "has an unknown field 'typo'"),
        (
            {"kind": "a", "points": [{"x": -1, "y": 1.0}]},
            r"points\[0\].x=-1 must be an integer >= 0",
        ),
        (
            {"kind": "a", "points": [{"x": True, "y": 1.0}]},
            r"points\[0\].x=True must be an integer",
        ),
        (
            {"kind": "a", "points": [{"x": 1, "y": 0.25}]},
            r"points\[0\].y=0.25 must be a finite number >= 0.5",
        ),
        ({"kind": "a", "points": [{"x": 1, "y": float("nan")}]}, "must be a finite number"),
        ({"kind": "a", "points": [{"x": 12, "y": 1.0}]}, "x=12 must be below 10"),
        ({"kind": "a", "names": {"k": 3}}, r"names\['k'\]=3 must be a string"),
        ({"kind": "a", "note": 3}, "note=3 must be a string or null"),
        ({"kind": "a", "offset": -4}, "offset=-4 must be an integer >= -3"),
        (
            {"kind": "a", "state": torch.zeros(3, 5, dtype=torch.uint8)},
            r"shape \(3, 5\), values 0..0 must be",
        ),
        (
            {"kind": "a", "state": torch.zeros(2, 5)},
            r"must be a torch.uint8 tensor of shape \(2, -1\)",
        ),
    ],
)
def test_a_broken_document_is_one_error_naming_the_field(value, message):
    with pytest.raises(ValueError, match=message):
        parse(Doc, value)


def test_read_json_names_the_file_and_the_field(tmp_path):
    path = tmp_path / "doc.json"
    path.write_text(json.dumps({"kind": "a", "points": [{"x": 1}]}))
    with pytest.raises(
        InputError, match=r"doc.json: points\[0\] has no field 'y'; fix or delete it"
    ):
        read_json(path, Doc)
    path.write_text("{not json")
    with pytest.raises(InputError, match="doc.json is not readable JSON"):
        read_json(path, Doc)
    path.write_text(json.dumps([1, 2]))
    assert read_json(path) == [1, 2]  # no schema: any document


def test_the_leaf_module_does_not_import_torch():
    """vit5.schema is importable before torch (the command line starts without it)."""
    code = "import sys, vit5.schema, vit5.files; print('torch' in sys.modules)"
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert done.stdout.strip() == "False"

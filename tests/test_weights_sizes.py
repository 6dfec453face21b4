"""Weights files that declare more than they hold are refused from their headers, before anything is
allocated: sparse or crafted safetensors files, DEFLATE-compressed or oversized .pth zips."""

from __future__ import annotations

import json
import struct
import zipfile

import pytest
import torch
from safetensors.torch import save_file

import vit5
import vit5.weights.checkpoint as checkpoint
from vit5.errors import InputError
from vit5.introspect.load import load_spec
from vit5.model.config import ConfigError
from vit5.weights.checkpoint import read_checkpoint, safe_torch_load
from vit5.weights.convert import CheckpointError

TINY = dict(depth=1, embed_dim=32, num_heads=2, img_size=16, patch_size=8, num_classes=3)


@pytest.fixture
def never_mapped(monkeypatch):
    """Fail the test if safetensors is asked to map a file (what allocates for a crafted one)."""

    def refuse(*args, **kwargs):
        raise AssertionError(
            f"safetensors.load_file({args[0]}) called on a file that should be refused"
        )

    monkeypatch.setattr(checkpoint, "load_file", refuse)


def write_safetensors_header(path, entries, data_bytes):
    """A safetensors file of this header, its data region ``data_bytes`` long and sparse (no disk used)."""
    header = json.dumps(entries).encode()
    with open(path, "wb") as f:
        f.write(struct.pack("<Q", len(header)) + header)
        f.truncate(8 + len(header) + data_bytes)
    return path


def test_sparse_weights_of_1e10_floats_beside_a_tiny_config_are_refused_unmapped(
    tmp_path, never_mapped
):
    run = vit5.save_pretrained(vit5.create_model("vit5_tiny", **TINY), tmp_path / "run")
    n = 10**10
    write_safetensors_header(
        run / "model.safetensors",
        {"w": {"dtype": "F32", "shape": [n], "data_offsets": [0, 4 * n]}},
        4 * n,
    )
    with pytest.raises(
        ConfigError, match=r"config.json describes a model of [\d,]+ parameters, but model"
    ):
        vit5.load_model(run)
    with pytest.raises(
        InputError, match=r"^cannot load .*10,000,000,000"
    ) as err:  # the command-line path
        load_spec(str(run))
    assert "\n" not in str(err.value)


def test_a_config_describing_a_huge_model_is_refused_before_its_weights_are_read(
    tmp_path, never_mapped
):
    run = vit5.save_pretrained(vit5.create_model("vit5_tiny", **TINY), tmp_path / "run")
    config = json.loads((run / "config.json").read_text())
    config["model_args"]["depth"] = 1_000_000
    (run / "config.json").write_text(json.dumps(config))
    with pytest.raises(ConfigError, match="depth 1000000"):
        vit5.load_model(run)


def test_a_bare_safetensors_file_over_the_parameter_limit_is_refused_unmapped(
    tmp_path, never_mapped
):
    n = 10**10
    path = write_safetensors_header(
        tmp_path / "big.safetensors",
        {"w": {"dtype": "BF16", "shape": [n], "data_offsets": [0, 2 * n]}},
        2 * n,
    )
    with pytest.raises(
        CheckpointError, match="declares 10,000,000,000 values, more than the limit"
    ):
        read_checkpoint(path)
    with pytest.raises(CheckpointError, match="more than the limit of 1,000"):
        read_checkpoint(path, max_params=1000)


@pytest.mark.parametrize(
    ("entry", "problem"),
    [  # safetensors checks each entry when it opens the file (its wording varies by version: not matched)
        ({"dtype": "F32", "shape": [4], "data_offsets": [0, 16]}, "corrupt or truncated"),
        ({"dtype": "F32", "shape": [4], "data_offsets": [0, 8]}, "corrupt or truncated"),
        (
            {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]},
            "tensor 'w' .*not a list of non-negative",
        ),
        ({"dtype": "Q7", "shape": [2], "data_offsets": [0, 8]}, "corrupt or truncated.*Q7"),
        ({"dtype": "F32", "shape": [2], "data_offsets": [8, 0]}, "corrupt or truncated"),
    ],
)
def test_crafted_safetensors_headers_are_one_error_each(tmp_path, never_mapped, entry, problem):
    path = write_safetensors_header(tmp_path / "x.safetensors", {"w": entry}, 8)
    with pytest.raises(CheckpointError, match=f"x.safetensors.*{problem}"):
        read_checkpoint(path)


def test_overlapping_tensors_are_refused(tmp_path, never_mapped):
    entries = {
        n: {"dtype": "F32", "shape": [2], "data_offsets": [o, o + 8]}
        for n, o in (("a", 0), ("b", 4))
    }
    with pytest.raises(CheckpointError, match="x.safetensors.*corrupt or truncated"):
        read_checkpoint(write_safetensors_header(tmp_path / "x.safetensors", entries, 12))


def test_real_safetensors_files_still_load(tmp_path):
    save_file(
        {"a": torch.arange(6.0).reshape(2, 3), "b": torch.ones(0)}, tmp_path / "x.safetensors"
    )
    assert checkpoint.safetensors_header(tmp_path / "x.safetensors") == {"a": 6, "b": 0}


def _recompressed(src, dst):
    with zipfile.ZipFile(src) as old, zipfile.ZipFile(dst, "w", zipfile.ZIP_DEFLATED) as new:
        for info in old.infolist():
            new.writestr(info.filename, old.read(info.filename))
    return dst


def test_deflated_pth_is_refused_before_torch_load_allocates(tmp_path, monkeypatch):
    torch.save({"model": {"w": torch.zeros(2_500_000)}}, tmp_path / "plain.pth")
    bomb = _recompressed(tmp_path / "plain.pth", tmp_path / "bomb.pth")
    assert (
        bomb.stat().st_size < 100_000 < (tmp_path / "plain.pth").stat().st_size
    )  # 10 MB of floats
    loads = []
    monkeypatch.setattr(torch, "load", lambda *a, **k: loads.append(a))
    with pytest.raises(
        CheckpointError,
        match=r"bomb.pth: \d+ of its entries are compressed .* expanding to 10,000,000",
    ):
        read_checkpoint(bomb)
    with pytest.raises(CheckpointError, match="optimizer.pt: 7 of its entries are compressed"):
        safe_torch_load(bomb.read_bytes(), name="optimizer.pt")
    assert loads == []


def test_pth_storages_over_the_limit_are_refused_before_loading(tmp_path, monkeypatch):
    torch.save({"model": {"w": torch.zeros(10_000)}}, tmp_path / "w.pth")
    assert set(read_checkpoint(tmp_path / "w.pth").state_dict) == {"w"}  # within the default limit
    monkeypatch.setattr(torch, "load", lambda *a, **k: pytest.fail("torch.load called"))
    with pytest.raises(
        CheckpointError, match=r"holds [\d,]+ bytes of tensors, more than the limit of 16,000"
    ):
        read_checkpoint(tmp_path / "w.pth", max_params=1000)

"""Deployment: torch.export programs and ONNX files reproduce the eager model (onnxruntime within 1e-4)."""

import onnxruntime
import pytest
import torch

import vit5
from vit5.cli.export import main
from vit5.weights.export import ExportError

FAMILIES = ("vit5_tiny", "deit3_tiny")  # RoPE + registers + RMSNorm; APE-only LayerNorm


def tiny(name="vit5_tiny", **kw):
    """A tiny preset with non-trivial norms, LayerScale and APE (a wrong graph cannot match)."""
    model = vit5.create_model(
        name, **{"depth": 1, "embed_dim": 64, "num_heads": 2, "img_size": 32, "patch_size": 8, **kw}
    )
    with torch.no_grad():
        for n, p in model.named_parameters():
            if "norm" in n or "gamma" in n or "pos_embed" in n:
                p.normal_(1.0 if "norm" in n else 0.0, 0.5)
    return model.eval()


def run_onnx(path, images):
    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    return torch.from_numpy(session.run(None, {"images": images.numpy()})[0])


@pytest.mark.parametrize("name", FAMILIES)
def test_torch_export_reproduces_the_model_with_a_free_batch(name):
    model = tiny(name).train()
    program = vit5.export_program(model, size=(32, 48))
    assert model.training  # exported in eval mode, the caller's mode restored
    model.eval()
    for batch in (1, 3):
        x = torch.randn(batch, 3, 32, 48)
        with torch.no_grad():
            torch.testing.assert_close(program.module()(x), model(x), rtol=1e-5, atol=1e-5)


def test_dynamic_size_export_covers_every_size_from_the_models_own_upward():
    model = tiny()  # stored grid 4x4
    program = vit5.export_program(model, size=(32, 48), dynamic_size=True).module()
    for size in (
        (32, 32),
        (32, 48),
        (64, 40),
        (96, 32),
    ):  # the stored grid itself: resampling is exact there
        x = torch.randn(2, 3, *size)
        with torch.no_grad():
            torch.testing.assert_close(program(x), model(x), rtol=1e-5, atol=1e-5)
    with pytest.raises(
        Exception, match=r"x.size\(\)\[2\] >= 32"
    ):  # below: eager antialiases, the graph cannot
        program(torch.randn(1, 3, 16, 32))


def test_export_command_writes_an_onnx_file_onnxruntime_runs_like_torch(tmp_path, capsys):
    model = tiny()
    vit5.save_pretrained(model, tmp_path / "run")
    out = tmp_path / "out" / "model.onnx"
    assert (
        main(
            [
                "--model",
                str(tmp_path / "run"),
                "--onnx",
                str(out),
                "--size",
                "32x48",
                "--dynamic-size",
            ]
        )
        == 0
    )
    stdout = capsys.readouterr().out
    assert (
        "input batchx3xheightxwidth" in stdout
        and "onnxruntime matches torch: max |difference|" in stdout
    )
    assert sorted(p.name for p in out.parent.iterdir()) == ["model.onnx"]  # one self-contained file
    for batch, size in (
        (1, (32, 48)),
        (3, (32, 32)),
        (2, (48, 64)),
    ):  # free batch, free size from 32x32 up
        x = torch.randn(batch, 3, *size)
        with torch.no_grad():
            torch.testing.assert_close(run_onnx(out, x), model(x), rtol=1e-4, atol=1e-4)
    with pytest.raises(ExportError, match="not a positive multiple of the patch size 8"):
        vit5.export_onnx(model, tmp_path / "bad.onnx", size=(30, 32))


def test_export_command_bad_input_is_one_error_line(tmp_path, capsys):
    assert (
        main(
            [
                "--model",
                "vit5_tiny",
                "--random-init",
                "--model-args",
                "depth=1",
                "img_size=32",
                "--onnx",
                str(tmp_path / "m.onnx"),
                "--size",
                "30x32",
            ]
        )
        == 2
    )
    err = capsys.readouterr().err
    assert err.startswith("error: image size 30x32 is not a positive multiple of the patch size 16")
    assert main(["--model", "vit5_tiny", "--onnx", str(tmp_path / "m.onnx")]) == 2
    assert "vit5_tiny has no released weights" in capsys.readouterr().err
    with pytest.raises(SystemExit):
        main(["--model", "vit5_tiny", "--random-init"])
    assert "nothing to write" in capsys.readouterr().err


def test_the_onnx_file_carries_the_preprocessing_and_the_class_names(tmp_path):
    import json

    from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD

    model = tiny(num_classes=3)
    model.pretrained_cfg["label_names"] = ["cat", "dog", "owl"]
    vit5.export_onnx(model, tmp_path / "m.onnx", check=False)
    session = onnxruntime.InferenceSession(
        str(tmp_path / "m.onnx"), providers=["CPUExecutionProvider"]
    )
    meta = session.get_modelmeta().custom_metadata_map
    assert json.loads(meta["label_names"]) == ["cat", "dog", "owl"]
    assert json.loads(meta["mean"]) == pytest.approx(IMAGENET_DEFAULT_MEAN)
    assert json.loads(meta["std"]) == pytest.approx(IMAGENET_DEFAULT_STD)
    assert json.loads(meta["input_size"]) == [3, 32, 32] and float(meta["crop_pct"]) == 1.0


_OVERWRITE_UNDER_A_FILE_SIZE_LIMIT = r"""
import resource, signal, sys
from vit5.cli.export import main
import vit5
run, onnx_path, program_path = sys.argv[1:4]
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # a write past the limit fails with EFBIG, as on a full disk
resource.setrlimit(resource.RLIMIT_FSIZE, (20_000, resource.RLIM_INFINITY))
try:
    vit5.export_onnx(vit5.load_model(run), onnx_path, check=False)
except Exception as err:
    print("onnx:", type(err).__name__, str(err).splitlines()[0])
print("program exit", main(["--model", run, "--program", program_path]))
"""


def test_a_failed_re_export_leaves_the_previous_files_whole(tmp_path):
    """A file-size limit (or a full disk, or a kill) during a re-export keeps the good files in place."""
    import subprocess
    import sys

    vit5.save_pretrained(tiny(), tmp_path / "run")
    out = tmp_path / "out"
    assert (
        main(
            [
                "--model",
                str(tmp_path / "run"),
                "--onnx",
                str(out / "m.onnx"),
                "--program",
                str(out / "m.pt2"),
            ]
        )
        == 0
    )
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    assert sorted(before) == ["m.onnx", "m.pt2"] and min(map(len, before.values())) > 20_000
    result = subprocess.run(
        [
            sys.executable,
            "-c",
            _OVERWRITE_UNDER_A_FILE_SIZE_LIMIT,
            str(tmp_path / "run"),
            str(out / "m.onnx"),
            str(out / "m.pt2"),
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert "onnx: StorageError cannot write" in result.stdout, result.stdout + result.stderr
    assert "program exit 2" in result.stdout and "error: cannot write" in result.stderr
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # no partial file, no leftover


def test_external_weights_are_put_in_place_with_their_graph(tmp_path):
    model = tiny()
    path = tmp_path / "m.onnx"
    report = vit5.export_onnx(model, path, external_data=True)
    assert (
        sorted(p.name for p in tmp_path.iterdir()) == ["m.onnx", "m.onnx.data"]
        and report.files[1].exists()
    )
    x = torch.randn(2, 3, 32, 32)
    with torch.no_grad():
        torch.testing.assert_close(
            run_onnx(path, x), model(x), rtol=1e-4, atol=1e-4
        )  # graph finds its weights
    vit5.export_onnx(model, path, external_data=False)
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "m.onnx"
    ]  # the old weights file went with it

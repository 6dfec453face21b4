"""Bad input to the evaluation tools is an InputError that names the file and the fix, never a traceback."""

import pytest

import vit5
from vit5.data.segmentation import dataset_info
from vit5.errors import InputError
from vit5.eval import read_manifest
from vit5.introspect.load import ModelRequest, load_models


def test_run_directory_with_several_checkpoints_is_an_eval_error(tmp_path):
    model = vit5.create_model("vit5_tiny", depth=1, img_size=32, patch_size=8, num_classes=3)
    for name in ("a", "b"):
        vit5.save_pretrained(model, tmp_path / name)
    with pytest.raises(InputError, match="several checkpoint directories, pick one"):
        load_models(ModelRequest(specs=(str(tmp_path),), weights="auto"))  # EMA looked for first


@pytest.mark.parametrize(
    "reader, name", [(read_manifest, "manifest.json"), (dataset_info, "dataset.json")]
)
def test_broken_json_is_an_eval_error_naming_the_file(tmp_path, reader, name):
    (tmp_path / name).write_text('{"format": ')
    with pytest.raises(InputError, match=rf"{name} is not readable JSON .*fix or delete it"):
        reader(tmp_path)


def test_hidden_folders_are_not_data_for_any_tool(tmp_path):
    from data_images import random_rgb, write_png

    from vit5.data import image_files
    from vit5.data.segmentation import list_pairs
    from vit5.viz.images import list_sources

    for split_dir in ("images/val", "annotations/val"):
        write_png(tmp_path / split_dir / "a.png", random_rgb(8, 8))
    write_png(
        tmp_path / "images/val/.ipynb_checkpoints/a-checkpoint.png", random_rgb(8, 8)
    )  # no mask: not data
    assert image_files(tmp_path / "images") == [tmp_path / "images/val/a.png"]
    assert list_pairs(tmp_path, "val") == [
        (tmp_path / "images/val/a.png", tmp_path / "annotations/val/a.png")
    ]
    assert [s.path for s in list_sources([str(tmp_path / "images")])] == [
        str(tmp_path / "images/val/a.png")
    ]


@pytest.mark.parametrize(
    "meta, message",
    [
        ([1, 2], "holds a list, not an object"),
        ({"num_classes": "5"}, "num_classes is '5', but must be a whole number from 2 to 65,536"),
        (
            {"num_classes": 10**12},
            "num_classes is 1000000000000",
        ),  # a confusion matrix of 1e24 cells
        ({"num_classes": 3, "class_names": ["a", "b"]}, "class_names is .* a list of 3 names"),
        ({"num_classes": 3, "ignore_index": "x"}, "ignore_index is 'x'"),
    ],
)
def test_crafted_dataset_json_fields_are_one_error_each(tmp_path, meta, message):
    import json

    (tmp_path / "dataset.json").write_text(json.dumps(meta))
    with pytest.raises(InputError, match=rf"dataset.json.*{message}"):
        dataset_info(tmp_path)
    with pytest.raises(InputError, match="must be a whole number from 2 to 65,536"):
        dataset_info(tmp_path / "none", num_classes=10**9)


@pytest.mark.parametrize(
    "change, message",
    [
        (
            {"images": [{"path": "a.png", "file": "../../secret.safetensors"}]},
            r"images\[0\] has file '../../secret.safetensors', not a path inside",
        ),
        (
            {"images": [{"path": "/etc/passwd", "file": "a.safetensors"}]},
            r"images\[0\] has path '/etc/passwd'",
        ),
        ({"images": ["a.png"]}, r"images\[0\] is a str, not an entry"),
        (
            {"images": [{"path": "a", "file": "a", "image_size": [0, 3]}]},
            r"images\[0\] has image_size \[0, 3\]",
        ),
        ({"num_images": "many"}, "num_images='many' must be a count"),
        ({"images": {"a": 1}}, "images=.* must be a list"),
        ({"source_root": None}, "source_root=None must be a str"),
        ({"failed": "none"}, "failed=.none. must be a list"),
    ],
)
def test_crafted_manifest_fields_are_one_error_each(tmp_path, change, message):
    import json

    from vit5.eval.features import FORMAT

    entry = {
        "path": "a.png",
        "file": "a.png.safetensors",
        "image_size": [8, 8],
        "input_size": [8, 8],
        "grid": [1, 1],
    }
    manifest = {
        "format": FORMAT,
        "source_root": str(tmp_path),
        "num_images": 1,
        "images": [entry],
        "failed": [],
    }
    (tmp_path / "manifest.json").write_text(json.dumps({**manifest, **change}))
    with pytest.raises(InputError, match=rf"manifest.json: {message}"):
        read_manifest(tmp_path)
    (tmp_path / "manifest.json").write_text("[]")
    with pytest.raises(InputError, match="manifest.json holds a list, not a manifest object"):
        read_manifest(tmp_path)


@pytest.mark.parametrize(
    "change, message",
    [
        ({"img_size": [2**40, 16]}, r"describes a model of 8.8e\+12 parameters"),
        ({"depth": "2"}, "depth = '2' has the wrong type"),
        ({"norm_eps": float("nan")}, "norm_eps must be a positive finite number"),
        ({"rope_theta": float("inf")}, "rope_theta must be a positive finite number"),
        ({"num_registers": 10**12}, "describes a model of"),
        ({"rope_ref_grid": [1, 2, 3]}, "rope_ref_grid = .* has the wrong type"),
    ],
)
def test_crafted_model_config_fields_are_one_error_each(tmp_path, change, message):
    import json

    from vit5.introspect.load import load_spec

    run = vit5.save_pretrained(
        vit5.create_model(
            "vit5_tiny", depth=1, embed_dim=32, num_heads=2, img_size=16, patch_size=8
        ),
        tmp_path,
    )
    config = json.loads((run / "config.json").read_text())
    config["model_args"].update(change)
    (run / "config.json").write_text(json.dumps(config))
    with pytest.raises(InputError, match=rf"^cannot load .*config.json.*{message}") as err:
        load_spec(str(run))
    assert "\n" not in str(err.value)

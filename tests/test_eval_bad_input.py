"""Bad input to the evaluation tools is an InputError that names the file and the fix, never a traceback."""

import pytest

import vit5
from vit5.data.segmentation import dataset_info
from vit5.errors import InputError
from vit5.eval.export import read_manifest
from vit5.eval.load import load_models


def test_run_directory_with_several_checkpoints_is_an_eval_error(tmp_path):
    model = vit5.create_model("vit5_tiny", depth=1, img_size=32, patch_size=8, num_classes=3)
    for name in ("a", "b"):
        vit5.save_pretrained(model, tmp_path / name)
    with pytest.raises(InputError, match="several checkpoint directories, pick one"):
        load_models(str(tmp_path))  # weights="auto" looks for EMA weights first


@pytest.mark.parametrize("reader, name", [(read_manifest, "manifest.json"), (dataset_info, "dataset.json")])
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
    assert [s.path for s in list_sources([str(tmp_path / "images")])] == [str(tmp_path / "images/val/a.png")]

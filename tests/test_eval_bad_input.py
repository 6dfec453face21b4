"""Bad input to the evaluation tools is an EvalError that names the file and the fix, never a traceback."""

import pytest

import vit5
from vit5.eval import EvalError
from vit5.eval.export import read_manifest
from vit5.eval.load import load_models
from vit5.eval.seg_data import dataset_info


def test_run_directory_with_several_checkpoints_is_an_eval_error(tmp_path):
    model = vit5.create_model("vit5_tiny", depth=1, img_size=32, patch_size=8, num_classes=3)
    for name in ("a", "b"):
        vit5.save_pretrained(model, tmp_path / name)
    with pytest.raises(EvalError, match="several checkpoint directories, pick one"):
        load_models(str(tmp_path))  # weights="auto" looks for EMA weights first


@pytest.mark.parametrize("reader, name", [(read_manifest, "manifest.json"), (dataset_info, "dataset.json")])
def test_broken_json_is_an_eval_error_naming_the_file(tmp_path, reader, name):
    (tmp_path / name).write_text('{"format": ')
    with pytest.raises(EvalError, match=rf"{name} is not readable JSON .*fix or delete it"):
        reader(tmp_path)

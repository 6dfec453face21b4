"""Bad input to the model library is a clear error that names the problem, never a deep torch traceback."""

import pytest
import torch

import vit5
from vit5 import CheckpointError


def tiny():
    return vit5.create_model("vit5_tiny", depth=2, img_size=32, patch_size=8, num_classes=3).eval()


def test_uint8_images_are_refused_with_the_fix():
    with pytest.raises(ValueError, match=r"expected float images .*got torch.uint8"):
        tiny()(torch.zeros(1, 3, 32, 32, dtype=torch.uint8))


def test_recording_is_read_only_after_a_forward_and_in_range():
    model = tiny()
    with vit5.record(model) as rec:
        with pytest.raises(RuntimeError, match="nothing recorded yet"):
            rec.patch_norms(-1)
        model(torch.randn(1, 3, 32, 32))
    assert rec.patch_norms(-1).shape == (1, 4, 4)
    with pytest.raises(ValueError, match="layer 5 is out of range: this model has 2 blocks"):
        rec.attention(5)  # not silently block 1


@pytest.mark.parametrize("text", ['{"config": ', '{"weights": {}}'])
def test_corrupt_config_json_is_a_checkpoint_error(tmp_path, text):
    vit5.save_pretrained(tiny(), tmp_path)
    (tmp_path / "config.json").write_text(text)
    with pytest.raises(CheckpointError, match="config.json is corrupt or not a vit5 config"):
        vit5.load_model(tmp_path)


def test_state_dict_without_vit_blocks_is_a_checkpoint_error(tmp_path):
    sd = {
        "patch_embed.proj.weight": torch.zeros(8, 3, 4, 4),
        "blocks.0.mlp.fc1_g.weight": torch.zeros(8, 8),
    }
    torch.save(sd, tmp_path / "other.pth")
    with pytest.raises(
        CheckpointError, match="not a ViT / ViT-5 state dict this loader understands"
    ):
        vit5.load_model(tmp_path / "other.pth")


def test_a_preset_name_that_does_not_match_our_checkpoint_is_an_error(tmp_path):
    vit5.save_pretrained(tiny(), tmp_path)
    with pytest.raises(CheckpointError, match="width 192, not vit5_base .*vit5.load_model"):
        vit5.create_model("vit5_base", pretrained=tmp_path)
    assert (
        vit5.create_model("vit5_tiny", pretrained=tmp_path).cfg.depth == 2
    )  # the directory's own config

"""Fine-tuning starts: official ViT-5 / timm deit3 / our runs; a new head and a new resolution are the only
non-strict parts, reported; a head that does not fit says how to fix it."""

import cv2
import numpy as np
import pytest
import torch
from test_train_support import single_thread, tiny_config  # noqa: F401 (autouse fixture)
from timm.models.vision_transformer import VisionTransformer

import vit5
from vit5.data import export_digits_imagefolder
from vit5.reference import OfficialViT5
from vit5.train import TrainConfigError, Trainer
from vit5.train.config import ModelSection
from vit5.train.modeling import build_model

ARCH = dict(patch_size=8, depth=2, embed_dim=48, num_heads=2)


def section(pretrained, name="vit5_tiny", **kw) -> ModelSection:
    return ModelSection(
        name=name, img_size=16, overrides=dict(ARCH), pretrained=str(pretrained), **kw
    )


def official_checkpoint(path, num_classes=1000):
    model = OfficialViT5(
        img_size=16, patch_size=8, embed_dim=48, depth=2, num_heads=2, num_classes=num_classes
    )
    ema = OfficialViT5(
        img_size=16, patch_size=8, embed_dim=48, depth=2, num_heads=2, num_classes=num_classes
    )
    torch.save({"model": model.state_dict(), "model_ema": ema.state_dict(), "epoch": 799}, path)
    return model, ema


def test_official_checkpoint_ema_weights_with_a_new_head(tmp_path):
    _, ema = official_checkpoint(tmp_path / "vit5.pth")
    model, description, report = build_model(
        section(tmp_path / "vit5.pth", pretrained_ema=True), num_classes=10
    )
    assert model.head.weight.shape == (10, 48)
    torch.testing.assert_close(model.blocks[1].mlp.fc2.weight, ema.blocks[1].mlp.fc2.weight)
    assert "EMA weights: loaded" in report and "strict" in report
    assert "newly initialised (not in the checkpoint's shape): head.weight, head.bias" in report
    assert "new 10-class head" in report and "fine-tuned" in description


def test_timm_deit3_checkpoint_at_a_new_resolution(tmp_path):
    ref = VisionTransformer(
        img_size=16,
        patch_size=8,
        embed_dim=48,
        depth=2,
        num_heads=2,
        num_classes=10,
        qkv_bias=True,
        no_embed_class=True,
        init_values=1e-4,
    )
    torch.save(ref.state_dict(), tmp_path / "deit3.pth")
    cfg = section(tmp_path / "deit3.pth", name="deit3_tiny")
    cfg.img_size = 32
    model, _, report = build_model(cfg, num_classes=10)
    assert (
        "resampled pos_embed 2x2 -> 4x4 (bicubic)" in report
        and "head kept: it already has 10 classes" in report
    )
    torch.testing.assert_close(model.head.weight, ref.head.weight)


def test_head_mismatch_and_architecture_mismatch_say_how_to_fix(tmp_path):
    official_checkpoint(tmp_path / "vit5.pth", num_classes=1000)
    with pytest.raises(
        TrainConfigError,
        match=r"has a 1000-class head but the data has 10 classes\. Set model\.new_head=true",
    ):
        build_model(section(tmp_path / "vit5.pth", new_head=False), num_classes=10)
    official_checkpoint(tmp_path / "seven.pth", num_classes=7)
    with pytest.raises(
        TrainConfigError,
        match=r"head\.weight: checkpoint \(7, 48\) vs model \(1000, 48\)[\s\S]*"
        r"model\.new_head=true starts a new 10-class head",
    ):
        build_model(section(tmp_path / "seven.pth", new_head=False), num_classes=10)
    deeper = section(tmp_path / "vit5.pth")
    deeper.overrides["depth"] = 3
    with pytest.raises(
        TrainConfigError, match=r"does not fit the model:[\s\S]*missing \(13\): blocks\.2\."
    ) as info:
        build_model(deeper, num_classes=10)
    assert "new_head" not in str(info.value)  # the head is not the problem here
    with pytest.raises(TrainConfigError, match=r"model\.num_classes=5 but the data has 10 classes"):
        build_model(ModelSection(name="vit5_tiny", num_classes=5), num_classes=10)


def test_finetune_a_run_of_ours_on_three_classes_at_a_new_resolution(tmp_path, capsys):
    source = vit5.create_model("vit5_tiny", img_size=16, num_classes=10, **ARCH)
    vit5.save_pretrained(source, tmp_path / "pretrained")
    root = tmp_path / "three"
    export_digits_imagefolder(root, size=32)
    for split in ("train", "val"):
        for digit in "3456789":
            for f in (root / split / digit).iterdir():
                f.unlink()
            (root / split / digit).rmdir()
    cfg = tiny_config(
        tmp_path,
        "data.dataset=folder",
        f"data.root={root}",
        f"model.pretrained={tmp_path / 'pretrained'}",
        "model.img_size=32",
        "optim.layer_decay=0.75",
    )
    trainer = Trainer(cfg)
    torch.testing.assert_close(
        trainer.raw_model.blocks[0].attn.qkv.weight, source.blocks[0].attn.qkv.weight
    )
    summary = trainer.fit()
    out = capsys.readouterr().out
    assert "newly initialised (not in the checkpoint's shape): head.weight, head.bias" in out
    assert "resampled pos_embed 2x2 -> 4x4 (bicubic)" in out and "new 3-class head" in out
    assert (
        summary["final_top1"] is not None and trainer.state.num_updates == 430 // 32
    )  # digits 0-2: 430 train images
    assert vit5.load_model(trainer.run_dir / "final").head.weight.shape == (3, 48)


def test_released_weights_by_name_or_true_fine_tune_with_a_new_head(hf_cache, tmp_path):
    from hub_support import lay_out_download

    torch.manual_seed(0)
    ref = OfficialViT5()  # the official ViT-5-S at 224 px, as released
    torch.save({"model": ref.state_dict()}, tmp_path / "vit5_small_patch16_224.pth")
    lay_out_download(
        hf_cache,
        "FengWang3211/ViT-5",
        {"vit5_small_patch16_224.pth": tmp_path / "vit5_small_patch16_224.pth"},
    )
    for pretrained in ("vit5_small_patch16_224.in1k", "True"):  # True: `model.pretrained=true`
        cfg = ModelSection(name="vit5_small", img_size=32, pretrained=pretrained)
        model, description, report = build_model(cfg, num_classes=3)
        torch.testing.assert_close(model.blocks[0].attn.qkv.weight, ref.blocks[0].attn.qkv.weight)
        assert model.head.weight.shape == (3, 384) and "new 3-class head" in report
        assert "vit5_small_patch16_224.in1k" in report and "architecture" not in report
        assert description.startswith("vit5_small") and "fine-tuned" in description


def test_a_run_of_ours_gives_its_own_architecture_whatever_model_name_says(tmp_path):
    source = vit5.create_model("vit5_tiny", img_size=16, num_classes=10, **ARCH)
    vit5.save_pretrained(source, tmp_path / "run" / "final")
    # the fine-tune recipe names vit5_small; the run is a 2-block vit5_tiny of width 48
    cfg = ModelSection(name="vit5_small", img_size=16, pretrained=str(tmp_path / "run"))
    model, description, report = build_model(cfg, num_classes=10)
    assert (model.cfg.embed_dim, model.cfg.depth) == (48, 2)
    torch.testing.assert_close(model.head.weight, source.head.weight)
    assert "not model.name=vit5_small" in report and description.startswith("vit5_tiny")


def test_an_mlp_ratio_that_rounds_to_no_hidden_unit_is_refused_not_rebuilt_as_another_mlp(tmp_path):
    import json

    with pytest.raises(
        vit5.ConfigError, match=r"mlp_ratio 1e-09 gives an MLP hidden width of .* = 0"
    ):
        vit5.create_model("vit5_tiny", mlp_ratio=1e-9)
    model = vit5.create_model("vit5_tiny", img_size=16, num_classes=3, **ARCH)
    vit5.save_pretrained(model, tmp_path / "m")
    config = json.loads((tmp_path / "m" / "config.json").read_text())
    config["model_args"]["mlp_ratio"] = 1e-9  # edited: the weights hold a 4x MLP
    (tmp_path / "m" / "config.json").write_text(json.dumps(config))
    with pytest.raises(
        vit5.ConfigError, match=r"config\.json: mlp_ratio 1e-09 gives an MLP hidden width"
    ):
        vit5.load_model(tmp_path / "m")


def test_one_class_is_refused_with_the_fix(tmp_path):
    root = tmp_path / "one"
    for split in ("train", "val"):
        (root / split / "cat").mkdir(parents=True)
        for i in range(4):
            cv2.imwrite(
                str(root / split / "cat" / f"{i}.png"), np.full((16, 16, 3), 40 * i, np.uint8)
            )
    cfg = tiny_config(tmp_path, "data.dataset=folder", f"data.root={root}")
    with pytest.raises(
        TrainConfigError, match=r"has 1 class \(cat\): a classifier needs at least 2"
    ):
        Trainer(cfg)


def test_an_ema_that_cannot_move_in_the_run_is_a_warning_in_the_header(tmp_path, capsys):
    from vit5.train.config import EmaSection
    from vit5.train.loop import ema_horizon_warning

    assert ema_horizon_warning(EmaSection(decay=0.99996), 44).startswith(
        "WARNING: ema.decay=0.99996 averages over ~25,000 updates"
    )
    assert ema_horizon_warning(EmaSection(decay=0.9), 44) == ""
    assert ema_horizon_warning(EmaSection(decay=0.99996, enabled=False), 44) == ""
    trainer = Trainer(tiny_config(tmp_path, "ema.decay=0.99996"))
    try:
        trainer._print_header()
    finally:
        trainer.close()
    out = capsys.readouterr().out
    assert "but this run makes 44 in all" in out and "ema.decay=0.7727" in out


def test_loader_workers_are_clamped_to_the_cpus_before_torch_warns(tmp_path, capsys, recwarn):
    from vit5.runtime import cpu_count

    trainer = Trainer(tiny_config(tmp_path, "data.num_workers=64", "data.persistent_workers=false"))
    try:
        assert trainer.data.train_loader.num_workers == cpu_count() < 64
        trainer._print_header()
    finally:
        trainer.close()
    assert (
        f"data.num_workers=64 but this process may use {cpu_count()} CPUs"
        in capsys.readouterr().out
    )
    assert not [w for w in recwarn if "worker processes in total" in str(w.message)]

"""LoRA fine-tuning (model.lora, peft): only the adapters and the head train; best/ and final/ are plain
ViT-5 checkpoints whose logits are the adapted model's; --resume continues a LoRA run exactly."""

import sys

import pytest
import torch
from safetensors.torch import load_file
from test_train_support import single_thread, tiny_config  # noqa: F401 (autouse fixture)

import vit5
from vit5.train import TrainConfigError, Trainer, load_config
from vit5.train.checkpointing import list_checkpoints

ARCH = dict(patch_size=8, depth=2, embed_dim=48, num_heads=2)  # the tiny model of tiny_config
R = 4


def lora_config(tmp_path, *overrides):
    source = vit5.create_model(
        "vit5_tiny", img_size=16, num_classes=7, **ARCH
    )  # 7 classes: a new head
    vit5.save_pretrained(source, tmp_path / "pretrained")
    cfg = tiny_config(
        tmp_path,
        f"model.pretrained={tmp_path / 'pretrained'}",
        "model.lora.enabled=true",
        f"model.lora.r={R}",
        "model.lora.alpha=8",
        *overrides,
    )
    return cfg, source


def expected_trainable(dim=48, hidden=192, depth=2, classes=10, r=R):
    # per block: r * (in + out) for each of qkv (dim -> 3 dim), proj, fc1 (dim -> hidden), fc2
    adapters = r * ((dim + 3 * dim) + (dim + dim) + (dim + hidden) + (hidden + dim))
    return depth * adapters + classes * dim + classes


def test_lora_trains_adapters_and_head_only_and_exports_a_plain_checkpoint(
    tmp_path, monkeypatch, capsys
):
    cfg, source = lora_config(tmp_path)
    trainer = Trainer(cfg)
    model = trainer.raw_model
    trainable = {n: p.numel() for n, p in model.named_parameters() if p.requires_grad}
    assert all(
        ".lora_A." in n or ".lora_B." in n or n.startswith("head.modules_to_save.")
        for n in trainable
    )
    assert sum(trainable.values()) == expected_trainable()
    total = (
        sum(p.numel() for p in source.parameters()) - (7 * 48 + 7) + (10 * 48 + 10)
    )  # the new head
    total += expected_trainable() - (10 * 48 + 10)  # the adapters themselves
    optimized = sum(p.numel() for g in trainer.optimizer.param_groups for p in g["params"])
    assert optimized == sum(trainable.values())  # the optimizer holds nothing frozen
    assert "patch_embed.proj.base_layer.weight" not in dict(
        model.named_parameters()
    )  # not a target
    frozen_before = {
        n: p.detach().clone() for n, p in model.named_parameters() if not p.requires_grad
    }

    summary = trainer.fit()
    out = capsys.readouterr().out
    fraction = expected_trainable() / total
    assert (
        f"{expected_trainable():,} of {total:,} parameters trained ({100 * fraction:.1f}%)" in out
    )
    assert summary["final_top1"] is not None and fraction < 0.2
    for name, before in frozen_before.items():
        torch.testing.assert_close(
            dict(model.named_parameters())[name], before, rtol=0, atol=0, msg=name
        )
    assert model.blocks[0].attn.qkv.lora_B["default"].weight.abs().max() > 0  # the adapters moved

    monkeypatch.setitem(sys.modules, "peft", None)  # reading the export needs no peft
    images = torch.randn(8, 3, 16, 16)
    model.eval()
    with torch.no_grad():
        for use_ema, adapted in ((False, model), (True, trainer.ema.module)):
            plain = vit5.load_model(trainer.run_dir / "final", use_ema=use_ema).eval()
            assert (
                type(plain.blocks[0].attn.qkv) is torch.nn.Linear
                and type(plain.head) is torch.nn.Linear
            )
            torch.testing.assert_close(plain(images), adapted.eval()(images), rtol=0, atol=1e-5)
        # the merge is W + (alpha / r) B A: checked against the adapter's own matrices
        qkv = model.blocks[1].attn.qkv
        merged = (
            qkv.base_layer.weight
            + 8 / R * qkv.lora_B["default"].weight @ qkv.lora_A["default"].weight
        )
        torch.testing.assert_close(plain_weights(trainer)["blocks.1.attn.qkv.weight"], merged)
        assert not torch.equal(merged, source.blocks[1].attn.qkv.weight)


def plain_weights(trainer):
    return load_file(trainer.run_dir / "final" / "model.safetensors")


def test_a_lora_run_resumes_exactly(tmp_path):
    cfg, _ = lora_config(tmp_path, "checkpoint.every_steps=20", "schedule.epochs=1")
    reference = Trainer(cfg)
    reference.fit()
    checkpoint = next(
        c for c in list_checkpoints(reference.run_dir / "checkpoints") if c.name.endswith("20")
    )
    resumed = Trainer(cfg, resume=checkpoint)  # an older checkpoint: continues in a fork
    assert resumed.state.num_updates == 20 and resumed.run_dir != reference.run_dir
    resumed.fit()
    expected, actual = plain_weights(reference), plain_weights(resumed)
    assert expected.keys() == actual.keys()
    for key in expected:
        torch.testing.assert_close(actual[key], expected[key], rtol=1e-6, atol=1e-6, msg=key)


def test_lora_config_errors_name_the_fix(tmp_path, monkeypatch):
    with pytest.raises(TrainConfigError, match=r"model\.lora\.targets=\['qkv', 'mlp'\].*not mlp"):
        lora_config(tmp_path, "model.lora.targets=[qkv,mlp]")
    with pytest.raises(
        TrainConfigError, match=r"model\.pretrained is not set, so the frozen weights"
    ):
        tiny_config(tmp_path, "model.lora.enabled=true")
    with pytest.raises(
        TrainConfigError, match=r"model\.lora\.rr is not a setting\. Did you mean model\.lora\.r\?"
    ):
        tiny_config(tmp_path, "model.lora.rr=4")
    monkeypatch.setitem(sys.modules, "peft", None)
    with pytest.raises(
        TrainConfigError, match=r"needs the peft library.*pip install 'vit5\[peft\]'"
    ):
        lora_config(tmp_path)


def test_the_lora_recipe_loads():
    cfg = load_config(
        "finetune_lora", ["data.root=/data", "model.pretrained=vit5.pth"], check_paths=False
    )
    assert cfg.model.lora.enabled and cfg.model.lora.targets == ["qkv", "proj", "fc1", "fc2"]
    assert cfg.optim.name == "adamw" and cfg.model.new_head

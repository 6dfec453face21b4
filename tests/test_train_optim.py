"""Optimizer: timm factory with the ViT-5 weight-decay groups (timm ``create_optimizer`` as
main.py of github.com/wangf3014/ViT-5 calls it, commit b7b0796) and layer decay."""

import pytest
import torch
from timm.optim import Lamb

import vit5
from vit5.train.config import OptimSection, ScheduleSection
from vit5.train.loop import LRSchedule, build_optimizer


def tiny_model():
    return vit5.create_model("vit5_tiny", depth=2, img_size=32, patch_size=8, num_classes=10)


def group_of(optimizer):
    return {id(p): g for g in optimizer.param_groups for p in g["params"]}


def expected_decay(name: str, param: torch.Tensor) -> bool:
    """Official rule (timm 0.4.12 add_weight_decay): no decay for 1-D params and no_weight_decay()."""
    return param.ndim > 1 and name not in {"pos_embed", "cls_token", "reg_token"}


def test_lamb_groups_have_no_decay_on_norms_biases_gains_tokens_and_pos_embed():
    model = tiny_model()
    opt = build_optimizer(model, OptimSection(name="lamb", lr=4e-3, weight_decay=0.05), lr=4e-3)
    assert isinstance(opt, Lamb)
    groups = group_of(opt)
    for name, p in model.named_parameters():
        assert groups[id(p)]["weight_decay"] == (0.05 if expected_decay(name, p) else 0.0), name
    no_decay = {n for n, p in model.named_parameters() if groups[id(p)]["weight_decay"] == 0}
    assert {
        "blocks.0.ls1.gamma",
        "blocks.1.ls2.gamma",
        "blocks.0.attn.q_norm.weight",
        "blocks.0.norm1.weight",
        "norm.weight",
        "head.bias",
        "blocks.0.mlp.fc1.bias",
        "cls_token",
        "reg_token",
        "pos_embed",
    } <= no_decay
    assert {"blocks.0.attn.qkv.weight", "patch_embed.proj.weight", "head.weight"}.isdisjoint(
        no_decay
    )
    # apex FusedLAMB as called by the official code: eps and betas from the command, grad-norm clip 1.0,
    # trust ratio only where weight decay is applied.
    hp = opt.param_groups[0]
    assert (hp["eps"], hp["betas"], hp["max_grad_norm"], hp["always_adapt"]) == (
        1e-8,
        (0.9, 0.999),
        1.0,
        False,
    )


def test_finetuning_uses_adamw():
    opt = build_optimizer(
        tiny_model(), OptimSection(name="adamw", lr=1e-5, weight_decay=0.1), lr=1e-5
    )
    assert type(opt) is torch.optim.AdamW
    assert sorted({g["weight_decay"] for g in opt.param_groups}) == [0.0, 0.1]


def test_layer_decay_scales_follow_depth():
    model, decay = tiny_model(), 0.5
    opt = build_optimizer(model, OptimSection(name="adamw", lr=1e-3, layer_decay=decay), lr=1e-3)
    groups = group_of(opt)
    depth = 2
    for name, p in model.named_parameters():
        if name.startswith("blocks."):
            layer = int(name.split(".")[1]) + 1
        elif name.startswith(
            "norm"
        ):  # timm's MATCH_PREV_GROUP: the final norm goes with the last block
            layer = depth
        elif name.startswith("head"):
            layer = depth + 1
        else:  # patch_embed, cls/reg tokens, pos_embed
            layer = 0
        assert groups[id(p)]["lr_scale"] == pytest.approx(decay ** (depth + 1 - layer)), name
        assert groups[id(p)]["weight_decay"] == (0.05 if expected_decay(name, p) else 0.0), name
    # the timm scheduler applies the scales: each group's lr is peak lr x its scale after warmup
    schedule = LRSchedule(
        opt, ScheduleSection(epochs=10, warmup_epochs=0, interval="update"), updates_per_epoch=4
    )
    for group in opt.param_groups:
        assert group["lr"] == pytest.approx(1e-3 * group["lr_scale"])
    assert schedule.lr == pytest.approx(1e-3)


def test_lr_is_absolute_unless_a_base_batch_is_given():
    assert OptimSection(lr=4e-3).peak_lr(global_batch=2048) == 4e-3  # --unscale-lr
    scaled = OptimSection(lr=5e-4, lr_base_batch=512)
    assert scaled.peak_lr(global_batch=1024) == pytest.approx(1e-3)


def test_muon_orthogonalises_the_hidden_matrices_and_leaves_the_rest_to_adamw():
    """timm's Muon: the blocks' matrices on Muon; 1-D parameters, the patch embedding, the tokens,
    pos_embed and the head on its AdamW fallback; one step moves every parameter."""
    model = tiny_model()
    before = {n: p.detach().clone() for n, p in model.named_parameters()}
    opt = build_optimizer(model, OptimSection(name="muon", lr=1e-3, weight_decay=0.05), lr=1e-3)
    fallback = {n for n, p in model.named_parameters() if group_of(opt)[id(p)].get("use_fallback")}
    assert {
        "patch_embed.proj.weight",
        "head.weight",
        "pos_embed",
        "cls_token",
        "reg_token",
    } <= fallback
    logits = model(torch.randn(4, 3, 32, 32))
    torch.nn.functional.cross_entropy(logits, torch.tensor([0, 1, 2, 3])).backward()
    opt.step()
    on_muon = {n for n, p in model.named_parameters() if opt.state[p]["use_muon"]}
    hidden = {n for n, p in model.named_parameters() if n.startswith("blocks.") and p.ndim == 2}
    assert on_muon == hidden and len(hidden) == 2 * 4  # qkv, proj, fc1, fc2 in each of 2 blocks
    for name, p in model.named_parameters():
        assert torch.isfinite(p).all() and not torch.equal(p, before[name]), name


@pytest.mark.parametrize("native", [True, False])
def test_muon_orthogonalises_in_fp32_where_the_cpu_emulates_bf16(monkeypatch, native):
    """timm's Newton-Schulz runs in bf16; on a CPU without native bf16 our Muon asks it for fp32, for
    its steps only: timm's function is back after each step, and an optimizer built for a native-bf16
    CPU (or for another device) keeps timm's default."""
    import timm.optim.muon as timm_muon

    dtypes = []
    original = timm_muon.zeropower_via_newtonschulz

    def spy(*args, dtype=torch.bfloat16, **kwargs):
        dtypes.append(dtype)
        return original(*args, dtype=dtype, **kwargs)

    monkeypatch.setattr(timm_muon, "zeropower_via_newtonschulz", spy)
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: native)
    model = tiny_model()
    cfg = OptimSection(name="muon", lr=1e-3, weight_decay=0.05)
    opt = build_optimizer(model, cfg, lr=1e-3, on_cpu=True)
    logits = model(torch.randn(4, 3, 32, 32))
    torch.nn.functional.cross_entropy(logits, torch.tensor([0, 1, 2, 3])).backward()
    opt.step()
    expected = torch.bfloat16 if native else torch.float32
    assert dtypes and set(dtypes) == {expected}  # one call per hidden matrix
    assert timm_muon.zeropower_via_newtonschulz is spy
    dtypes.clear()
    build_optimizer(model, cfg, lr=1e-3, on_cpu=False).step()
    assert set(dtypes) == {torch.bfloat16}

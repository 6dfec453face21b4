"""The ViT5 backbone: sizes, token order, resolution handling, the timm contract and config validation."""

import pytest
import timm
import timm.data
import timm.optim
import torch
import torch.nn.functional as F

import vit5
from vit5 import ConfigError, ViT5Config


def tiny(**kw):
    base = dict(depth=2, img_size=32, num_classes=5)
    return vit5.create_model("vit5_tiny", **{**base, **kw}).eval()


@pytest.mark.parametrize(
    "name,img,count",
    [
        ("vit5_small", 224, 22_039_144),
        ("vit5_base", 224, 86_543_080),
        ("vit5_large", 224, 304_258_024),
        ("vit5_xlarge", 224, 448_505_128),
        ("vit5_small", 192, 22_019_176),
        ("vit5_base", 384, 86_834_920),
        ("vit5_large", 192, 304_204_776),
        ("vit5_xlarge", 384, 448_942_888),
    ],
)
def test_official_parameter_counts(name, img, count):
    with torch.device("meta"):
        model = vit5.create_model(name, img_size=img)
    assert sum(p.numel() for p in model.parameters()) == count


def test_official_state_dict_shapes_for_base():
    with torch.device("meta"):
        model = vit5.create_model("vit5_base")
    sd = model.state_dict()
    assert sd["pos_embed"].shape == (1, 196, 768) and sd["reg_token"].shape == (1, 4, 768)
    assert (
        sd["blocks.0.attn.qkv.weight"].shape == (2304, 768) and "blocks.0.attn.qkv.bias" not in sd
    )
    assert sd["blocks.0.attn.q_norm.weight"].shape == (64,) and "norm.bias" not in sd


def test_token_order_and_ape_on_patches_only():
    model = tiny()
    x = torch.randn(2, 3, 32, 48)
    tokens, grid = model.prepare_tokens(x)
    assert grid == (2, 3) and tokens.shape == (2, 1 + 6 + 4, 192)
    patches = model.patch_embed.proj(x).flatten(2).transpose(1, 2)
    pos = F.interpolate(
        model.pos_embed.reshape(1, 2, 2, 192).permute(0, 3, 1, 2),
        size=(2, 3),
        mode="bicubic",
        align_corners=False,
    )
    torch.testing.assert_close(tokens[:, 0], model.cls_token[0].expand(2, -1))
    torch.testing.assert_close(tokens[:, 1:7], patches + pos.permute(0, 2, 3, 1).reshape(1, 6, 192))
    torch.testing.assert_close(tokens[:, 7:], model.reg_token.expand(2, -1, -1))


def test_any_resolution_and_set_input_size():
    model = tiny()
    with torch.no_grad():
        model.pos_embed.normal_()  # at its zero init a wrong resample would not show
    x = torch.randn(1, 3, 48, 80)
    dynamic = model.forward_features(x)
    trained = model.pos_embed.detach().reshape(1, 2, 2, 192).permute(0, 3, 1, 2)
    model.set_input_size((48, 80))
    assert model.pos_embed.shape == (1, 15, 192) and model.cfg.img_size == (48, 80)
    expected = F.interpolate(trained, size=(3, 5), mode="bicubic", align_corners=False)
    torch.testing.assert_close(
        model.pos_embed.detach().reshape(1, 3, 5, 192).permute(0, 3, 1, 2), expected
    )
    torch.testing.assert_close(model.forward_features(x), dynamic)


def test_wrong_inputs_fail_with_a_fix():
    model = tiny()
    with pytest.raises(
        ValueError, match=r"image size 33x32 is not a positive multiple of the patch size 16.*32x32"
    ):
        model(torch.randn(1, 3, 33, 32))
    with pytest.raises(ValueError, match="add a batch dimension"):
        model(torch.randn(3, 32, 32))
    with pytest.raises(ValueError, match=r"expected images of shape \[batch, 3"):
        model(torch.randn(1, 1, 32, 32))


def test_forward_intermediates_contract():
    model = tiny(depth=3)
    x = torch.randn(2, 3, 32, 64)
    final, inter = model.forward_intermediates(x, indices=[0, -1], return_prefix_tokens=True)
    assert [s.shape for s, _ in inter] == [(2, 192, 2, 4)] * 2 and inter[0][1].shape == (2, 5, 192)
    torch.testing.assert_close(final, model.forward_features(x))
    normed = model.forward_intermediates(
        x, indices=1, norm=True, output_fmt="NLC", intermediates_only=True
    )
    torch.testing.assert_close(
        normed[0], final[:, 1:9]
    )  # last block + norm = the patch part of forward_features
    nchw = model.forward_intermediates(x, indices=1, intermediates_only=True)[0]
    torch.testing.assert_close(
        nchw.flatten(2).transpose(1, 2),
        model.forward_intermediates(x, 1, output_fmt="NLC", intermediates_only=True)[0],
    )
    early = model.forward_intermediates(x, indices=[0], stop_early=True, intermediates_only=True)
    torch.testing.assert_close(early[0], inter[0][0])
    with pytest.raises(ValueError, match="out of range"):
        model.forward_intermediates(x, indices=[5])


def test_get_intermediate_layers_dino_style():
    model = tiny(depth=3)
    x = torch.randn(2, 3, 32, 48)
    ((patches, cls, regs),) = model.get_intermediate_layers(
        x, n=1, reshape=True, return_class_token=True, return_extra_tokens=True
    )
    assert patches.shape == (2, 192, 2, 3) and cls.shape == (2, 192) and regs.shape == (2, 4, 192)
    torch.testing.assert_close(cls, model.forward_features(x)[:, 0])


def test_avg_pool_excludes_cls_and_registers():
    model = tiny(global_pool="avg")
    feats = torch.randn(2, 1 + 4 + 4, 192)
    torch.testing.assert_close(model.forward_head(feats, pre_logits=True), feats[:, 1:5].mean(1))


def test_timm_registry_optimizer_and_feature_wrapper():
    model = timm.create_model("vit5_tiny", depth=2, img_size=32, num_classes=3)
    assert isinstance(model, vit5.ViT5) and model(torch.randn(1, 3, 32, 32)).shape == (1, 3)
    opt = timm.optim.create_optimizer_v2(
        model, "adamw", lr=1e-3, weight_decay=0.05, layer_decay=0.75
    )
    scales = {g["lr_scale"] for g in opt.param_groups}
    assert len(scales) == 4  # stem, 2 blocks, head/norm: timm's layer decay reads group_matcher
    decayed = {id(p) for g in opt.param_groups if g["weight_decay"] > 0 for p in g["params"]}
    names = {id(p): n for n, p in model.named_parameters()}
    no_decay = sorted(names[i] for i in names if i not in decayed)
    assert {
        "pos_embed",
        "cls_token",
        "reg_token",
        "norm.weight",
        "blocks.0.ls1.gamma",
        "blocks.0.attn.q_norm.weight",
        "blocks.0.mlp.fc1.bias",
        "head.bias",
    } <= set(no_decay)
    assert all(names[i].endswith("weight") and "norm" not in names[i] for i in decayed)
    features = timm.create_model(
        "vit5_tiny", depth=3, img_size=32, features_only=True, out_indices=(1, 2)
    )
    assert [f.shape for f in features(torch.randn(1, 3, 32, 48))] == [(1, 192, 2, 3)] * 2
    data_cfg = timm.data.resolve_model_data_config(model)
    assert data_cfg["crop_pct"] == 1.0 and data_cfg["interpolation"] == "bicubic"


def test_reset_classifier_and_grad_checkpointing():
    model = tiny()
    model.reset_classifier(7)
    assert model(torch.randn(1, 3, 32, 32)).shape == (1, 7) and model.cfg.num_classes == 7
    x = torch.randn(2, 3, 32, 32)
    model.train()
    model(x).sum().backward()
    grads = [p.grad.clone() for p in model.parameters()]
    model.zero_grad()
    model.set_grad_checkpointing()
    model(x).sum().backward()
    for a, p in zip(grads, model.parameters()):
        torch.testing.assert_close(p.grad, a)


def test_training_after_inference_mode_evaluation():
    """Tables cached during an inference_mode evaluation must not break the next training step."""
    model = tiny()
    x = torch.randn(2, 3, 32, 32)
    with torch.inference_mode():
        model(x)
    model.train()
    model(x).sum().backward()
    assert model.pos_embed.grad is not None


def test_torch_compile_has_no_graph_breaks():
    model = tiny()
    x = torch.randn(2, 3, 32, 48)
    torch._dynamo.reset()
    compiled = torch.compile(
        model, fullgraph=True, backend="aot_eager"
    )  # fullgraph: a graph break raises
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), model(x))
    model.train()
    compiled(x).sum().backward()


@pytest.mark.parametrize(
    "kwargs,message",
    [
        (dict(embed_dim=100, num_heads=3), "embed_dim 100 is not divisible by num_heads 3"),
        (dict(num_kv_heads=2), "num_heads 3 is not divisible by num_kv_heads 2"),
        (dict(embed_dim=60, num_heads=6), "head_dim divisible by 4"),
        (dict(num_registers=3), "perfect square"),
        (dict(img_size=100), "img_size 100x100 is not a multiple of patch_size 16"),
        (dict(class_token=False), "global_pool='token' needs class_token=True"),
        (
            dict(norm="batchnorm"),
            r"norm = 'batchnorm' has the wrong type: expected one of 'rmsnorm', 'layernorm'",
        ),
        (dict(depth="12"), "depth = '12' has the wrong type: expected int"),
        (
            dict(num_registrs=4),
            "unknown ViT5Config key 'num_registrs': did you mean 'num_registers'",
        ),
    ],
)
def test_config_validation_messages(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        vit5.create_model("vit5_tiny", **kwargs)


def test_every_component_is_switchable():
    plain = tiny(
        rope=False,
        num_registers=0,
        qk_norm=False,
        layer_scale=None,
        norm="layernorm",
        qkv_bias=True,
        mlp="swiglu",
        pre_norm=False,
        ape=False,
        num_kv_heads=1,
        attn_backend="eager",
    )
    assert plain(torch.randn(1, 3, 32, 32)).shape == (1, 5)
    assert (
        plain.rope is None
        and plain.reg_token is None
        and plain.pos_embed is None
        and plain.rope_table((2, 2)) is None
    )
    assert ViT5Config.from_dict(plain.cfg.to_dict()) == plain.cfg
    unknown = vit5.create_model
    with pytest.raises(ConfigError, match="unknown model 'vit5_smal': did you mean vit5_small"):
        unknown("vit5_smal")


def test_rope_table_is_fp32_and_exact_after_a_bf16_cast():
    reference = vit5.create_model("vit5_tiny", depth=1).rope_table((32, 32))
    cast = vit5.create_model("vit5_tiny", depth=1).to(torch.bfloat16)
    got = cast.rope_table((32, 32))
    for name in ("cos", "sin"):
        assert getattr(got, name).dtype == torch.float32
        torch.testing.assert_close(getattr(got, name), getattr(reference, name), rtol=0, atol=0)


def test_saved_config_rebuilds_a_reset_or_pruned_model(tmp_path):
    model = vit5.create_model("vit5_tiny", depth=3, img_size=32, patch_size=8, num_classes=5).eval()
    model.reset_classifier(3, "avg")
    vit5.save_pretrained(model, tmp_path / "avg")
    x = torch.randn(2, 3, 32, 32)
    torch.testing.assert_close(vit5.load_model(tmp_path / "avg").eval()(x), model(x))
    model.prune_intermediate_layers([1])  # keep blocks 0 and 1
    vit5.save_pretrained(model, tmp_path / "pruned")
    assert vit5.load_model(tmp_path / "pruned").cfg.depth == 2
    with pytest.raises(ValueError, match="unknown global_pool 'max'"):
        model.reset_classifier(3, "max")


def test_rescaled_rope_keeps_its_training_grid_when_loaded_at_another_size(tmp_path):
    model = vit5.create_model(
        "vit5_tiny", depth=1, img_size=32, patch_size=8, rope_positions="rescaled"
    ).eval()
    vit5.save_pretrained(model, tmp_path / "m")
    moved = vit5.load_model(tmp_path / "m", img_size=64).eval()
    assert moved.cfg.rope_ref_grid == (4, 4)
    x = torch.randn(1, 3, 64, 64)
    model.set_input_size(64)
    torch.testing.assert_close(moved(x), model(x))


def test_ape_resampling_is_timms_with_antialiasing_only_when_shrinking():
    """Ours equals timm's resample_abs_pos_embed without antialiasing when enlarging (the official
    fine-tuning resize) and with it when shrinking; timm's default antialiases both ways."""
    from timm.layers import resample_abs_pos_embed

    from vit5.layers import resample_pos_embed

    pe = torch.randn(1, 14 * 14, 32, generator=torch.Generator().manual_seed(0))
    for new, antialias in (((20, 24), False), ((7, 9), True), ((10, 20), True)):
        expected = resample_abs_pos_embed(
            pe, list(new), (14, 14), num_prefix_tokens=0, antialias=antialias
        )
        torch.testing.assert_close(
            resample_pos_embed(pe, (14, 14), new), expected, rtol=0, atol=1e-6
        )
    timm_default = resample_abs_pos_embed(pe, [20, 24], (14, 14), num_prefix_tokens=0)
    assert (resample_pos_embed(pe, (14, 14), (20, 24)) - timm_default).abs().max() > 0.1

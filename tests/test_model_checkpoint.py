"""Checkpoints: our format round-trips; official ViT-5 and timm weights give the source's logits; loads are
strict."""

import json

import pytest
import torch
import torch.nn.functional as F
from safetensors.torch import save_file
from timm.models.vision_transformer import VisionTransformer

import vit5
from vit5 import CheckpointError
from vit5.errors import InputError
from vit5.reference import OfficialViT5


def randomise(module):
    """Give norms and LayerScale non-trivial values so a wrong mapping cannot pass."""
    with torch.no_grad():
        for name, p in module.named_parameters():
            if "norm" in name or "gamma" in name:
                p.uniform_(0.5, 1.5)
    return module.eval()


def official(**kw):
    base = dict(img_size=64, embed_dim=96, depth=2, num_heads=3, num_classes=7)
    return randomise(OfficialViT5(**{**base, **kw}))


def save_official(model, path, **extra):
    torch.save({"model": model.state_dict(), "epoch": 3, **extra}, path)
    return path


def test_official_checkpoint_gives_official_logits(tmp_path):
    ref = official()
    path = save_official(ref, tmp_path / "vit5.pth")
    model = vit5.load_model(path).eval()
    x = torch.randn(2, 3, 64, 64)
    torch.testing.assert_close(model(x), ref(x), rtol=1e-4, atol=1e-4)
    assert model.cfg.num_registers == 4 and model.cfg.rope and model.cfg.norm == "rmsnorm"
    assert (
        len(model.load_report.dropped) == 4
    )  # 2 blocks x (rope, rope_reg) buffers verified then dropped
    by_name = vit5.create_model(
        "vit5_tiny", pretrained=path, embed_dim=96, depth=2, num_heads=3, num_classes=7, img_size=64
    )
    torch.testing.assert_close(by_name.eval()(x), ref(x), rtol=1e-4, atol=1e-4)


def test_official_deit3_baseline_checkpoint(tmp_path):
    ref = official(rmsnorm=False, rope=False, num_registers=0, qk_norm=False, qkv_bias=True)
    path = save_official(ref, tmp_path / "deit.pth")
    with pytest.raises(
        CheckpointError, match="pass num_heads"
    ):  # 96 wide, no QK-Norm: heads are ambiguous
        vit5.load_model(path)
    model = vit5.load_model(path, num_heads=3).eval()
    assert model.cfg.norm == "layernorm" and not model.cfg.rope and model.cfg.qkv_bias
    x = torch.randn(2, 3, 64, 64)
    torch.testing.assert_close(model(x), ref(x), rtol=1e-4, atol=1e-4)


def test_official_checkpoint_at_a_new_resolution_resamples_the_ape(tmp_path):
    ref = official()
    path = save_official(ref, tmp_path / "vit5.pth")
    model = vit5.load_model(path, img_size=96)
    assert any("4x4 -> 6x6" in r for r in model.load_report.resampled)
    grid = ref.pos_embed.detach().reshape(1, 4, 4, 96).permute(0, 3, 1, 2)
    expected = (
        F.interpolate(grid, size=(6, 6), mode="bicubic", align_corners=False)
        .permute(0, 2, 3, 1)
        .reshape(1, 36, 96)
    )
    torch.testing.assert_close(model.pos_embed.detach(), expected)
    # the official fine-tuning recipe: build at 96 and load the interpolated APE; logits agree
    ref96 = official(img_size=96)
    sd = {**ref.state_dict(), "pos_embed": expected}
    ref96.load_state_dict(sd)
    x = torch.randn(1, 3, 96, 96)
    torch.testing.assert_close(model.eval()(x), ref96(x), rtol=1e-4, atol=1e-4)


def test_official_rope_buffers_are_verified(tmp_path):
    ref = official()
    sd = ref.state_dict()
    sd["blocks.0.attn.rope_reg.freqs"] = sd[
        "blocks.0.attn.rope.freqs"
    ]  # theta 1e4 where 100 belongs
    torch.save({"model": sd}, tmp_path / "bad.pth")
    with pytest.raises(CheckpointError, match="register_rope_theta"):
        vit5.load_model(tmp_path / "bad.pth")


def timm_vit(**kw):
    base = dict(
        img_size=64, patch_size=16, embed_dim=96, depth=2, num_heads=3, num_classes=7, qkv_bias=True
    )
    return randomise(VisionTransformer(**{**base, **kw}))


@pytest.mark.parametrize(
    "kwargs",
    [
        dict(no_embed_class=True, init_values=1e-4),  # DeiT-III (timm deit3_*)
        dict(),  # the 2020 ViT: APE with a CLS row, no LayerScale
        dict(
            reg_tokens=4, no_embed_class=True, init_values=1e-4
        ),  # registers, [CLS | regs | patches] in timm
    ],
)
def test_timm_vision_transformer_checkpoint_gives_timm_logits(tmp_path, kwargs):
    ref = timm_vit(**kwargs)
    torch.save(ref.state_dict(), tmp_path / "timm.pth")
    model = vit5.load_model(tmp_path / "timm.pth", num_heads=3).eval()
    x = torch.randn(2, 3, 64, 64)
    torch.testing.assert_close(model(x), ref(x), rtol=1e-4, atol=1e-4)


def test_timm_deit3_loads_into_the_deit3_preset(tmp_path):
    ref = timm_vit(
        embed_dim=192,
        depth=12,
        num_heads=3,
        no_embed_class=True,
        init_values=1e-4,
        num_classes=1000,
    )
    torch.save({"state_dict": ref.state_dict()}, tmp_path / "deit3_tiny.pth")
    model = vit5.create_model(
        "deit3_tiny", pretrained=tmp_path / "deit3_tiny.pth", img_size=64
    ).eval()
    x = torch.randn(1, 3, 64, 64)
    torch.testing.assert_close(model(x), ref(x), rtol=1e-4, atol=1e-4)


def test_our_format_round_trips_with_ema(tmp_path):
    model = vit5.create_model("vit5_tiny", depth=2, img_size=32, num_classes=4).eval()
    ema = {k: v + 1 for k, v in model.state_dict().items()}
    vit5.save_pretrained(model, tmp_path / "run", ema_state_dict=ema, extra={"epoch": 2})
    assert json.loads((tmp_path / "run" / "config.json").read_text())["epoch"] == 2
    loaded = vit5.load_model(tmp_path / "run").eval()
    x = torch.randn(2, 3, 32, 48)
    torch.testing.assert_close(loaded(x), model(x), rtol=0, atol=0)
    assert loaded.cfg == model.cfg
    ema_model = vit5.load_model(tmp_path / "run", use_ema=True)
    torch.testing.assert_close(ema_model.cls_token, model.cls_token + 1)


def test_a_training_checkpoint_of_a_run_without_models_yet_names_resume(tmp_path):
    """A run stopped before its first validation has checkpoints but no best/ or final/ yet."""
    checkpoint = tmp_path / "run" / "checkpoints" / "ckpt-000000005"
    checkpoint.mkdir(parents=True)
    (checkpoint / "checkpoint.json").write_text("{}")
    model = vit5.create_model("vit5_tiny", depth=1, img_size=32, num_classes=4)
    save_file(model.state_dict(), checkpoint / "model.safetensors")
    resume = f"`vit5 train --resume {tmp_path / 'run'}` continues it"
    for given in (checkpoint, checkpoint.parent):
        with pytest.raises(
            CheckpointError, match="not a model folder, and its run .* no model folder yet"
        ) as err:
            vit5.load_model(given)
        assert str(err.value).endswith(resume)


def test_asking_a_folder_without_ema_for_its_ema_names_the_raw_weights_as_the_fix(tmp_path):
    model = vit5.create_model("vit5_tiny", depth=1, img_size=32, num_classes=4)
    vit5.save_pretrained(model, tmp_path / "run")
    with pytest.raises(
        CheckpointError, match=r"holds no EMA weights .*--weights raw.*use_ema=False"
    ):
        vit5.load_model(tmp_path / "run", use_ema=True)
    (tmp_path / "run" / "model.safetensors").unlink()  # no weights at all: not a checkpoint
    with pytest.raises(CheckpointError, match="not a vit5 checkpoint directory"):
        vit5.load_model(tmp_path / "run", use_ema=True)


def test_a_training_run_directory_loads_its_final_checkpoint(tmp_path):
    final = vit5.create_model("vit5_tiny", depth=1, img_size=32, num_classes=4).eval()
    best = vit5.create_model("vit5_tiny", depth=1, img_size=32, num_classes=4).eval()
    vit5.save_pretrained(best, tmp_path / "run" / "best")
    vit5.save_pretrained(final, tmp_path / "run" / "final")
    (
        tmp_path / "run" / "checkpoints"
    ).mkdir()  # a run's other folders are not checkpoint directories
    x = torch.randn(1, 3, 32, 32)
    torch.testing.assert_close(vit5.load_model(tmp_path / "run")(x), final(x), rtol=0, atol=0)
    (tmp_path / "run" / "final" / "config.json").rename(tmp_path / "run" / "final" / "config.old")
    vit5.save_pretrained(final, tmp_path / "run" / "last")
    with pytest.raises(InputError, match="several checkpoint directories, pick one"):
        vit5.load_model(tmp_path / "run")


def test_new_head_for_fine_tuning_and_clear_head_mismatch(tmp_path):
    model = vit5.create_model("vit5_tiny", depth=2, img_size=32, num_classes=4)
    vit5.save_pretrained(model, tmp_path / "run")
    tuned = vit5.create_model("vit5_tiny", pretrained=tmp_path / "run", num_classes=9)
    assert tuned.head.weight.shape == (9, 192) and tuned.load_report.reset == [
        "head.weight",
        "head.bias",
    ]
    torch.testing.assert_close(tuned.blocks[1].mlp.fc2.weight, model.blocks[1].mlp.fc2.weight)
    torch.save(model.state_dict(), tmp_path / "sd.pth")
    with pytest.raises(
        CheckpointError,
        match=r"head.weight: checkpoint \(4, 192\) vs model \(1000, 192\)[\s\S]*num_classes=4",
    ):
        vit5.create_model("vit5_tiny", pretrained=tmp_path / "sd.pth", depth=2, img_size=32)


def test_mismatched_architecture_lists_keys(tmp_path):
    model = vit5.create_model("vit5_tiny", depth=2, img_size=32, num_classes=4)
    torch.save(model.state_dict(), tmp_path / "sd.pth")
    with pytest.raises(CheckpointError) as err:
        vit5.create_model(
            "vit5_tiny",
            pretrained=tmp_path / "sd.pth",
            depth=3,
            img_size=32,
            num_classes=4,
            qk_norm=False,
        )
    text = str(err.value)
    assert "missing (" in text and "blocks.2.attn.qkv.weight" in text
    assert "unexpected (" in text and "blocks.0.attn.q_norm.weight" in text


def test_pickled_code_is_never_executed(tmp_path):
    marker = tmp_path / "pwned"

    class Evil:
        def __reduce__(self):
            return (open, (str(marker), "w"))

    torch.save({"model": {"w": torch.zeros(1)}, "payload": Evil()}, tmp_path / "evil.pth")
    with pytest.raises(CheckpointError, match="io.open.*refuses to execute"):
        vit5.load_model(tmp_path / "evil.pth")
    assert not marker.exists()


def test_bad_files_fail_clearly(tmp_path):
    (tmp_path / "junk.safetensors").write_bytes(b"not a safetensors file")
    with pytest.raises(CheckpointError, match="not a readable safetensors"):
        vit5.load_model(tmp_path / "junk.safetensors")
    (tmp_path / "junk.pth").write_bytes(b"\x00" * 10)
    with pytest.raises(CheckpointError, match="not a readable PyTorch checkpoint"):
        vit5.load_model(tmp_path / "junk.pth")
    with pytest.raises(CheckpointError, match="does not exist"):
        vit5.load_model(tmp_path / "missing")
    with pytest.raises(
        CheckpointError,
        match=r"vit5_tiny has no released weights \(released: vit5_small_patch16_224.in1k",
    ):
        vit5.create_model("vit5_tiny", pretrained=True)
    (tmp_path / "empty_dir").mkdir()
    with pytest.raises(CheckpointError, match="needs config.json"):
        vit5.load_model(tmp_path / "empty_dir")


# ------------------------------------------------------------------ another patch size (FlexiViT)
def resize_matrix(old: int, new: int, mode: str, antialias: bool) -> torch.Tensor:
    """The image resize ``old x old -> new x new`` as a matrix (float64): column ``i`` is the
    resized ``i``-th basis patch, computed with ``F.interpolate`` as the data pipeline resizes."""
    basis = torch.eye(old * old, dtype=torch.float64).reshape(-1, 1, old, old)
    resized = F.interpolate(basis, size=(new, new), mode=mode, antialias=antialias)
    return resized.reshape(old * old, new * new).T


def pseudo_inverse_resample(kernel: torch.Tensor, new: int, mode: str, antialias: bool):
    """FlexiViT's PI-resize (arXiv 2212.08013, eq. 4): ``w_new = pinv(B^T) w`` with ``B`` the
    image resize, written out in float64 apart from timm."""
    old = kernel.shape[-1]
    b = resize_matrix(old, new, mode, antialias)
    flat = kernel.double().reshape(-1, old * old).T
    return (torch.linalg.pinv(b.T) @ flat).T.reshape(*kernel.shape[:2], new, new)


def embed(kernel: torch.Tensor, patch: torch.Tensor) -> torch.Tensor:
    """The linear patch embedding of one patch per batch row: ``<patch, kernel>`` per output."""
    return torch.einsum("bchw,ochw->bo", patch.double(), kernel.double())


def test_a_patch_embedding_is_resampled_by_timms_pseudo_inverse(tmp_path):
    """16 -> 8 as the loader does it (bicubic, antialiased: timm's defaults) equals timm's function
    applied by hand and the pseudo-inverse written out here."""
    from timm.layers import resample_patch_embed

    model = vit5.create_model("vit5_tiny", depth=1, img_size=64, patch_size=16, num_classes=3)
    kernel = model.patch_embed.proj.weight.detach()
    vit5.save_pretrained(model, tmp_path / "p16")
    loaded = vit5.load_model(tmp_path / "p16", patch_size=8, img_size=32)
    got = loaded.patch_embed.proj.weight.detach()
    torch.testing.assert_close(got, resample_patch_embed(kernel, [8, 8]), rtol=0, atol=0)
    by_hand = pseudo_inverse_resample(kernel, 8, "bicubic", antialias=True).float()
    torch.testing.assert_close(got, by_hand, rtol=1e-4, atol=1e-6)
    report = str(loaded.load_report)
    assert "patch_embed.proj.weight 16x16 -> 8x8" in report and "pseudo-inverse" in report
    assert "pos_embed 4x4 -> 4x4" not in report  # the same 4x4 grid: the APE is kept


def test_the_resampled_kernel_gives_the_original_token_on_the_resized_patch():
    """The pseudo-inverse property (FlexiViT sec. 3.4): ``<B x, w_new> = <x, w>``. Growing the patch
    (8 -> 16) it holds for every patch; shrinking it (16 -> 8) for every patch the resize keeps
    whole (``x = B^T y``), and ``w_new`` is the least-squares best elsewhere."""
    from timm.layers import resample_patch_embed

    torch.manual_seed(0)
    kernel = torch.randn(6, 3, 8, 8)
    grown = resample_patch_embed(kernel, [16, 16], interpolation="bilinear", antialias=False)
    x = torch.rand(32, 3, 8, 8)
    resized = F.interpolate(x.double(), size=(16, 16), mode="bilinear", antialias=False)
    expected = embed(kernel, x)
    # timm resamples in float32: its rounding scales with the tokens (up to about 20 here), so the
    # tolerance is relative to the largest one, not absolute at 1e-5
    scale = expected.abs().max().item()
    torch.testing.assert_close(embed(grown, resized), expected, rtol=1e-5, atol=1e-5 * scale)

    big = torch.randn(6, 3, 16, 16)
    shrunk = resample_patch_embed(big, [8, 8], interpolation="bilinear", antialias=False)
    b = resize_matrix(16, 8, "bilinear", antialias=False)
    kept = (torch.rand(32 * 3, 64, dtype=torch.float64) @ b).reshape(32, 3, 16, 16)
    small = F.interpolate(kept, size=(8, 8), mode="bilinear", antialias=False)
    torch.testing.assert_close(embed(shrunk, small), embed(big, kept), rtol=1e-5, atol=1e-5)
    residual = big.double().reshape(-1, 256).T - b.T @ shrunk.double().reshape(-1, 64).T
    assert (b @ residual).abs().max() < 1e-5  # the normal equations of the least-squares fit


def resize_each_patch(images: torch.Tensor, patch: int, new: int) -> torch.Tensor:
    """Every ``patch x patch`` patch of ``images`` resized on its own to ``new x new`` (bicubic)."""
    batch, chans, height, width = images.shape
    rows = height // patch
    cols = width // patch
    tiles = images.unfold(2, patch, patch).unfold(3, patch, patch)  # B C rows cols p p
    tiles = tiles.permute(0, 2, 3, 1, 4, 5).reshape(-1, chans, patch, patch)
    tiles = F.interpolate(tiles, size=(new, new), mode="bicubic", antialias=True)
    tiles = tiles.reshape(batch, rows, cols, chans, new, new).permute(0, 3, 1, 4, 2, 5)
    return tiles.reshape(batch, chans, rows * new, cols * new)


def test_weights_of_another_patch_size_give_the_same_logits_on_the_resized_image(tmp_path):
    """A model at patch 8 loaded at patch 16 with twice the image size (the same 4x4 grid): every
    token is the original one, so the logits are the original model's on the image whose patches
    were each upsampled (bicubic, as the loader's resize)."""
    model = randomise(
        vit5.create_model("vit5_tiny", depth=2, img_size=32, patch_size=8, num_classes=5)
    )
    vit5.save_pretrained(model, tmp_path / "p8")
    grown = vit5.load_model(tmp_path / "p8", patch_size=16, img_size=64).eval()
    x = torch.randn(2, 3, 32, 32)
    upsampled = resize_each_patch(x, patch=8, new=16)
    with torch.no_grad():
        torch.testing.assert_close(grown(upsampled), model(x), rtol=1e-4, atol=1e-4)
    finer = vit5.load_model(tmp_path / "p8", patch_size=4, img_size=32)  # a grid of 8x8
    assert [line.split(" (")[0] for line in finer.load_report.resampled] == [
        "patch_embed.proj.weight 8x8 -> 4x4",
        "pos_embed 4x4 -> 8x8",
    ]


def test_an_override_the_weights_cannot_take_is_named_with_the_fix(tmp_path):
    model = vit5.create_model("vit5_tiny", depth=2, img_size=32, patch_size=8, num_classes=4)
    vit5.save_pretrained(model, tmp_path / "run")
    torch.save(model.state_dict(), tmp_path / "sd.pth")
    fix = r"built with embed_dim=96: the weights hold embed_dim=192\. Drop the override, or set"
    with pytest.raises(vit5.weights.convert.OverrideMismatchError, match=fix) as err:
        vit5.load_model(tmp_path / "run", embed_dim=96, num_heads=3)
    assert err.value.settings == {"embed_dim": (96, 192)}
    assert err.value.dotlist("model.overrides.") == "model.overrides.embed_dim=192"
    with pytest.raises(
        CheckpointError, match=r"built with in_chans=1: the weights hold in_chans=3"
    ):
        vit5.create_model(
            "vit5_tiny",
            pretrained=tmp_path / "sd.pth",
            depth=2,
            img_size=32,
            patch_size=8,
            num_classes=4,
            in_chans=1,
        )

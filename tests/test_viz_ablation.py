"""Register ablation: each replacement puts exactly the intended values in the register slots (both token
orders), and the reported numbers equal direct computations on the model's own outputs."""

import numpy as np
import pytest
import torch
from viz_support import smooth_images, tiny_timm, tiny_vit5

from vit5.errors import InputError
from vit5.eval.probes import knn_accuracy
from vit5.viz import LoadedImage, capture, describe, to_batch
from vit5.viz.register_ablation import (
    AblationConfig,
    ablate_registers,
    ablation_figure,
    register_reference,
    run_ablation,
)

FAMILIES = {"vit5": lambda **kw: tiny_vit5(**kw), "timm": lambda **kw: tiny_timm(**kw)}


def _model(family: str, depth: int = 2, **kw):
    torch.manual_seed(0)
    return FAMILIES[family](depth=depth, **kw)


def _registers(model, images, **ablation) -> dict[int, torch.Tensor]:
    """Register tokens of every block output ``[B, R, C]``, recorded with capture (ablated inside the
    context)."""
    info = describe(model)
    layout = info.layout(images[0].rgb.shape[:2])
    x = to_batch(images, info.mean, info.std)
    with torch.no_grad(), capture(model, attention=False) as rec:
        if ablation:
            with ablate_registers(model, **ablation):
                model.forward_features(x)
        else:
            model.forward_features(x)
    return {i: layout.registers(t) for i, t in rec.tokens.items()}


@pytest.mark.parametrize("family", FAMILIES)
def test_zeros_and_mean_put_exactly_those_values_after_every_block(family):
    model, images = _model(family), smooth_images(4)
    plain = _registers(model, images)
    reference = register_reference(model, images)
    for (
        block,
        regs,
    ) in plain.items():  # position block + 1 holds block's output mean over the images
        torch.testing.assert_close(reference[block + 1], regs.mean(dim=0))
    torch.testing.assert_close(
        reference[0], model.reg_token[0].detach()
    )  # input registers: the learned tokens
    for regs in _registers(model, images, method="zeros", place="blocks").values():
        assert regs.abs().max() == 0
    for block, regs in _registers(
        model, images, method="mean", place="blocks", reference=reference
    ).items():
        torch.testing.assert_close(regs, plain[block].mean(dim=0).expand_as(regs))


@pytest.mark.parametrize("family", FAMILIES)
def test_shuffle_and_noise_after_a_single_block(family):
    model, images = _model(family, depth=1), smooth_images(4)
    plain = _registers(model, images)[0]
    shuffled = _registers(model, images, method="shuffle", place="blocks")[0]
    torch.testing.assert_close(
        shuffled, plain[[3, 0, 1, 2]]
    )  # image b gets image b - 1's registers
    noisy = _registers(model, images, method="noise", place="blocks", seed=3)[0]
    torch.testing.assert_close(noisy.norm(dim=-1), plain.norm(dim=-1))  # norm-matched ...
    assert (
        torch.nn.functional.cosine_similarity(noisy, plain, dim=-1).abs().max() < 0.9
    )  # ... random directions


def test_input_zeros_reach_the_first_block():
    model, images = _model("vit5", depth=1), smooth_images(2)
    seen = {}
    model.blocks[0].register_forward_pre_hook(lambda m, args: seen.__setitem__("x", args[0]))
    info = describe(model)
    with torch.no_grad(), ablate_registers(model, "zeros", "input"):
        model.forward_features(to_batch(images, info.mean, info.std))
    assert (
        seen["x"][:, -4:].abs().max() == 0 and seen["x"][:, :-4].abs().min() >= 0
    )  # vit5: registers last
    assert seen["x"][:, 1].abs().max() > 0


def _labelled(count: int) -> list[LoadedImage]:
    return [LoadedImage(img.name, img.rgb, i % 3) for i, img in enumerate(smooth_images(count))]


def test_report_numbers_equal_direct_computations():
    model = _model("vit5", num_classes=3)
    with torch.no_grad():
        model.head.weight.normal_(0, 1.0)  # a head whose argmax varies between images
    images, reference = _labelled(6), _labelled(12)[6:]
    report = run_ablation(
        model, images, reference, "tiny", AblationConfig(knn_k=3, methods=("zeros", "mean"))
    )
    info = describe(model)
    x, x_ref = (to_batch(imgs, info.mean, info.std) for imgs in (images, reference))
    labels, ref_labels = np.array([i.label for i in images]), np.array([i.label for i in reference])

    def direct(ablation=None):
        with torch.no_grad():
            if ablation:
                with ablate_registers(
                    model, *ablation, reference=register_reference(model, reference)
                ):
                    tokens, tokens_ref = model.forward_features(x), model.forward_features(x_ref)
            else:
                tokens, tokens_ref = model.forward_features(x), model.forward_features(x_ref)
        return tokens, tokens_ref

    base, base_ref = direct()
    for row in report.rows:
        tokens, tokens_ref = (
            direct((row.method, row.place)) if row.method != "none" else (base, base_ref)
        )
        top1 = (model.forward_head(tokens).argmax(-1).numpy() == labels).mean()
        assert row.top1 == pytest.approx(top1)
        pooled, pooled_ref = (
            model.forward_head(t, pre_logits=True).numpy() for t in (tokens, tokens_ref)
        )
        assert row.knn == pytest.approx(knn_accuracy(pooled_ref, ref_labels, pooled, labels, 3))
        cos = torch.nn.functional.cosine_similarity(
            tokens[:, 1:-4].double(), base[:, 1:-4].double(), dim=-1
        ).mean()
        assert row.patch_cosine == pytest.approx(float(cos), abs=1e-6)
    rows = {(r.method, r.place): r for r in report.rows}
    assert rows[("mean", "input")].patch_cosine == pytest.approx(
        1.0, abs=1e-6
    )  # learned constants: no change
    assert rows[("zeros", "blocks")].patch_cosine < 1.0
    assert report.change(rows[("zeros", "blocks")], "top1") == pytest.approx(
        100 * (rows[("zeros", "blocks")].top1 - rows[("none", "-")].top1)
    )
    assert "ABLATED registers of tiny" in ablation_figure(report)._suptitle.get_text()
    assert "top-1 change (pp)" in report.table()


def test_label_free_report_and_errors():
    model = _model("timm")
    report = run_ablation(
        model,
        smooth_images(4),
        smooth_images(4),
        "timm",
        AblationConfig(knn_k=2, places=("blocks",)),
    )
    assert all(r.top1 is None and r.knn is None for r in report.rows)
    assert "no labels" in report.notes[-1] and 0 <= report.rows[1].knn_overlap <= 1
    with (
        pytest.raises(InputError, match="no register tokens"),
        ablate_registers(_model("vit5", num_registers=0), "zeros", "blocks"),
    ):
        pass
    with (
        pytest.raises(InputError, match="needs a reference set"),
        ablate_registers(model, "mean", "blocks"),
    ):
        pass
    info = describe(model)
    with (
        pytest.raises(InputError, match="at least two images"),
        torch.no_grad(),
        ablate_registers(model, "shuffle", "blocks"),
    ):
        model.forward_features(to_batch(smooth_images(1), info.mean, info.std))

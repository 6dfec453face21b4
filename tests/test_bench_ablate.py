"""The ablation runner: every ablation changes exactly what it claims in the model it trains, bad names
fail with a message, the statistics follow their formulas, and a tiny run (2 configs x 2 seeds, one
epoch on a digits subset) writes the report, reuses finished runs and refuses mismatched ones."""

from __future__ import annotations

import dataclasses
import json
import math
from pathlib import Path

import numpy as np
import pytest
import torch
from torch import nn
from torch.utils.data import Subset

from vit5.bench.ablate import (
    ABLATIONS,
    AblationPlan,
    delta,
    delta_text,
    run_ablation,
    select_ablations,
)
from vit5.bench.measure import TimingConfig
from vit5.cli.ablate import main
from vit5.errors import InputError
from vit5.layers import Mlp, RMSNorm, SwiGLU
from vit5.model.presets import preset_config
from vit5.train.data import build_datasets
from vit5.train.modeling import build_model

REPO = Path(__file__).resolve().parent.parent
DEMO = REPO / "configs" / "demo_digits.yaml"
SMALL = ("model.overrides.depth=2", "schedule.epochs=1", "schedule.warmup_epochs=0.2")
TINY = (
    *SMALL,
    "model.img_size=16",
    "model.overrides.embed_dim=48",
    "model.overrides.num_heads=2",
    "data.batch_size=32",
    "run.progress=false",
)

# What each ablation must change in the ViT5Config of the full model, and nothing else (written out
# here independently of the runner's table).
EXPECTED_CHANGES = {
    "full": {},
    "no_layerscale": {"layer_scale": None},
    "no_rope": {"rope": False, "register_rope": False},
    "no_registers": {"num_registers": 0},
    "layernorm": {"norm": "layernorm"},
    "no_qk_norm": {"qk_norm": False},
    "qkv_bias": {"qkv_bias": True},
    "swiglu": {"mlp": "swiglu"},
    "deit3": {
        "norm": "layernorm",
        "qkv_bias": True,
        "rope": False,
        "num_registers": 0,
        "qk_norm": False,
    },
    "vanilla": {
        "norm": "layernorm",
        "qkv_bias": True,
        "rope": False,
        "num_registers": 0,
        "qk_norm": False,
        "layer_scale": None,
        "drop_path_schedule": "linear",
    },
}


@pytest.fixture(autouse=True)
def _one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def _models(tmp_path: Path) -> dict[str, nn.Module]:
    plan = AblationPlan(DEMO, tuple(select_ablations()), (0,), tmp_path, overrides=SMALL)
    return {a.name: build_model(plan.config(a, 0).model, 10)[0] for a in plan.ablations}


def _changed(a: nn.Module, b: nn.Module) -> dict[str, object]:
    fa, fb = dataclasses.asdict(a.cfg), dataclasses.asdict(b.cfg)
    return {k: fa[k] for k in fa if fa[k] != fb[k]}


def test_every_ablation_changes_exactly_what_it_claims(tmp_path):
    assert set(ABLATIONS) == set(EXPECTED_CHANGES)
    models = _models(tmp_path)
    full = models["full"]
    for name, model in models.items():
        assert _changed(model, full) == EXPECTED_CHANGES[name], name

    block, grid = full.blocks[0], full.cfg.grid_size
    assert full.rope is not None and full.rope_reg is not None and full.num_reg_tokens == 4
    assert isinstance(block.norm1, RMSNorm) and isinstance(block.attn.q_norm, RMSNorm)
    assert block.attn.qkv.bias is None and isinstance(block.mlp, Mlp)
    assert not isinstance(block.ls1, nn.Identity)

    assert all(
        isinstance(b.ls1, nn.Identity) and isinstance(b.ls2, nn.Identity)
        for b in models["no_layerscale"].blocks
    )
    no_rope = models["no_rope"]
    assert no_rope.rope is None and no_rope.rope_reg is None and no_rope.rope_table(grid) is None
    tokens = models["no_registers"].forward_features(torch.randn(1, 3, 32, 32))
    assert tokens.shape[1] == 1 + grid[0] * grid[1]  # CLS + patches, no register tokens
    norms = [m for m in models["layernorm"].modules() if isinstance(m, (nn.LayerNorm, RMSNorm))]
    assert norms and all(
        isinstance(m, nn.LayerNorm) for m in norms
    )  # blocks, QK-norm and final norm
    assert all(isinstance(b.attn.q_norm, nn.Identity) for b in models["no_qk_norm"].blocks)
    assert all(b.attn.qkv.bias is not None for b in models["qkv_bias"].blocks)


def test_swiglu_matches_the_gelu_mlp_in_parameters(tmp_path):
    models = _models(tmp_path)
    gelu, swiglu = models["full"].blocks[0].mlp, models["swiglu"].blocks[0].mlp
    assert isinstance(gelu, Mlp) and isinstance(swiglu, SwiGLU)
    count = lambda m: sum(p.numel() for p in m.parameters())  # noqa: E731
    d = models["full"].cfg.embed_dim
    assert count(gelu) == 2 * d * 4 * d + 4 * d + d  # fc1 + fc2 with biases
    assert abs(count(swiglu) / count(gelu) - 1) <= 0.03


def test_deit3_baseline_is_the_deit3_preset(tmp_path):
    deit3 = _models(tmp_path)["deit3"]
    reference = preset_config("deit3_tiny", img_size=32, patch_size=8, depth=2, num_classes=10)
    assert deit3.cfg == reference
    block = deit3.blocks[0]
    assert isinstance(block.norm1, nn.LayerNorm) and block.attn.qkv.bias is not None
    assert deit3.num_reg_tokens == 0 and deit3.rope is None


def test_vanilla_baseline_is_the_vanilla_vit_preset(tmp_path):
    vanilla = _models(tmp_path)["vanilla"]
    reference = preset_config(
        "vanilla_vit_tiny", img_size=32, patch_size=8, depth=2, num_classes=10
    )
    assert vanilla.cfg == reference
    assert isinstance(vanilla.blocks[0].ls1, nn.Identity) and vanilla.rope is None


def test_the_fashion_mnist_scale_scores_the_test_split_of_its_data_root(tmp_path):
    from vit5.cli.ablate import parse_args, plan_from_args

    root = tmp_path / "fm"
    for split in ("train", "val", "test"):
        (root / split).mkdir(parents=True)
    plan = plan_from_args(
        parse_args(["--scale", "fashion_mnist", "--out", str(tmp_path), f"data.root={root}"])
    )
    cfg = plan.config(plan.ablations[0], plan.seeds[0])
    assert plan.seeds == (0, 1, 2) and cfg.schedule.epochs == 1
    assert (
        cfg.data.root == str(root) and cfg.data.val_split == "test" and not cfg.checkpoint.save_best
    )
    assert (
        cfg.model.img_size == 28
        and cfg.model.overrides["patch_size"] == 7
        and cfg.aug.train == "pad_crop"
    )
    trunk = {k: cfg.model.overrides[k] for k in ("embed_dim", "depth", "num_heads")}
    assert trunk == {"embed_dim": 128, "depth": 4, "num_heads": 4}  # the README table's setup
    assert cfg.data.batch_size == 256
    # the full ViT-5 the ablations start from, not the recipe's short-run trunk (no registers,
    # LayerScale 0.1)
    preset = preset_config("vit5_tiny")
    assert cfg.model.overrides["num_registers"] == preset.num_registers == 4
    assert cfg.model.overrides["layer_scale"] == preset.layer_scale == 1e-4


def test_unknown_names_and_owned_settings_fail_with_a_clear_message(tmp_path, capsys):
    with pytest.raises(
        ValueError, match="unknown ablation 'no_rop' \\(did you mean 'no_rope'\\?\\): choose from"
    ):
        select_ablations(["no_rop"])
    assert main(["--only", "no_rope,swigl", "--out", str(tmp_path)]) == 2
    err = capsys.readouterr().err
    assert "did you mean 'swiglu'" in err and "Traceback" not in err
    assert main(["--out", str(tmp_path), "optim.lrr=1"]) == 2
    assert "Did you mean optim.lr?" in capsys.readouterr().err
    with pytest.raises(InputError, match="use --out DIR and --seeds"):
        AblationPlan(DEMO, tuple(select_ablations()), (0,), tmp_path, overrides=("run.seed=3",))
    assert not any(tmp_path.iterdir())  # nothing trained


def test_delta_and_its_standard_error_follow_the_formula():
    a, ref = [97.5, 96.9, 98.1], [95.0, 95.3, 94.9]
    value, se = delta(a, ref)
    expected_se = math.sqrt(np.var(a, ddof=1) / 3 + np.var(ref, ddof=1) / 3)
    assert value == pytest.approx(np.mean(a) - np.mean(ref)) and se == pytest.approx(expected_se)
    assert delta_text(a, ref) == f"{value:+.2f} ± {expected_se:.2f} (>2 SE)"  # beyond the noise
    assert "(>2 SE)" not in delta_text((97.0, 95.0, 96.0), (96.0, 96.5, 95.5))
    assert delta((97.0,), (96.0,))[1] is None and delta_text((97.0,), (96.0,)) == "+1.00"


def _subset(dataset, n: int) -> Subset:
    subset = Subset(dataset, range(n))
    subset.class_names = dataset.class_names  # type: ignore[attr-defined]
    return subset


def test_runner_end_to_end_writes_the_report_and_reuses_finished_runs(tmp_path):
    plan = AblationPlan(
        DEMO,
        tuple(select_ablations(["no_rope"])),
        (0, 1),
        tmp_path / "out",
        overrides=TINY,
        timing_batch=4,
        timing=TimingConfig(warmup=0, rounds=2),
    )
    train_set, val_set, _ = build_datasets(plan.config(plan.ablations[0], 0))
    datasets = (_subset(train_set, 192), _subset(val_set, 96))
    result = run_ablation(plan, datasets, show_progress=False)

    assert [(r.ablation, r.seed, r.completed, r.reused) for r in result.records] == [
        ("full", 0, True, False),
        ("no_rope", 0, True, False),
        ("full", 1, True, False),
        ("no_rope", 1, True, False),
    ]
    out = tmp_path / "out"
    summaries = {
        p.parent.name: json.loads(p.read_text()) for p in (out / "runs").glob("*/summary.json")
    }
    assert set(summaries) == {"full-seed0", "full-seed1", "no_rope-seed0", "no_rope-seed1"}
    assert all(s["val_images"] == 96 for s in summaries.values())
    assert not list(
        (out / "runs").glob("*/checkpoints")
    )  # finished runs keep final/, not checkpoints

    report = json.loads((out / "report.json").read_text())
    accuracy, speed = report["sections"][0]["tables"]
    rows = {row[0]: row for row in accuracy["rows"]}
    full_top1 = [summaries[f"full-seed{s}"]["final_top1"] for s in (0, 1)]
    rope_top1 = [summaries[f"no_rope-seed{s}"]["final_top1"] for s in (0, 1)]
    assert rows["full"][3] == f"{np.mean(full_top1):.2f} ± {np.std(full_top1, ddof=1):.2f}"
    assert rows["no_rope"][4].startswith(f"{np.mean(rope_top1) - np.mean(full_top1):+.2f} ± ")
    assert [row[0] for row in speed["rows"]] == ["full", "no_rope"]
    assert speed["rows"][0][1] == speed["rows"][1][1]  # RoPE has no parameters
    markdown = (out / "report.md").read_text()
    assert markdown.startswith("# vit5 ablation report") and "ViT-5 component ablations" in markdown
    assert (out / "logs" / "full-seed0.log").read_text().count("epoch 1/1") == 1

    again = run_ablation(plan, datasets, show_progress=False)  # a rerun trains nothing
    assert all(r.reused for r in again.records)
    assert [r.final_top1 for r in again.records] == [r.final_top1 for r in result.records]
    longer = dataclasses.replace(plan, overrides=(*TINY, "schedule.epochs=2"))
    with pytest.raises(InputError, match="schedule.epochs: 1 -> 2"):
        run_ablation(longer, datasets, show_progress=False)

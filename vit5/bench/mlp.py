"""Section 8: SwiGLU at hidden 8d/3 against the GELU MLP at 4d: parameters and time.

Three matrices at 8d/3 hold as many weights as two at 4d (Shazeer, 2020); that equal-parameter
pair is the only fair comparison. The toolkit rounds the SwiGLU hidden width up to a multiple
(``swiglu_multiple_of``) and gives GELU its biases (SwiGLU none), so counts are reported exactly,
per layer and for the whole model, with SwiGLU at 4d as the unfair sanity check.
"""

from __future__ import annotations

import torch
from torch import nn

import vit5
from vit5.bench.context import BenchContext
from vit5.bench.models import count_parameters
from vit5.bench.results import Section, Table, Target
from vit5.bench.timing import device_sync, measure, speedup
from vit5.layers import Mlp, SwiGLU, swiglu_hidden_dim


def weight_count(module: nn.Module) -> int:
    """Parameters of the weight matrices only (no biases)."""
    return sum(p.numel() for name, p in module.named_parameters() if name.endswith("weight"))


def build_mlps(dim: int, multiple_of: int = 64) -> dict[str, nn.Module]:
    """GELU at 4d (with biases), SwiGLU at 8d/3 (rounded up, no biases) and SwiGLU at 4d."""
    torch.manual_seed(0)
    return {
        "gelu 4d": Mlp(dim, 4 * dim, bias=True),
        "swiglu 8d/3": SwiGLU(dim, swiglu_hidden_dim(dim, 4.0, multiple_of), bias=False),
        "swiglu 4d": SwiGLU(dim, 4 * dim, bias=False),
    }


def run(ctx: BenchContext) -> Section:
    cfg = ctx.cfg
    b, n, dim = cfg.layer_shape
    mlps = {name: m.to(cfg.device) for name, m in build_mlps(dim).items()}
    x = torch.randn(b, n, dim, generator=torch.Generator().manual_seed(0)).to(cfg.device)
    xg = x.clone().requires_grad_()
    grad = torch.randn_like(x)

    def forward(m: nn.Module):
        def step() -> None:
            with torch.no_grad():
                m(x)

        return step

    def forward_backward(m: nn.Module):
        def step() -> None:
            m(xg).backward(grad)
            m.zero_grad(set_to_none=True)

        return step

    ctx.log("MLPs: forward and forward+backward")
    sync = device_sync(cfg.device)
    fwd = measure({k: forward(m) for k, m in mlps.items()}, cfg.op_timing, sync)
    bwd = measure({k: forward_backward(m) for k, m in mlps.items()}, cfg.op_timing, sync)
    size = cfg.size_for_targets
    depth = {"depth": cfg.depth} if cfg.depth else {}
    whole = {
        kind: count_parameters(vit5.create_model(f"vit5_{size}", mlp=kind, **depth))
        for kind in ("gelu", "swiglu")
    }
    section = Section(
        "mlp",
        "SwiGLU (8d/3) against GELU (4d)",
        f"One MLP on [{b}, {n}, {dim}], {cfg.device} fp32; parameter counts exact. Speed-up is paired, "
        "vs GELU 4d.",
    )
    rows = []
    for name, m in mlps.items():
        rows.append(
            (
                name,
                m.fc2.in_features,
                f"{count_parameters(m):,}",
                f"{weight_count(m):,}",
                f"{1e3 * fwd[name].median:.3f}",
                f"{speedup(fwd[name], fwd['gelu 4d']).median:.2f}x",
                f"{1e3 * bwd[name].median:.3f}",
                f"{speedup(bwd[name], bwd['gelu 4d']).median:.2f}x",
            )
        )
    section.tables.append(
        Table(
            "MLP",
            (
                "mlp",
                "hidden",
                "params",
                "weights",
                "fwd ms",
                "fwd speed-up",
                "fwd+bwd ms",
                "fwd+bwd speed-up",
            ),
            tuple(rows),
        )
    )
    section.tables.append(
        Table(f"Whole model, vit5_{size}", ("mlp", "params"), tuple((k, f"{v:,}") for k, v in whole.items()))
    )
    gap = abs(weight_count(mlps["swiglu 8d/3"]) - weight_count(mlps["gelu 4d"]))
    section.targets.append(
        Target(
            "SwiGLU 8d/3 vs GELU 4d: weight-matrix parameter difference",
            gap,
            0,
            higher_is_better=False,
            unit="params",
        )
    )
    section.notes.append(
        f"Whole vit5_{size}: SwiGLU/GELU parameter ratio {whole['swiglu'] / whole['gelu']:.4f} "
        "(the difference is GELU's biases and the rounding of 8d/3 up to a multiple of 64)."
    )
    section.data = {
        "params": {k: count_parameters(m) for k, m in mlps.items()},
        "weights": {k: weight_count(m) for k, m in mlps.items()},
        "whole_model_params": whole,
        "forward": {k: s.to_dict() for k, s in fwd.items()},
        "forward_backward": {k: s.to_dict() for k, s in bwd.items()},
    }
    return section

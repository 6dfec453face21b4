"""Register ablation at inference (Parodi et al., arXiv 2604.14433, Fig. 1 and their replacement controls):
registers become ``zeros``, their reference-set ``mean``, another image's (``shuffle``: image ``b`` gets
``b - 1``'s) or norm-matched ``noise``, at the ``input`` or after every block (``blocks``); reported: top-1,
kNN accuracy, patch-feature cosine to the unablated model and the label-free kNN overlap."""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from matplotlib.figure import Figure
from torch import nn

from vit5 import plotstyle as S
from vit5.errors import InputError
from vit5.introspect import describe
from vit5.model.vit import unwrap
from vit5.outputs import format_table, write_csv, write_json
from vit5.viz.collect import edit_tokens
from vit5.viz.images import LoadedImage, batches

METHODS = ("zeros", "mean", "shuffle", "noise")
PLACES = ("input", "blocks")
# the printed table's columns, as docs/register-analyses.md writes them
TABLE_HEADER = (
    "method",
    "place",
    "top-1",
    "top-1 change (pp)",
    "kNN",
    "kNN change (pp)",
    "1 - patch cosine",
    "kNN overlap",
)


@contextmanager
def _register_hooks(model: nn.Module, edit) -> Iterator[None]:
    """:func:`edit_tokens` on the registers: ``edit(position, registers [B, R, C])`` may return new ones."""
    info = describe(model)
    if info.num_registers == 0:
        raise InputError(
            f"{info.name} has no register tokens (R=0): register ablation needs a model "
            "with registers (vit5 presets have 4; timm *_reg4_* models)"
        )

    def replace(position: int, x: torch.Tensor, layout) -> torch.Tensor | None:
        new = edit(position, x[:, layout.register_slice])
        if new is None:
            return None
        x = x.clone()
        x[:, layout.register_slice] = new.to(x.dtype)
        return x

    with edit_tokens(model, replace):
        yield


@torch.no_grad()
def register_reference(
    model: nn.Module,
    images: Sequence[LoadedImage],
    batch_size: int = 32,
    device: str = "cpu",
) -> torch.Tensor:
    """Mean ``[depth + 1, R, C]`` of the register tokens over ``images`` at every position: 0 is the input of
    the first block, ``d + 1`` block ``d``'s output."""
    if not images:
        raise InputError("the register reference set is empty")
    total: dict[int, torch.Tensor] = {}

    def accumulate(position: int, registers: torch.Tensor) -> None:
        total[position] = total.get(position, 0) + registers.double().sum(dim=0)

    net = unwrap(model).eval().to(device)
    with _register_hooks(net, accumulate):
        for x in batches(images, describe(net), batch_size, device):
            net.forward_features(x)
    return torch.stack([total[p] / len(images) for p in sorted(total)]).float().cpu()


@contextmanager
def ablate_registers(
    model: nn.Module,
    method: str,
    place: str,
    reference: torch.Tensor | None = None,
    seed: int = 0,
) -> Iterator[None]:
    """Inside this context, ``model``'s registers are replaced by ``method`` at ``place`` (module
    docstring); ``reference``: :func:`register_reference`."""
    # the one check of the names
    AblationConfig(methods=(method,), places=(place,))
    if method == "mean" and reference is None:
        raise InputError(
            f"the {method} ablation needs a reference set (register_reference(model, images))",
        )
    generator = torch.Generator().manual_seed(seed)

    def edit(position: int, registers: torch.Tensor) -> torch.Tensor | None:
        if (place == "input") != (position == 0):
            return None
        if method == "zeros":
            return torch.zeros_like(registers)
        if method == "shuffle":
            if registers.shape[0] < 2:
                raise InputError(
                    "shuffling registers across images needs at least two images per batch",
                )
            return registers.roll(1, dims=0)
        if method == "mean":
            return reference[position].to(registers).expand_as(registers)
        noise = torch.randn(registers.shape, generator=generator).to(registers)
        return F.normalize(noise, dim=-1, eps=1e-12) * registers.norm(dim=-1, keepdim=True)

    with _register_hooks(model, edit):
        yield


@dataclass(frozen=True)
class AblationConfig:
    methods: tuple[str, ...] = METHODS
    places: tuple[str, ...] = PLACES
    knn_k: int = 20
    knn_temperature: float = 0.07
    batch_size: int = 32
    device: str = "cpu"
    seed: int = 0

    def __post_init__(self) -> None:
        bad_methods = [m for m in self.methods if m not in METHODS]
        bad_places = [p for p in self.places if p not in PLACES]
        if bad_methods or bad_places or not self.methods or not self.places:
            raise InputError(
                f"ablation methods come from {', '.join(METHODS)} "
                f"and places from {', '.join(PLACES)}, "
                f"got {list(self.methods)} / {list(self.places)}"
            )
        if self.knn_k < 1 or self.knn_temperature <= 0 or self.batch_size < 1:
            raise InputError("need knn_k >= 1, knn_temperature > 0 and batch_size >= 1")


@dataclass
class Outputs:
    patches: torch.Tensor  # [M, P, C] final patch features
    pooled: torch.Tensor  # [M, C] the head's input (pre-logits)
    logits: torch.Tensor | None  # [M, classes], None without a head


@torch.no_grad()
def model_outputs(
    model: nn.Module,
    images: Sequence[LoadedImage],
    batch_size: int,
    device: str,
) -> Outputs:
    net = unwrap(model).eval().to(device)
    info = describe(model)
    layout = info.layout(images[0].rgb.shape[:2])
    has_head = getattr(net, "num_classes", 0) > 0
    patches = []
    pooled = []
    logits = []
    for x in batches(images, info, batch_size, device):
        tokens = net.forward_features(x)
        patches.append(layout.patches(tokens).float().cpu())
        pooled.append(net.forward_head(tokens, pre_logits=True).float().cpu())
        if has_head:
            logits.append(net.forward_head(tokens).float().cpu())
    return Outputs(
        patches=torch.cat(patches),
        pooled=torch.cat(pooled),
        logits=torch.cat(logits) if has_head else None,
    )


def knn_overlap(
    base_query: torch.Tensor,
    base_bank: torch.Tensor,
    query: torch.Tensor,
    bank: torch.Tensor,
    k: int,
) -> float:
    """Label-free: the mean share of each query's ``k`` nearest bank items (cosine) kept after the change."""
    k = min(k, bank.shape[0])

    def neighbours(q: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
        similarity = F.normalize(q.double(), dim=-1) @ F.normalize(b.double(), dim=-1).T
        return similarity.topk(k, dim=-1).indices

    before = neighbours(base_query, base_bank)
    after = neighbours(query, bank)
    kept = [len(set(x.tolist()) & set(y.tolist())) / k for x, y in zip(before, after)]
    return float(np.mean(kept))


@dataclass
class AblationRow:
    method: str  # "none" for the unablated model
    place: str
    top1: float | None
    knn: float | None
    patch_cosine: float
    knn_overlap: float


@dataclass
class AblationReport:
    model: str
    num_images: int
    num_reference: int
    config: AblationConfig
    rows: list[AblationRow]
    notes: list[str] = field(default_factory=list)

    def change(self, row: AblationRow, metric: str) -> float | None:
        """Accuracy change in percentage points against the unablated model (the first row)."""
        value = getattr(row, metric)
        base = getattr(self.rows[0], metric)
        return None if value is None or base is None else 100.0 * (value - base)

    def records(self) -> list[dict]:
        found = []
        for r in self.rows:
            changes = {
                "top1_change_pp": self.change(r, "top1"),
                "knn_change_pp": self.change(r, "knn"),
            }
            found.append(asdict(r) | changes)
        return found

    def table(self) -> str:
        # accuracy (%) and change (pp)
        def pair(row: AblationRow, metric: str) -> list[str]:
            value = getattr(row, metric)
            change = self.change(row, metric)
            return [
                "n/a" if value is None else f"{100 * value:.1f}",
                "n/a" if change is None else f"{change:+.1f}",
            ]

        lines = []
        for r in self.rows:
            similarity = [f"{1.0 - r.patch_cosine:.2g}", f"{r.knn_overlap:.3f}"]
            lines.append([r.method, r.place, *pair(r, "top1"), *pair(r, "knn"), *similarity])
        notes = "".join(f"\n{n}" for n in self.notes)
        table = format_table(TABLE_HEADER, lines, header_rule=False, label_column=False)
        return (
            f"register ablation of {self.model}: {self.num_images} images, "
            f"reference set {self.num_reference} images{notes}\n{table}"
        )

    def write(self, out: str | Path) -> list[Path]:
        out = Path(out)
        out.mkdir(parents=True, exist_ok=True)
        doc = asdict(self) | {"rows": self.records()}
        return [
            write_json(out / "ablation.json", doc),
            write_csv(out / "ablation.csv", self.records()),
        ]


def _labels(images: Sequence[LoadedImage]) -> np.ndarray | None:
    labels = [img.label for img in images]
    return None if any(label is None for label in labels) else np.asarray(labels)


def run_ablation(
    model: nn.Module,
    images: Sequence[LoadedImage],
    reference: Sequence[LoadedImage],
    label: str,
    cfg: AblationConfig = AblationConfig(),
    notes: Sequence[str] = (),
) -> AblationReport:
    """Every method x place of ``cfg`` on ``images``; ``reference`` images give the register means and the
    kNN bank."""
    from vit5.eval.probes import knn_accuracy

    if not images or not reference:
        raise InputError("register ablation needs images to evaluate and a reference set")
    net = unwrap(model).eval().to(cfg.device)
    ref_stats = register_reference(net, reference, cfg.batch_size, cfg.device)
    labels = _labels(images)
    ref_labels = _labels(reference)
    base = model_outputs(net, images, cfg.batch_size, cfg.device)
    base_ref = model_outputs(net, reference, cfg.batch_size, cfg.device)

    def row(method: str, place: str, out: Outputs, out_ref: Outputs) -> AblationRow:
        top1 = None
        knn = None
        if out.logits is not None and labels is not None:
            top1 = float((out.logits.argmax(-1).numpy() == labels).mean())
        if labels is not None and ref_labels is not None:
            knn = knn_accuracy(
                out_ref.pooled.numpy(),
                ref_labels,
                out.pooled.numpy(),
                labels,
                cfg.knn_k,
                cfg.knn_temperature,
            )
        similarity = F.cosine_similarity(base.patches.double(), out.patches.double(), dim=-1)
        overlap = knn_overlap(base.pooled, base_ref.pooled, out.pooled, out_ref.pooled, cfg.knn_k)
        return AblationRow(
            method=method,
            place=place,
            top1=top1,
            knn=knn,
            patch_cosine=float(similarity.mean()),
            knn_overlap=overlap,
        )

    rows = [row("none", "-", base, base_ref)]
    for place in cfg.places:
        for method in cfg.methods:
            with ablate_registers(net, method, place, ref_stats, cfg.seed):
                ablated = model_outputs(net, images, cfg.batch_size, cfg.device)
                ablated_ref = model_outputs(net, reference, cfg.batch_size, cfg.device)
            rows.append(row(method, place, ablated, ablated_ref))
    if labels is None:
        notes = [*notes, "no labels: top-1 and kNN accuracy not computed (label-free columns only)"]
    return AblationReport(
        model=label,
        num_images=len(images),
        num_reference=len(reference),
        config=cfg,
        rows=rows,
        notes=list(notes),
    )


# title, key of AblationReport.records()
ABLATION_PANELS = (
    ("change in top-1 (pp)", "top1_change_pp"),
    ("change in kNN accuracy (pp)", "knn_change_pp"),
    ("1 - patch-feature cosine to unablated (log)", "patch_cosine"),
    ("kNN overlap with unablated", "knn_overlap"),
)


def ablation_figure(report: AblationReport, dpi: int = S.DPI) -> Figure:
    """Bars per method, grouped by place, in 2 x 2 panels at the text width (:data:`ABLATION_PANELS`); one
    legend below them, each bar labelled with its value, so a zero bar shows as ``0`` on the zero line."""
    fig = Figure(figsize=(S.TEXT_WIDTH, 5.0), dpi=dpi, layout="constrained")
    axes = list(fig.subplots(2, 2).flat)
    places = list(report.config.places)
    methods = list(report.config.methods)
    records = {(r["method"], r["place"]): r for r in report.records()}
    ticks = ["at the input" if p == "input" else "after every block" for p in places]
    width = 0.8 / len(methods)
    for ax, (name, key) in zip(axes, ABLATION_PANELS):
        for m, method in enumerate(methods):
            values = [records[method, place][key] for place in places]
            if key == "patch_cosine":
                values = [1.0 - v for v in values]
            else:
                values = [np.nan if v is None else v for v in values]
            xs = np.arange(len(places)) + (m - (len(methods) - 1) / 2) * width
            bars = ax.bar(xs, values, width, label=method, color=S.model_colour(m))
            ax.bar_label(bars, fmt="%.2g", fontsize=S.FONT_SMALL, padding=1)
        if all(r[key] is None for r in records.values()):
            ax.text(0.5, 0.5, "needs labels", ha="center", va="center", transform=ax.transAxes)
        if key != "patch_cosine":
            ax.axhline(1 if key == "knn_overlap" else 0, color="black", linewidth=0.6)
        elif any(1.0 - r.patch_cosine > 0 for r in report.rows):
            ax.set_yscale("log")
        ax.set_xticks(range(len(places)), ticks)
        S.style_axes(ax, name)
        ax.margins(y=0.15)
    images = f"{report.num_images} images, reference {report.num_reference}"
    title = f"ABLATED registers of {report.model} ({images})"
    fig.suptitle(title, fontsize=S.FONT_TITLE)
    S.finish(fig, report.notes, axes[:1], ncol=len(methods))
    return fig

"""The ablation runner's results as a report section: top-1 over seeds with deltas against the full
model, parameters and throughput, a bar plot of the deltas, and what the numbers can and cannot say.

Statistics are deliberately plain: the mean and sample standard deviation over seeds per config,
and for a delta the standard error of a difference of two means, ``sqrt(s_a²/n_a + s_f²/n_f)``.
A delta larger than 2 SE is flagged as exceeding the seed spread: with three seeds a screen, not a
significance test.
"""

from __future__ import annotations

import math
import statistics
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from vit5.bench.ablations import REFERENCE, Ablation
from vit5.bench.plots import bar_chart
from vit5.bench.results import Section, Table, Target
from vit5.bench.throughput import MODES, ThroughputRun
from vit5.bench.timing import speedup

SWIGLU_PARAM_TOLERANCE_PERCENT = 3.0
FIGURE = "ablation_top1_delta.png"


@dataclass(frozen=True)
class RunRecord:
    """One finished (or diverged) training run, as the tables need it."""

    ablation: str
    seed: int
    run_dir: str
    status: str  # "completed" or "diverged"
    reused: bool = False  # read back from an earlier invocation instead of trained now
    final_top1: float | None = None
    ema_top1: float | None = None
    val_images: int | None = None
    train_images_per_s: float | None = None
    wall_seconds: float = 0.0
    error: str | None = None

    @classmethod
    def from_summary(cls, ablation: str, seed: int, summary: dict[str, Any], reused: bool) -> RunRecord:
        """From a training summary (:meth:`vit5.train.Trainer.fit` / ``summary.json``)."""
        keys = ("final_top1", "ema_top1", "val_images", "train_images_per_s", "wall_seconds")
        return cls(
            ablation, seed, summary["run_dir"], summary["status"], reused, **{k: summary[k] for k in keys}
        )

    @property
    def completed(self) -> bool:
        return self.status == "completed"


@dataclass
class SpeedResult:
    """Parameters of each trained model and, when measured, their side-by-side throughput."""

    params: dict[str, int] = field(default_factory=dict)
    run: ThroughputRun | None = None
    device: str = "cpu"
    dtype: str = "fp32"


# ----------------------------------------------------------------------------------- statistics
@dataclass(frozen=True)
class Spread:
    """Values over seeds: mean and sample standard deviation (None with a single seed)."""

    values: tuple[float, ...]

    @property
    def n(self) -> int:
        return len(self.values)

    @property
    def mean(self) -> float:
        return statistics.fmean(self.values)

    @property
    def std(self) -> float | None:
        return statistics.stdev(self.values) if self.n > 1 else None

    def text(self) -> str:
        return f"{self.mean:.2f}" + (f" ± {self.std:.2f}" if self.std is not None else "")


@dataclass(frozen=True)
class Delta:
    """``mean(variant) - mean(reference)`` and its standard error (None unless both have 2+ seeds)."""

    value: float
    se: float | None

    @classmethod
    def between(cls, variant: Spread, reference: Spread) -> Delta:
        value = variant.mean - reference.mean
        if variant.std is None or reference.std is None:
            return cls(value, None)
        return cls(value, math.sqrt(variant.std**2 / variant.n + reference.std**2 / reference.n))

    @property
    def beyond_noise(self) -> bool:
        """|delta| > 2 SE: larger than the spread between seeds (never, without an SE)."""
        return self.se is not None and abs(self.value) > 2 * self.se

    @property
    def interval(self) -> tuple[float, float]:
        """delta ± 2 SE (the plot's error bar)."""
        half = 2 * (self.se or 0.0)
        return self.value - half, self.value + half

    def text(self, mark: bool = True) -> str:
        """``+0.42 ± 0.10``, marked ``(>2 SE)`` when beyond the seed spread (with ``mark``)."""
        body = f"{self.value:+.2f}" + (f" ± {self.se:.2f}" if self.se is not None else "")
        return body + (" (>2 SE)" if mark and self.beyond_noise else "")


def spreads(records: Sequence[RunRecord], key: str) -> dict[str, Spread]:
    """Per ablation, ``key`` ("final_top1" or "ema_top1") over its completed seeds."""
    values: dict[str, list[float]] = {}
    for r in records:
        value = getattr(r, key)
        if r.completed and value is not None:
            values.setdefault(r.ablation, []).append(float(value))
    return {name: Spread(tuple(v)) for name, v in values.items()}


def deltas(by_name: dict[str, Spread]) -> dict[str, Delta]:
    """Every config's delta against the full model (empty when the full model has no result)."""
    if REFERENCE not in by_name:
        return {}
    return {n: Delta.between(s, by_name[REFERENCE]) for n, s in by_name.items() if n != REFERENCE}


# ------------------------------------------------------------------------------------ section
def build_section(
    ablations: Sequence[Ablation],
    records: Sequence[RunRecord],
    speed: SpeedResult,
    setting: str,
    figures_dir: Path,
    label: str = "",
) -> Section:
    """Tables, notes, the SwiGLU parameter-parity check and the delta plot (under ``figures_dir``)."""
    raw, ema = spreads(records, "final_top1"), spreads(records, "ema_top1")
    section = Section(
        "ablation",
        "ViT-5 component ablations" + (f" ({label})" if label else ""),
        f"{setting}: every config trained with the same data, budget and seeds; top-1 after the last epoch.",
    )
    section.tables += [accuracy_table(ablations, raw, ema, setting), speed_table(ablations, records, speed)]
    val_images = next((r.val_images for r in records if r.val_images), None)
    section.notes += accuracy_notes(ablations, raw, ema, val_images) + speed_notes(speed)
    section.notes += [
        f"FAILED run, left out of the tables: {r.ablation} seed {r.seed}: {r.error}"
        for r in records
        if not r.completed
    ]
    parity = swiglu_parity(speed.params)
    if parity is not None:
        section.targets.append(parity)
    if deltas(raw):
        section.figures.append(delta_plot(ablations, raw, ema, figures_dir / FIGURE, setting))
    section.data = {
        "setting": setting,
        "ablations": {a.name: asdict(a) for a in ablations},
        "runs": [asdict(r) for r in records],
        "top1": {n: {"mean": s.mean, "std": s.std, "values": s.values} for n, s in raw.items()},
        "ema_top1": {n: {"mean": s.mean, "std": s.std, "values": s.values} for n, s in ema.items()},
        "params": speed.params,
        "throughput": speed.run.to_dict() if speed.run is not None else None,
    }
    return section


def accuracy_table(
    ablations: Sequence[Ablation], raw: dict[str, Spread], ema: dict[str, Spread], setting: str
) -> Table:
    raw_d, ema_d = deltas(raw), deltas(ema)
    rows = []
    for a in ablations:
        if a.name not in raw:
            continue
        rows.append(
            (
                a.name,
                a.what,
                raw[a.name].n,
                raw[a.name].text(),
                _delta_cell(raw_d, a.name),
                ema[a.name].text() if a.name in ema else "n/a",
                _delta_cell(ema_d, a.name),
                "-" if a.paper_delta is None else f"{a.paper_delta:+.2f}",
            )
        )
    columns = (
        "ablation",
        "change",
        "seeds",
        "top-1 % (mean ± std)",
        "Δ vs full (± SE)",
        "EMA top-1 %",
        "EMA Δ (± SE)",
        "paper Δ, ImageNet (UNVERIFIED)",
    )
    return Table(f"Top-1: {setting}", columns, tuple(rows))


def _delta_cell(by_name: dict[str, Delta], name: str) -> str:
    return by_name[name].text() if name in by_name else "-"


def speed_table(ablations: Sequence[Ablation], records: Sequence[RunRecord], speed: SpeedResult) -> Table:
    per_run: dict[str, list[float]] = {}
    for r in records:
        if r.completed and r.train_images_per_s:
            per_run.setdefault(r.ablation, []).append(r.train_images_per_s)
    in_runs = {name: statistics.fmean(v) for name, v in per_run.items()}
    rows = []
    for a in ablations:
        if a.name not in speed.params:
            continue
        cells: list[Any] = [a.name, f"{speed.params[a.name]:,}", _ratio(speed.params, a.name, "{:.3f}")]
        cells += (
            [f"{in_runs[a.name]:.0f}", _ratio(in_runs, a.name, "{:.2f}x")]
            if a.name in in_runs
            else ["n/a"] * 2
        )
        for mode in MODES:
            cells += _side_by_side_cells(speed.run, mode, a.name)
        rows.append(tuple(cells))
    columns = (
        "ablation",
        "parameters",
        "vs full",
        "train img/s in runs",
        "vs full",
        "forward img/s",
        "vs full (IQR)",
        "train-step img/s",
        "vs full (IQR)",
    )
    how = f"batch {speed.run.batch} at {speed.run.img_size}px, " if speed.run else ""
    return Table(
        f"Parameters and throughput (side by side: {how}{speed.device} {speed.dtype})", columns, tuple(rows)
    )


def _ratio(values: dict[str, float] | dict[str, int], name: str, fmt: str) -> str:
    if not values.get(REFERENCE):
        return "n/a"
    return fmt.format(values[name] / values[REFERENCE])


def _side_by_side_cells(run: ThroughputRun | None, mode: str, name: str) -> list[str]:
    if run is None or name not in run.samples[mode]:
        return ["n/a", "n/a"]
    samples = run.samples[mode]
    ratio = "n/a"
    if REFERENCE in samples:
        q = speedup(samples[name], samples[REFERENCE])
        ratio = f"{q.median:.2f}x ({q.q1:.2f}-{q.q3:.2f})"
    return [f"{run.images_per_s(mode, name):.0f}", ratio]


def accuracy_notes(
    ablations: Sequence[Ablation], raw: dict[str, Spread], ema: dict[str, Spread], val_images: int | None
) -> list[str]:
    notes = [
        (
            "top-1: validation accuracy after the last epoch, raw and EMA weights (not the best epoch, which "
            "would favour the luckiest run). Δ: difference of the means against the full model, "
            "± SE = sqrt(s_a²/n_a + s_full²/n_full) over seeds."
        ),
        (
            "(>2 SE): the difference exceeds the spread between seeds. With a handful of seeds this is a "
            "screen, not a significance test; without the mark the run cannot tell that config from the "
            "full one."
        ),
    ]
    if val_images:
        notes.append(
            f"One validation image is {100 / val_images:.2f} points ({val_images} images). The paper's "
            "deltas "
            "(third-party readings of Tab. 10, UNVERIFIED: average over S/B/L; DeiT-III: ViT-S at 224) are "
            "0.06-0.8 points on ImageNet-1k (50,000 validation images, hundreds of epochs)."
        )
    for label, by_name in (("raw", raw), ("EMA", ema)):
        found = deltas(by_name)
        if found:
            hits = [
                f"{a.name} ({found[a.name].text(mark=False)})"
                for a in ablations
                if a.name in found and found[a.name].beyond_noise
            ]
            notes.append(f"Beyond the seed spread ({label}): {', '.join(hits) if hits else 'none'}.")
    return notes


def speed_notes(speed: SpeedResult) -> list[str]:
    notes = [
        (
            "train img/s in runs: each run's own training throughput (data, optimizer and EMA included), "
            "measured one run after another, so it drifts with the machine's load."
        )
    ]
    if speed.run is not None:
        notes.append(
            "forward / train-step img/s: the trained models timed side by side on one random batch "
            "(interleaved rounds, vit5.bench.timing); 'vs full' is the paired median speed ratio "
            "(> 1: faster than the full model) with its interquartile range over rounds."
        )
    return notes


def swiglu_parity(params: dict[str, int]) -> Target | None:
    """The SwiGLU swap is fair only if it keeps the parameter count (hidden 8d/3 instead of 4d)."""
    if "swiglu" not in params or REFERENCE not in params:
        return None
    off = 100 * abs(params["swiglu"] / params[REFERENCE] - 1)
    return Target(
        "SwiGLU model's parameters within 3% of the GELU model's (a fair swap)",
        off,
        SWIGLU_PARAM_TOLERANCE_PERCENT,
        higher_is_better=False,
        unit="%",
    )


def delta_plot(
    ablations: Sequence[Ablation], raw: dict[str, Spread], ema: dict[str, Spread], path: Path, setting: str
) -> str:
    """Bars of Δ top-1 (raw and EMA) per ablation with ± 2 SE error bars; returns ``figures/NAME``."""
    raw_d, ema_d = deltas(raw), deltas(ema)
    names = [a.name for a in ablations if a.name in raw_d]
    series, errors = {}, {}
    for label, found in (("raw", raw_d), ("EMA", ema_d)):
        if all(n in found for n in names):
            series[label] = [found[n].value for n in names]
            errors[label] = [found[n].interval for n in names]
    bar_chart(
        path,
        names,
        series,
        errors,
        title=f"Top-1 change vs the full ViT-5\n{setting}",
        ylabel="Δ top-1 (points), ± 2 SE",
        reference_line=0.0,
    )
    return f"{path.parent.name}/{path.name}"

"""``vit5 ablate``: train the ViT-5 component ablations on the same
data, budget and seeds, and tabulate top-1 (raw and EMA, mean and spread over seeds), images/s and parameters.

    vit5 ablate                                                  # digits, 9 configs x 6 seeds, CPU
    vit5 ablate --only no_rope,swiglu --seeds 0 1 --epochs 4
    accelerate launch -m vit5.bench.ablate --scale imagenet data.root=/data/imagenet --epochs 100

The set (:data:`vit5.bench.ablate.ABLATIONS`) is the full ViT-5, each component removed or
swapped (ViT-5, arXiv 2602.08071, Tab. 10) and the DeiT-III baseline. Every run is an ordinary training run
(:class:`vit5.train.Trainer`) under ``OUT/runs/<ablation>-seed<S>``; a rerun into the same ``OUT``
reuses finished runs and resumes interrupted ones from their last checkpoint. Inference and
training-step throughput are then measured side by side (:mod:`vit5.bench.measure`), so their
ratios are fair on a shared machine. Output: ``OUT/report.md``, ``OUT/report.json`` and a bar
plot of the top-1 deltas against the full model with error bars.
"""

from __future__ import annotations

import contextlib
import difflib
import gc
import json
import math
import shutil
import statistics
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch.utils.data import Dataset
from tqdm import tqdm

import vit5
from vit5.bench.config import BenchConfig
from vit5.bench.measure import MODES, ThroughputRun, TimingConfig, measure_throughput, speedup
from vit5.bench.models import count_parameters
from vit5.bench.report import (
    Section,
    Table,
    Target,
    bar_chart,
    environment,
    load_average,
    render_markdown,
    write_report,
)
from vit5.errors import InputError
from vit5.files import atomic_write_text
from vit5.runtime import is_main_process, resolve_device
from vit5.train import ResumeError, TrainConfig, Trainer, TrainingDiverged, load_config
from vit5.train.checkpointing import resolve_resume
from vit5.train.config import config_diff
from vit5.train.rundir import CHECKPOINTS, CONFIG_FILE, FINAL, SUMMARY_JSON


# --------------------------------------------------------------------------------------- ablations
@dataclass(frozen=True)
class Ablation:
    name: str
    what: str
    overrides: tuple[str, ...]  # dotted TrainConfig overrides applied on top of the base config
    paper_delta: float | None = None  # ImageNet top-1 change vs the full ViT-5 (UNVERIFIED)


_M = "model.overrides."  # any ViT5Config field, on top of the base config's model

ABLATIONS: dict[str, Ablation] = {
    a.name: a
    for a in (
        Ablation("full", "ViT-5 as configured: every component", ()),
        Ablation("no_layerscale", "without LayerScale", (f"{_M}layer_scale=null",), -0.29),
        Ablation(
            "no_rope",
            "without 2D RoPE (patches and registers; APE only)",
            (f"{_M}rope=false", f"{_M}register_rope=false"),
            -0.24,
        ),
        Ablation("no_registers", "without the 4 registers", (f"{_M}num_registers=0",), -0.17),
        Ablation(
            "layernorm",
            "LayerNorm instead of RMSNorm (blocks, final and QK-norm)",
            (f"{_M}norm=layernorm",),
            -0.15,
        ),
        Ablation("no_qk_norm", "without QK-norm", (f"{_M}qk_norm=false",), -0.12),
        Ablation("qkv_bias", "with a bias on the qkv projection", (f"{_M}qkv_bias=true",), -0.06),
        Ablation(
            "swiglu",
            "SwiGLU (hidden 8d/3, parameter-matched) instead of the GELU MLP: over-gating",
            (f"{_M}mlp=swiglu",),
            -0.42,
        ),
        Ablation(
            "deit3",
            "the DeiT-III baseline: LayerNorm, qkv bias; no RoPE, registers or QK-norm",
            (
                f"{_M}norm=layernorm",
                f"{_M}qkv_bias=true",
                f"{_M}rope=false",
                f"{_M}num_registers=0",
                f"{_M}qk_norm=false",
            ),
            -0.8,
        ),
    )
}

REFERENCE = "full"  # every delta is against this one


def select_ablations(only: Sequence[str] | None = None) -> list[Ablation]:
    """The ablations to run, in table order: all, or ``only`` plus the full model (the reference).

    Raises:
        ValueError: an unknown name, with the closest valid one and the full list.
    """
    if not only:
        return list(ABLATIONS.values())
    unknown = [name for name in only if name not in ABLATIONS]
    if unknown:
        hints = []
        for name in unknown:
            close = difflib.get_close_matches(name, ABLATIONS, n=1)
            hints.append(f"{name!r}" + (f" (did you mean {close[0]!r}?)" if close else ""))
        raise InputError(f"unknown ablation {', '.join(hints)}: choose from {', '.join(ABLATIONS)}")
    return [a for name, a in ABLATIONS.items() if name == REFERENCE or name in only]


# --------------------------------------------------------------------------------- ablation_report
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
            "(interleaved rounds, vit5.bench.measure); 'vs full' is the paired median speed ratio "
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


# ------------------------------------------------------------------------------------------ ablate
OWNED_KEYS = ("run.output_dir", "run.name", "run.seed")  # set per run from --out and --seeds
TITLE = "vit5 ablation report"


@dataclass(frozen=True)
class Scale:
    """A base recipe and the budget that fits the hardware it is meant for."""

    config: str  # file under configs/
    overrides: tuple[str, ...]
    seeds: tuple[int, ...]
    epochs: int | None  # None: the recipe's
    timing_batch: int
    timing: TimingConfig


SCALES: dict[str, Scale] = {
    # The digits demo (vit5_tiny, 32 px, patch 8) at 6 of its 10 epochs, 6 seeds: 54 runs in about an
    # hour on 2 idle CPU cores; best/ is not kept (the ablation reads the last epoch).
    "digits": Scale(
        "demo_digits.yaml",
        ("checkpoint.save_best=false", "run.progress=false"),
        tuple(range(6)),
        6,
        timing_batch=64,
        timing=TimingConfig(warmup=1, rounds=5),
    ),
    "imagenet": Scale(
        "vit5_small_in1k.yaml",
        ("checkpoint.save_best=false",),
        (0,),
        None,
        timing_batch=128,
        timing=TimingConfig(warmup=3, rounds=10),
    ),
}


@dataclass(frozen=True)
class AblationPlan:
    """What to train and where: ``overrides`` apply to every config, then each ablation's own."""

    base: Path | None  # a training recipe; None: the TrainConfig defaults
    ablations: tuple[Ablation, ...]
    seeds: tuple[int, ...]
    out_dir: Path
    overrides: tuple[str, ...] = ()
    timing_batch: int = 64
    timing: TimingConfig = TimingConfig(warmup=1, rounds=5)
    keep_checkpoints: bool = False  # False: delete a finished run's checkpoints/ (only resume needs them)
    label: str = ""  # e.g. the scale's name, for the report

    def __post_init__(self) -> None:
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise InputError(f"seeds must be distinct and at least one, got {list(self.seeds)}")
        if not any(a.name == REFERENCE for a in self.ablations):
            raise InputError(f"the ablations must include {REFERENCE!r}: every delta is against it")
        owned = [o for o in self.overrides if o.partition("=")[0].strip() in OWNED_KEYS]
        if owned:
            raise InputError(
                f"{', '.join(owned)}: the runner sets run.output_dir, run.name and run.seed itself; "
                f"use --out DIR and --seeds S ... instead"
            )
        if self.timing_batch < 1:
            raise InputError(f"timing_batch must be at least 1, got {self.timing_batch}")

    def run_name(self, ablation: Ablation, seed: int) -> str:
        return f"{ablation.name}-seed{seed}"

    def config(self, ablation: Ablation, seed: int) -> TrainConfig:
        """The training config of one run (validated; a bad override raises TrainConfigError)."""
        per_run = [
            f"run.output_dir={self.out_dir / 'runs'}",
            f"run.name={self.run_name(ablation, seed)}",
            f"run.seed={seed}",
        ]
        return load_config(self.base, [*self.overrides, *ablation.overrides, *per_run])


# ------------------------------------------------------------------------------------ training
def train_run(
    cfg: TrainConfig,
    ablation: str,
    seed: int,
    log: Path,
    datasets: tuple[Dataset, Dataset] | None,
    keep_checkpoints: bool,
) -> RunRecord:
    """Train one run to the end, reuse it when finished before, or resume it from its last checkpoint.

    The run's own output (header, epoch lines, summary) goes to ``log``.
    """
    run_dir = Path(cfg.run.output_dir) / cfg.run.name
    if (run_dir / SUMMARY_JSON).is_file():
        _check_same_config(run_dir, cfg)
        return RunRecord.from_summary(ablation, seed, json.loads((run_dir / SUMMARY_JSON).read_text()), True)
    checkpoint = None
    if run_dir.is_dir():
        try:
            _, checkpoint = resolve_resume(run_dir)
            _check_same_config(run_dir, cfg)
        except ResumeError:  # started but never checkpointed: nothing to keep, start again
            if is_main_process():
                shutil.rmtree(run_dir)
    try:
        summary = _fit(cfg, checkpoint, datasets, log)
    except TrainingDiverged as e:
        return RunRecord(ablation, seed, str(run_dir), "diverged", error=str(e))
    finally:
        _release_memory()
    if not keep_checkpoints and is_main_process():  # fit() ends with every process done with them
        shutil.rmtree(Path(summary["run_dir"]) / CHECKPOINTS, ignore_errors=True)
    return RunRecord.from_summary(ablation, seed, summary, False)


def _fit(
    cfg: TrainConfig, checkpoint: Path | None, datasets: tuple[Dataset, Dataset] | None, log: Path
) -> dict[str, Any]:
    train_set, val_set = datasets if datasets is not None else (None, None)
    log.parent.mkdir(parents=True, exist_ok=True)
    with open(log, "a", buffering=1) as out, contextlib.redirect_stdout(out):  # lines survive a kill
        return Trainer(cfg, resume=checkpoint, train_set=train_set, val_set=val_set).fit()


def _check_same_config(run_dir: Path, cfg: TrainConfig) -> None:
    saved = load_config(run_dir / CONFIG_FILE, check_paths=False)
    changed = [line for line in config_diff(saved, cfg) if not line.startswith("run.progress")]
    if changed:
        raise InputError(
            f"{run_dir} holds a run with other settings ({'; '.join(changed)}), so its result would not be "
            f"comparable; use a new --out, or delete {run_dir} to train it again"
        )


def _release_memory() -> None:
    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def train_all(
    plan: AblationPlan, datasets: tuple[Dataset, Dataset] | None = None, show_progress: bool = True
) -> list[RunRecord]:
    """Every ablation x seed, seed by seed (so load drift on a shared machine hits every config alike
    and a partial run already compares all configs). All configs are checked before the first trains."""
    jobs = [(a, s, plan.config(a, s)) for s in plan.seeds for a in plan.ablations]
    show = show_progress and is_main_process()
    bar = tqdm(jobs, desc="ablation runs", unit="run", disable=not show)
    records = []
    for i, (ablation, seed, cfg) in enumerate(bar, start=1):
        bar.set_postfix_str(f"{ablation.name} seed {seed}")
        log = plan.out_dir / "logs" / f"{plan.run_name(ablation, seed)}.log"
        record = train_run(cfg, ablation.name, seed, log, datasets, plan.keep_checkpoints)
        records.append(record)
        if show:
            bar.write(f"[{i}/{len(jobs)}] {_run_line(record)} (log: {log})")
    return records


def _run_line(r: RunRecord) -> str:
    head = f"{r.ablation} seed {r.seed}"
    if r.status != "completed":
        return f"{head}: {r.status.upper()}: {r.error}"
    how = "reused" if r.reused else f"{r.wall_seconds / 60:.1f} min"
    return (
        f"{head}: top-1 {_pct(r.final_top1)} (EMA {_pct(r.ema_top1)}), "
        f"{r.train_images_per_s:.0f} img/s, {how}"
    )


def _pct(value: float | None) -> str:
    return "n/a" if value is None else f"{value:.2f}%"


# ------------------------------------------------------------------------------------- timing
def measure_speed(
    plan: AblationPlan, records: Sequence[RunRecord], log: Callable[[str], None]
) -> SpeedResult:
    """Parameters of each trained model (its first seed's ``final/``) and forward / training-step
    images/s of all of them side by side, on the device and precision the runs trained with."""
    finals: dict[str, Path] = {}
    for r in records:
        if r.completed:
            finals.setdefault(r.ablation, Path(r.run_dir) / FINAL)
    models = {name: vit5.load_model(path) for name, path in finals.items()}
    cfg = plan.config(plan.ablations[0], plan.seeds[0])
    device = resolve_device("cpu" if cfg.run.cpu else "auto").type
    dtype = "bf16" if cfg.run.mixed_precision == "bf16" else "fp32"
    result = SpeedResult(
        {name: count_parameters(m) for name, m in models.items()}, device=device, dtype=dtype
    )
    if models:
        log(
            f"timing {len(models)} models side by side ({' and '.join(MODES)}, batch {plan.timing_batch}, "
            f"{plan.timing.rounds} rounds, {device} {dtype})"
        )
        num_classes = next(iter(models.values())).cfg.num_classes
        result.run = measure_throughput(
            models, cfg.model.img_size, plan.timing_batch, plan.timing, device, dtype, num_classes=num_classes
        )
    return result


def plan_summary(plan: AblationPlan) -> str:
    """One line for the report: model, resolution, data, epochs and seeds."""
    cfg = plan.config(plan.ablations[0], plan.seeds[0])
    data = "digits" if cfg.data.dataset == "digits" else str(cfg.data.root)
    epochs = cfg.schedule.epochs
    return (
        f"{cfg.model.name} @ {cfg.model.img_size}px on {data}, {epochs} epoch{'s' * (epochs != 1)}, "
        f"seed{'s' * (len(plan.seeds) != 1)} {', '.join(map(str, plan.seeds))}"
    )


@dataclass
class AblationResult:
    records: list[RunRecord]
    section: Section | None = None  # None on processes other than rank 0 (they only train)
    report: Path | None = None


def run_ablation(
    plan: AblationPlan, datasets: tuple[Dataset, Dataset] | None = None, show_progress: bool = True
) -> AblationResult:
    """Train every run (reusing finished ones), time the trained models side by side, write
    ``report.md`` / ``report.json`` / ``figures/`` under ``plan.out_dir``.

    Args:
        datasets: train and val sets to use instead of the config's (they need ``class_names``).
    """
    load_before = load_average()
    records = train_all(plan, datasets, show_progress)
    if not is_main_process():
        return AblationResult(records)
    speed = measure_speed(plan, records, log=print if show_progress else lambda _: None)
    section = build_section(
        plan.ablations, records, speed, plan_summary(plan), plan.out_dir / "figures", plan.label
    )
    env = environment(BenchConfig(device=speed.device, dtype=speed.dtype))
    env.update(
        load_average=load_before,
        base_config=str(plan.base),
        overrides=" ".join(plan.overrides),
        seeds=list(plan.seeds),
        training_minutes=round(sum(r.wall_seconds for r in records if r.completed) / 60, 1),
        load_average_after=load_average(),
    )
    md_path, _ = write_report([section], plan.out_dir, env)
    atomic_write_text(
        md_path, render_markdown([section], env, title=TITLE)
    )  # write_report titles the benchmark
    return AblationResult(records, section, md_path)

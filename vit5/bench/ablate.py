"""``vit5 ablate``: the ViT-5 components removed or swapped one at a time (ViT-5, arXiv 2602.08071,
Tab. 10) and the DeiT-III and vanilla baselines, each an ordinary training run (:class:`vit5.train.Trainer`)
on the same data, budget and seeds under ``OUT/runs/<ablation>-seed<S>`` (a rerun reuses finished runs and
resumes interrupted ones), then timed side by side. Output: ``OUT/report.md`` and ``OUT/report.json``."""

from __future__ import annotations

import contextlib
import gc
import json
import math
import shutil
import statistics
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
from tqdm import tqdm

import vit5
from vit5.bench.measure import TimingConfig
from vit5.bench.report import (
    Section,
    Table,
    Target,
    choose,
    environment,
    load_average,
    write_report,
)
from vit5.bench.speed import measure_throughput, throughput_cells, throughput_columns
from vit5.errors import InputError
from vit5.runtime import is_main_process, resolve_device
from vit5.train import ResumeError, TrainConfig, Trainer, TrainingDiverged, load_config
from vit5.train.checkpointing import resolve_resume
from vit5.train.config import config_diff, recipe_path
from vit5.train.rundir import CHECKPOINTS, CONFIG_FILE, FINAL, SUMMARY_JSON


@dataclass(frozen=True)
class Ablation:
    name: str
    what: str
    overrides: tuple[str, ...]  # dotted TrainConfig overrides applied on top of the base config
    paper_delta: float | None = None  # ImageNet top-1 change vs the full ViT-5 (UNVERIFIED)


_DEIT3 = "norm=layernorm qkv_bias=true rope=false num_registers=0 qk_norm=false"
_TABLE = (  # name, what, ViT5Config settings over the base config's model, paper_delta
    ("full", "ViT-5 as configured: every component", "", None),
    ("no_layerscale", "without LayerScale", "layer_scale=null", -0.29),
    (
        "no_rope",
        "without 2D RoPE (patches and registers; APE only)",
        "rope=false register_rope=false",
        -0.24,
    ),
    ("no_registers", "without the 4 registers", "num_registers=0", -0.17),
    (
        "layernorm",
        "LayerNorm instead of RMSNorm (blocks, final and QK-norm)",
        "norm=layernorm",
        -0.15,
    ),
    ("no_qk_norm", "without QK-norm", "qk_norm=false", -0.12),
    ("qkv_bias", "with a bias on the qkv projection", "qkv_bias=true", -0.06),
    (
        "swiglu",
        "SwiGLU (hidden 8d/3, parameter-matched) instead of the GELU MLP: over-gating",
        "mlp=swiglu",
        -0.42,
    ),
    (
        "deit3",
        "the DeiT-III baseline: LayerNorm, qkv bias; no RoPE, registers or QK-norm",
        _DEIT3,
        -0.8,
    ),
    (
        "vanilla",
        "the vanilla ViT (2020): the DeiT-III baseline without LayerScale, linear drop-path schedule",
        f"{_DEIT3} layer_scale=null drop_path_schedule=linear",
        None,
    ),
)
ABLATIONS: dict[str, Ablation] = {
    name: Ablation(name, what, tuple(f"model.overrides.{s}" for s in settings.split()), paper)
    for name, what, settings, paper in _TABLE
}
REFERENCE = "full"  # every delta is against this one


def select_ablations(only: Sequence[str] | None = None) -> list[Ablation]:
    """All ablations in table order, or ``only`` plus the full model; an unknown name raises InputError."""
    return [ABLATIONS[name] for name in choose("ablation", only and [*only, REFERENCE], ABLATIONS)]


def spread_text(values: Sequence[float]) -> str:
    """Mean ± sample standard deviation over seeds (the mean alone with one seed)."""
    mean = f"{statistics.fmean(values):.2f}"
    return mean + (f" ± {statistics.stdev(values):.2f}" if len(values) > 1 else "")


def delta(variant: Sequence[float], reference: Sequence[float]) -> tuple[float, float | None]:
    """``mean(variant) - mean(reference)`` and its standard error (None unless both have 2+ seeds)."""
    value = statistics.fmean(variant) - statistics.fmean(reference)
    if min(len(variant), len(reference)) < 2:
        return value, None
    return value, math.sqrt(sum(statistics.variance(v) / len(v) for v in (variant, reference)))


def delta_text(variant: Sequence[float], reference: Sequence[float]) -> str:
    """The delta ± its SE, marked ``(>2 SE)`` when beyond the spread between seeds."""
    value, se = delta(variant, reference)
    if se is None:
        return f"{value:+.2f}"
    return f"{value:+.2f} ± {se:.2f}" + (" (>2 SE)" if abs(value) > 2 * se else "")


@dataclass(frozen=True)
class RunRecord:
    """One training run: ``status`` "completed" or "diverged"; ``reused``: read back, not trained now."""

    ablation: str
    seed: int
    run_dir: str
    status: str
    reused: bool = False
    final_top1: float | None = None
    ema_top1: float | None = None
    val_images: int | None = None
    wall_seconds: float = 0.0
    error: str | None = None

    @property
    def completed(self) -> bool:
        return self.status == "completed"

    @classmethod
    def of(cls, ablation: str, seed: int, summary: dict[str, Any], reused: bool) -> RunRecord:
        """From a training summary (:meth:`vit5.train.Trainer.fit` / ``summary.json``)."""
        keys = ("run_dir", "status", "final_top1", "ema_top1", "val_images", "wall_seconds")
        return cls(ablation, seed, reused=reused, **{k: summary[k] for k in keys})


@dataclass(frozen=True)
class Scale:
    """A base recipe and the budget that fits the hardware it is meant for."""

    config: str  # a packaged recipe
    overrides: tuple[str, ...]
    seeds: tuple[int, ...]
    timing_batch: int = 64  # the side-by-side timing of the trained models
    timing: TimingConfig = TimingConfig(warmup=1, rounds=5)


_LAST = ("checkpoint.save_best=false",)  # the ablation reads the last epoch
_NO_BEST = (*_LAST, "run.progress=false")
SCALES: dict[str, Scale] = {
    # the digits demo (vit5_tiny, 32 px, patch 8) at 6 of its 10 epochs: 54 runs, about an hour on 2 cores
    "digits": Scale("demo_digits.yaml", (*_NO_BEST, "schedule.epochs=6"), tuple(range(6))),
    # `vit5 data fashion-mnist DIR`: the CPU recipe (28 px, patch 7) on dim 128, depth 4, batch 256, for one
    # epoch of the 55,000 training images, scored on the test split (30 runs in about an hour on 2 cores)
    "fashion_mnist": Scale(
        "fashion_mnist_cpu.yaml",
        (
            *_NO_BEST,
            "data.val_split=test",
            "schedule.epochs=1",
            "schedule.warmup_epochs=0.1",
            "ema.decay=0.99",
            "data.batch_size=256",
            "aug.train=pad_crop",  # as the README's ablation table was measured
            "optim.name=adamw",
            "model.compile=false",
        )
        + (
            "model.overrides.embed_dim=128",
            "model.overrides.depth=4",
            "model.overrides.num_heads=4",
            # the preset's registers and LayerScale, which the recipe drops for its short run
            "model.overrides.num_registers=4",
            "model.overrides.layer_scale=1.0e-4",
        ),
        (0, 1, 2),
        timing_batch=128,
    ),
    "imagenet": Scale("vit5_small_in1k.yaml", _LAST, (0,), 128, TimingConfig(3, 10)),
}
OWNED_KEYS = ("run.output_dir", "run.name", "run.seed")  # set per run from --out and --seeds


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
    keep_checkpoints: bool = (
        False  # False: delete a finished run's checkpoints/ (only resume needs them)
    )
    label: str = ""  # e.g. the scale's name, for the report

    def __post_init__(self) -> None:
        owned = [o for o in self.overrides if o.partition("=")[0].strip() in OWNED_KEYS]
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise InputError(f"seeds must be distinct and at least one, got {list(self.seeds)}")
        if REFERENCE not in {a.name for a in self.ablations}:
            raise InputError(f"the ablations must include {REFERENCE!r}: every delta is against it")
        if owned:
            raise InputError(
                f"{', '.join(owned)}: the runner sets run.output_dir, run.name and run.seed itself; "
                "use --out DIR and --seeds S ... instead"
            )

    def config(self, ablation: Ablation, seed: int) -> TrainConfig:
        """The training config of one run (validated; a bad override raises TrainConfigError)."""
        run = (f"run.output_dir={self.out_dir / 'runs'}", f"run.name={ablation.name}-seed{seed}")
        return load_config(
            self.base, [*self.overrides, *ablation.overrides, *run, f"run.seed={seed}"]
        )


def plan_for(
    scale: str,
    config: str | None = None,
    seeds: Sequence[int] | None = None,
    epochs: int | None = None,
    only: str | None = None,
    out: str | Path | None = None,
    overrides: Sequence[str] = (),
    keep_checkpoints: bool = False,
) -> AblationPlan:
    """The plan of ``vit5 ablate`` (its options by name): a scale of :data:`SCALES`, its defaults replaced by
    what is given (``only``: comma-separated ablation names); bad input raises InputError."""
    s = SCALES[scale]
    if epochs is not None and epochs < 1:
        raise InputError(f"--epochs must be at least 1, got {epochs}")
    out_dir = Path(out or Path("runs") / f"ablate_{scale}")
    if out_dir.exists() and not out_dir.is_dir():
        raise InputError(f"--out {out_dir} is a file: give a folder for the runs and the report")
    ablations = select_ablations(
        [n.strip() for n in only.split(",") if n.strip()] if only else None
    )
    overrides = (
        *s.overrides,
        *([f"schedule.epochs={epochs}"] if epochs else []),
        *overrides,
    )  # last wins
    base = recipe_path(s.config if config is None else config)  # a missing file: TrainConfigError
    seeds = tuple(s.seeds if seeds is None else seeds)
    return AblationPlan(
        base,
        tuple(ablations),
        seeds,
        out_dir,
        overrides,
        s.timing_batch,
        s.timing,
        keep_checkpoints,
        scale,
    )


def train_run(
    plan: AblationPlan, ablation: Ablation, seed: int, cfg: TrainConfig, datasets: tuple | None
) -> RunRecord:
    """Train one run to the end (its output to ``OUT/logs``), reuse it when finished before, or resume it."""
    run_dir = Path(cfg.run.output_dir) / cfg.run.name
    name = ablation.name
    if (run_dir / SUMMARY_JSON).is_file():
        _check_same_config(run_dir, cfg)
        return RunRecord.of(name, seed, json.loads((run_dir / SUMMARY_JSON).read_text()), True)
    checkpoint = None
    if run_dir.is_dir():
        try:
            _, checkpoint = resolve_resume(run_dir)
            _check_same_config(run_dir, cfg)
        except ResumeError:  # started but never checkpointed: nothing to keep, start again
            if is_main_process():
                shutil.rmtree(run_dir)
    train_set, val_set = datasets or (None, None)
    log = plan.out_dir / "logs" / f"{cfg.run.name}.log"
    log.parent.mkdir(parents=True, exist_ok=True)
    try:
        with (
            open(log, "a", buffering=1) as out,
            contextlib.redirect_stdout(out),
        ):  # lines survive a kill
            summary = Trainer(cfg, resume=checkpoint, train_set=train_set, val_set=val_set).fit()
    except TrainingDiverged as e:
        return RunRecord(name, seed, str(run_dir), "diverged", error=str(e))
    finally:
        gc.collect()
        torch.cuda.empty_cache()  # a no-op without CUDA
    if (
        not plan.keep_checkpoints and is_main_process()
    ):  # fit() ends with every process done with them
        shutil.rmtree(Path(summary["run_dir"]) / CHECKPOINTS, ignore_errors=True)
    return RunRecord.of(name, seed, summary, False)


def _check_same_config(run_dir: Path, cfg: TrainConfig) -> None:
    saved = load_config(run_dir / CONFIG_FILE, check_paths=False)
    changed = [line for line in config_diff(saved, cfg) if not line.startswith("run.progress")]
    if changed:
        raise InputError(
            f"{run_dir} holds a run with other settings ({'; '.join(changed)}), so its result would not be "
            f"comparable; use a new --out, or delete {run_dir} to train it again"
        )


def ablation_section(plan: AblationPlan, records: Sequence[RunRecord], log=print) -> Section:
    """Top-1 and throughput tables and the SwiGLU parameter-parity check."""
    top1: dict[str, dict[str, list[float]]] = {
        "final_top1": {},
        "ema_top1": {},
    }  # over completed seeds
    for r in records:
        for key, found in top1.items():
            if r.completed and getattr(r, key) is not None:
                found.setdefault(r.ablation, []).append(float(getattr(r, key)))
    raw, ema = top1.values()

    def vs_full(found: dict[str, list[float]], name: str) -> str:
        ok = name != REFERENCE and name in found and REFERENCE in found
        return delta_text(found[name], found[REFERENCE]) if ok else "-"

    cfg = plan.config(plan.ablations[0], plan.seeds[0])
    data = "digits" if cfg.data.dataset == "digits" else str(cfg.data.root)
    setting = f"{cfg.model.name} @ {cfg.model.img_size}px on {data}, {cfg.schedule.epochs} epoch(s)"
    rows = tuple(
        (a.name, a.what, len(raw[a.name]), spread_text(raw[a.name]), vs_full(raw, a.name))
        + (spread_text(ema[a.name]) if a.name in ema else "n/a", vs_full(ema, a.name))
        + ("-" if a.paper_delta is None else f"{a.paper_delta:+.2f}",)
        for a in plan.ablations
        if a.name in raw
    )
    columns = (
        "ablation",
        "change",
        "seeds",
        "top-1 % (mean ± std)",
        "Δ vs full (± SE)",
        "EMA top-1 %",
    )
    tables = [
        Table(
            f"Top-1: {setting}", (*columns, "EMA Δ (± SE)", "paper Δ, ImageNet (UNVERIFIED)"), rows
        )
    ]

    # the trained models (each ablation's first completed seed), side by side on one random batch
    finals = {r.ablation: Path(r.run_dir) / FINAL for r in reversed(records) if r.completed}
    models = {a.name: vit5.load_model(finals[a.name]) for a in plan.ablations if a.name in finals}
    params = {name: sum(p.numel() for p in m.parameters()) for name, m in models.items()}
    device = resolve_device("cpu" if cfg.run.cpu else "auto").type
    dtype = "bf16" if cfg.run.mixed_precision == "bf16" else "fp32"
    batch = plan.timing_batch
    how = f"batch {batch} at {cfg.model.img_size}px, {device} {dtype}"
    log(f"timing {len(models)} trained models side by side ({how})")
    run = (
        measure_throughput(models, cfg.model.img_size, batch, plan.timing, device, dtype)
        if models
        else {}
    )
    rows = tuple((n, f"{params[n]:,}", *throughput_cells(run, n, REFERENCE, batch)) for n in models)
    columns = ("ablation", "parameters", *throughput_columns(REFERENCE))
    tables.append(Table(f"Parameters and throughput (side by side: {how})", columns, rows))

    val_images = next((r.val_images for r in records if r.val_images), None)
    notes = [
        "top-1: validation accuracy after the last epoch (not the best epoch, which would favour the "
        "luckiest run), raw and EMA weights. Δ: difference of the means against the full model, ± SE = "
        "sqrt(s_a²/n_a + s_full²/n_full) over seeds; (>2 SE): beyond the spread between seeds, a screen "
        "with a handful of seeds, not a significance test"
        + (f"; one validation image is {100 / val_images:.2f} points." if val_images else "."),
        "img/s: the trained models timed side by side (interleaved rounds); 'x full' is the paired median "
        "speed ratio (> 1: faster than the full model) with its IQR over rounds.",
        *(
            f"FAILED run, left out: {r.ablation} seed {r.seed}: {r.error}"
            for r in records
            if not r.completed
        ),
    ]
    targets = []
    if (
        "swiglu" in params and REFERENCE in params
    ):  # the swap is fair only if it keeps the parameters
        off = 100 * abs(params["swiglu"] / params[REFERENCE] - 1)
        name = "SwiGLU model's parameters within 3% of the GELU model's (a fair swap)"
        targets.append(Target(name, off, 3.0, higher_is_better=False, unit="%"))
    return Section(
        "ablation",
        "ViT-5 component ablations" + (f" ({plan.label})" if plan.label else ""),
        f"{setting}, seeds {', '.join(map(str, plan.seeds))}: every config trained with the same data, "
        "budget and seeds; top-1 after the last epoch.",
        tables,
        targets,
        notes=notes,
        data={"runs": records, "params": params, "throughput": run},
    )


@dataclass
class AblationResult:
    records: list[RunRecord]
    section: Section | None = None  # None on processes other than rank 0 (they only train)
    report: Path | None = None


def run_ablation(plan: AblationPlan, datasets=None, show_progress: bool = True) -> AblationResult:
    """Train every ablation x seed (reusing finished runs), seed by seed: load drift on a shared machine hits
    every config alike, and a partial run already compares all configs; every config is checked before the
    first trains. Then time the trained models side by side and write the report under ``plan.out_dir``.
    ``datasets``: (train, val) sets with ``class_names`` instead of the config's."""
    load_before = load_average()
    jobs = [(a, s, plan.config(a, s)) for s in plan.seeds for a in plan.ablations]
    show = show_progress and is_main_process()
    records = []
    for i, (ablation, seed, cfg) in enumerate(
        tqdm(jobs, desc="ablation runs", disable=not show), start=1
    ):
        records.append(r := train_run(plan, ablation, seed, cfg, datasets))
        how = "reused" if r.reused else f"{r.wall_seconds / 60:.1f} min"
        done = (
            f"top-1 {r.final_top1}, EMA {r.ema_top1}, {how}"
            if r.completed
            else f"{r.status}: {r.error}"
        )
        if show:
            tqdm.write(f"[{i}/{len(jobs)}] {ablation.name} seed {seed}: {done}")
    if not is_main_process():
        return AblationResult(records)
    section = ablation_section(plan, records, log=print if show_progress else lambda _: None)
    env = {**environment(), "load_average": load_before, "base_config": str(plan.base)}
    env.update(overrides=" ".join(plan.overrides), load_average_after=load_average())
    env["training_minutes"] = round(sum(r.wall_seconds for r in records if r.completed) / 60, 1)
    report = write_report([section], plan.out_dir, env, "vit5 ablation report")
    return AblationResult(records, section, report)

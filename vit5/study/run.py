"""The register study (Darcet et al., arXiv 2309.16588, sections 2.1-2.2): two no-CLS, average-pooled
vit5 twins, without and with registers (same init and batches), trained on digit canvases by
:class:`vit5.train.Trainer` (its run in ``<out>/<twin>/run``, resumed from its checkpoints), measured with
:mod:`vit5.viz` at every checkpoint (``trajectory.jsonl``)."""

from __future__ import annotations

import contextlib
import io
import json
import math
import shutil
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import cv2
import numpy as np
import torch
from matplotlib.figure import Figure
from torch.utils.data import IterableDataset

from vit5 import plotstyle as S
from vit5.data.digits.canvases import CanvasBatch, CanvasConfig, CanvasSource
from vit5.errors import InputError
from vit5.files import atomic_write_text
from vit5.model import ConfigError, ViT5, ViT5Config, preset_config
from vit5.outputs import write_json
from vit5.plotstyle import save_figure
from vit5.train import Trainer, TrainingDiverged
from vit5.train.checkpointing import list_checkpoints
from vit5.train.config import (
    AugSection,
    CheckpointSection,
    DataSection,
    EmaSection,
    LossSection,
    ModelSection,
    OptimSection,
    RunSection,
    ScheduleSection,
    TrainConfig,
)
from vit5.train.rundir import CHECKPOINTS
from vit5.viz.artifacts import MetricConfig, MetricReport, compute_metrics
from vit5.viz.collect import CollectConfig, collect
from vit5.viz.images import LoadedImage, to_batch
from vit5.viz.register_ablation import AblationConfig, ablation_figure, model_outputs, run_ablation
from vit5.viz.stats import TokenStats
from vit5.weights import save_pretrained

TWINS = ("no_registers", "registers")
TRAJECTORY_NAME = "trajectory.jsonl"
POSITIVE = (
    "embed_dim",
    "depth",
    "num_heads",
    "registers",
    "steps",
    "batch_size",
    "checkpoint_every",
)
POSITIVE += ("eval_images", "accuracy_images")
RESERVED = {"img_size", "patch_size", "num_classes", "class_token", "global_pool", "num_registers"}


@dataclass(frozen=True)
class StudyConfig:
    """What the twins are, what they learn and how long; validated at construction."""

    canvas: CanvasConfig = field(default_factory=CanvasConfig)
    preset: str = "vit5_tiny"  # architecture family; the sizes below override its sizes
    embed_dim: int = 128
    depth: int = 8
    num_heads: int = 8
    model_args: tuple[
        tuple[str, Any], ...
    ] = ()  # further ViT5Config overrides shared by both twins
    registers: int = 4  # registers of the second twin (the first has none)
    steps: int = 3200
    batch_size: int = 64
    lr: float = 3e-3
    min_lr: float = 1e-5
    weight_decay: float = 0.05
    warmup_steps: int = 100
    grad_clip: float | None = 1.0
    checkpoint_every: int = 400
    eval_images: int = 64  # held-out canvases the metrics are measured on
    accuracy_images: int = 256  # held-out canvases for the accuracy
    seed: int = 0
    threads: int | None = None  # torch CPU threads (None: torch's default)

    def __post_init__(self) -> None:
        object.__setattr__(
            self, "model_args", tuple((str(k), v) for k, v in dict(self.model_args).items())
        )
        clash = sorted(RESERVED & {k for k, _ in self.model_args})
        checks = [
            (getattr(self, name) >= 1, f"{name} must be >= 1, got {getattr(self, name)}")
            for name in POSITIVE
        ]
        checks += [
            (
                0 < self.min_lr <= self.lr,
                f"need 0 < min_lr <= lr, got min_lr={self.min_lr}, lr={self.lr}",
            ),
            (self.weight_decay >= 0, f"weight_decay must be >= 0, got {self.weight_decay}"),
            (self.warmup_steps >= 0, f"warmup_steps must be >= 0, got {self.warmup_steps}"),
            (
                not clash,
                f"model_args may not set {clash}: the study fixes them (canvas, task, twins)",
            ),
        ]
        for ok, message in checks:
            if not ok:
                raise InputError(f"study setting: {message}")
        for twin in TWINS:
            self.model_config(twin)  # fail now on an invalid architecture

    def model_config(self, twin: str) -> ViT5Config:
        """The :class:`ViT5Config` of ``twin``: no CLS, average pooling, 0 or ``registers`` registers."""
        c = self.canvas
        fixed = dict(
            img_size=c.size, patch_size=c.patch_size, num_classes=c.num_outputs, class_token=False
        )
        fixed.update(global_pool="avg", num_registers=0 if twin == TWINS[0] else self.registers)
        sizes = dict(embed_dim=self.embed_dim, depth=self.depth, num_heads=self.num_heads)
        try:
            return preset_config(self.preset, **sizes, **dict(self.model_args), **fixed)
        except ConfigError as err:
            raise InputError(f"study model: {err}") from None

    @property
    def steps_per_epoch(self) -> int:
        """Updates per :class:`~vit5.train.Trainer` epoch: the most that divide both ``steps`` and
        ``checkpoint_every``."""
        return math.gcd(self.steps, self.checkpoint_every)

    def to_dict(self) -> dict[str, Any]:
        return {**asdict(self), "model_args": dict(self.model_args)}


SMOKE = StudyConfig(
    canvas=CanvasConfig(size=(32, 32), patch_size=8, digits=(1, 2), digit_side=(8, 12)),
    embed_dim=32,
    depth=2,
    num_heads=2,
    registers=1,
    steps=6,
    batch_size=8,
    warmup_steps=2,
    checkpoint_every=3,
    eval_images=8,
    accuracy_images=16,
)
# The README study, chosen from pilots (docs/register-analyses.md): the count task learns within a few
# hundred steps, and without QK-norm and LayerScale the twin without registers shows the most sinks.
FULL = StudyConfig(
    canvas=CanvasConfig(
        size=(64, 64),
        patch_size=8,
        digits=(1, 5),
        digit_side=(12, 20),
        background="flat",
        task="count",
    ),
    model_args=(("qk_norm", False), ("layer_scale", None)),
)
PRESETS = {"full": FULL, "smoke": SMOKE}


def build_twins(cfg: StudyConfig) -> dict[str, ViT5]:
    """Both twins with identical initial weights wherever they share a parameter."""
    torch.manual_seed(cfg.seed)
    base = ViT5(cfg.model_config(TWINS[0]))
    twin = ViT5(cfg.model_config(TWINS[1]))
    twin.load_state_dict(base.state_dict(), strict=False)  # all but reg_token
    return dict(zip(TWINS, (base, twin)))


def normalise(images: np.ndarray, model: ViT5) -> torch.Tensor:
    """``[B, H, W, 3]`` uint8 to the model's normalised ``[B, 3, H, W]``, as the recording tools see them."""
    cfg = model.pretrained_cfg
    return to_batch([LoadedImage("", rgb) for rgb in images], cfg["mean"], cfg["std"])


@dataclass
class HeldOut:
    """Held-out canvases: the metric images (with background masks ``[B, h, w]``) and the accuracy set."""

    images: list[LoadedImage]
    background: np.ndarray
    accuracy: CanvasBatch


def labelled(cfg: StudyConfig, batch: CanvasBatch, name: str) -> list[LoadedImage]:
    """``batch`` as images named ``{name}_NNN``, with their labels unless the task is multilabel."""
    labels = (
        [None] * len(batch.images) if cfg.canvas.task == "multilabel" else batch.labels.tolist()
    )
    return [
        LoadedImage(f"{name}_{i:03d}", rgb, y)
        for i, (rgb, y) in enumerate(zip(batch.images, labels))
    ]


def accuracy(model: ViT5, batch: CanvasBatch, task: str) -> float:
    """Share of correct canvases: the class, or (multilabel) every one of the ten presence bits."""
    logits = model_outputs(model, [LoadedImage("", rgb) for rgb in batch.images], 128, "cpu").logits
    labels = torch.from_numpy(batch.labels)
    hits = (
        ((logits > 0).float() == labels).all(-1)
        if task == "multilabel"
        else logits.argmax(-1) == labels
    )
    return float(hits.float().mean())


def study_metrics(report: MetricReport, background: np.ndarray) -> dict[str, list[float | None]]:
    """Per layer: share of images with an outlier patch (``..._background_outliers``: on a background
    patch), share of the outlier patches that are background (``background_rate``: of all patches)."""
    outliers = report.outliers  # [B, L, P]
    bg = background.reshape(background.shape[0], 1, -1)
    total = outliers.sum(axis=(0, 2))
    on_background = (outliers & bg).sum(axis=(0, 2))
    return {
        "images_with_outliers": [float(v) for v in outliers.any(axis=-1).mean(axis=0)],
        "images_with_background_outliers": [
            float(v) for v in (outliers & bg).any(axis=-1).mean(axis=0)
        ],
        "outlier_background_share": [
            float(b / t) if t else None for b, t in zip(on_background, total)
        ],
        "background_rate": [float(bg.mean())] * outliers.shape[1],
    }


def background_sinks(
    stats: TokenStats, background: np.ndarray, eps: float = 0.3
) -> list[float | None]:
    """Per block, the share of the (image, head) pairs whose sink (a key receiving more than ``eps`` of the
    average attention, as :func:`~vit5.viz.artifacts.sink_heads`) is a background patch, among those whose
    sink is a patch at all (None where no head has a patch sink)."""
    patches = stats.patch_values(stats.received)  # [B, L, H, P]
    top = patches.argmax(axis=-1)
    is_sink = patches.max(axis=-1) > eps
    bg = background.reshape(background.shape[0], 1, 1, -1)
    on_background = np.take_along_axis(np.broadcast_to(bg, patches.shape), top[..., None], axis=-1)[
        ..., 0
    ]
    counts = is_sink.sum(axis=(0, 2))
    shares = (on_background & is_sink).sum(axis=(0, 2)) / np.maximum(counts, 1)
    return [float(s) if c else None for s, c in zip(shares, counts)]


def measure(
    model: ViT5, label: str, held: HeldOut, task: str, thresholds: Sequence[float] | None = None
) -> dict[str, Any]:
    """One checkpoint of one twin: tracked metrics per layer with its own default thresholds and, when
    given, with ``thresholds`` (under ``reused``)."""
    stats = collect(model, held.images, label, CollectConfig(batch_size=32, progress=False))

    def metrics(**kwargs: Any) -> tuple[MetricReport, dict[str, Any]]:
        report = compute_metrics(stats, MetricConfig(n_boot=200, **kwargs))
        n = len(report.layers)
        tracked = {k: [_num(v) for v in row["value"][:n]] for k, row in report.summary.items()}
        return report, {"metrics": tracked, **study_metrics(report, held.background)}

    report, record = metrics()
    record = {
        "thresholds": [_num(t) for t in report.thresholds],
        **record,
        "accuracy": accuracy(model, held.accuracy, task),
        "num_tokens": stats.layout.num_tokens,
        "num_registers": stats.layout.num_registers,
        "patch_sinks_on_background": background_sinks(stats, held.background),
    }
    if thresholds is not None:
        record["reused"] = metrics(
            thresholds=tuple(thresholds), threshold_source="no-register twin"
        )[1]
    return record


def _num(x: float | None) -> float | None:
    return None if x is None or not np.isfinite(x) else float(x)


class CanvasStream(IterableDataset):
    """The canvases of ``source`` as :class:`~vit5.train.Trainer` training batches: epoch ``e`` holds
    batches ``e * per_epoch`` on (batch ``i`` is ``source.batch(i, size)``, a pure function of seed
    and index, so the position is exact), normalised for ``model``; ``set_epoch`` places it."""

    def __init__(self, source: CanvasSource, model: ViT5, size: int, per_epoch: int) -> None:
        self.source = source
        self.model = model
        self.size = size
        self.per_epoch = per_epoch
        self.class_names = [str(i) for i in range(source.cfg.num_outputs)]
        self.num_samples = per_epoch * size
        self.set_epoch(0)

    def set_epoch(self, epoch: int, consumed: int = 0) -> None:
        self.end = (epoch + 1) * self.per_epoch
        self.first = epoch * self.per_epoch + consumed // self.size

    def __len__(self) -> int:
        return self.end - self.first

    def __iter__(self) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
        for index in range(self.first, self.end):
            batch = self.source.batch(index, self.size)
            yield normalise(batch.images, self.model), torch.from_numpy(batch.labels)


def train_config(cfg: StudyConfig, folder: Path) -> TrainConfig:
    """A twin's run: AdamW, warmup and cosine over ``steps`` updates, checkpoints (and measures) every
    ``checkpoint_every`` (a multiple of ``steps_per_epoch``)."""
    per_epoch = cfg.steps_per_epoch
    every = cfg.checkpoint_every // per_epoch
    loss = "bce" if cfg.canvas.task == "multilabel" else "soft_ce"
    return TrainConfig(
        # the twin is given; the section names what it is (the height: canvases may not be square)
        model=ModelSection(
            name=cfg.preset,
            img_size=cfg.canvas.size[0],
            overrides=dict(patch_size=cfg.canvas.patch_size),
        ),
        data=DataSection(dataset="digits", batch_size=cfg.batch_size, num_workers=0),
        aug=AugSection(train="none", repeated_aug=1, ra_selected_round=0, mixup=0.0, cutmix=0.0),
        loss=LossSection(name=loss),
        optim=OptimSection(
            name="adamw", lr=cfg.lr, weight_decay=cfg.weight_decay, clip_grad=cfg.grad_clip or None
        ),
        schedule=ScheduleSection(
            epochs=cfg.steps // per_epoch,
            warmup_epochs=cfg.warmup_steps / per_epoch,
            warmup_lr=cfg.min_lr,
            min_lr=cfg.min_lr,
            interval="update",
        ),
        ema=EmaSection(enabled=False),
        checkpoint=CheckpointSection(every_epochs=every, save_best=False),
        run=RunSection(
            output_dir=str(folder),
            seed=cfg.seed,
            mixed_precision="fp32",
            cpu=True,
            eval_every_epochs=every,
            progress=False,
        ),
    )


class Twin:
    """One twin in training: a :class:`~vit5.train.Trainer` run in ``<folder>/run`` over the training
    canvases, continued from its newest checkpoint; measured (``on_validate``) at every checkpoint."""

    def __init__(
        self,
        name: str,
        model: ViT5,
        cfg: StudyConfig,
        folder: Path,
        measure_twin: Callable[[Twin], dict[str, Any]],
    ) -> None:
        self.name = name
        self.model = model
        self.cfg = cfg
        self.folder = folder
        self.measure_twin = measure_twin
        self.trainer: Trainer | None = None
        self.record: dict[str, Any] = {}  # the measures of the last validation

    @property
    def run_dir(self) -> Path:
        return self.folder / "run"

    def start(self) -> bool:
        """Open the twin's run: resumed from its newest checkpoint (True) or new."""
        if (self.folder / "state").is_dir() and not self.run_dir.is_dir():
            raise InputError(
                f"{self.folder} holds a study state of an older vit5 (state/, before the study "
                "trained with vit5.train.Trainer): use another --out, or delete it to start over"
            )
        checkpoints = list_checkpoints(self.run_dir / CHECKPOINTS)
        if not checkpoints:  # killed before its first checkpoint: start again
            shutil.rmtree(self.run_dir, ignore_errors=True)
        cfg = self.cfg
        size = cfg.batch_size
        train_source = CanvasSource(cfg.canvas, "train", cfg.seed)
        train = CanvasStream(train_source, self.model, size, cfg.steps_per_epoch)
        # never read (on_validate measures the twin instead); the header counts it
        val = CanvasStream(CanvasSource(cfg.canvas, "val", cfg.seed), self.model, size, 1)
        with contextlib.redirect_stdout(io.StringIO()):  # the study reports itself
            self.trainer = Trainer(
                train_config(cfg, self.folder),
                resume=checkpoints[-1] if checkpoints else None,
                train_set=train,
                val_set=val,
                model=self.model,
                on_validate=self._validate,
            )
        return bool(checkpoints)

    def _validate(self, model: torch.nn.Module) -> dict[str, Any]:
        self.record = self.measure_twin(self)
        return {}

    @property
    def step(self) -> int:
        return self.trainer.state.num_updates if self.trainer is not None else 0

    @property
    def lr(self) -> float:
        return self.trainer.schedule.lr if self.trainer is not None else math.nan

    def last_loss(self) -> float:
        """The mean training loss of the last epoch trained (NaN before any)."""
        history = self.trainer.state.history if self.trainer is not None else []
        return history[-1]["train_loss"] if history else math.nan

    def train(self, until: int) -> None:
        """Train to step ``until`` (a checkpoint), measured there; then save its weights."""
        try:
            with contextlib.redirect_stdout(io.StringIO()):
                self.trainer.fit(until=until // self.cfg.steps_per_epoch)
        except TrainingDiverged as err:
            raise InputError(
                f"{self.name}: {err} (study setting: lower lr, now {self.cfg.lr:g})"
            ) from None
        extra = {"study_step": self.step, "twin": self.name}
        save_pretrained(
            self.model, self.folder / "checkpoints" / f"step_{self.step:06d}", extra=extra
        )

    def close(self) -> None:
        if self.trainer is not None:
            self.trainer.close()


@dataclass
class StudyResult:
    out: Path
    trajectories: dict[str, list[dict]]
    verdict: dict[str, Any]
    complete: bool
    files: list[Path] = field(default_factory=list)


def run_study(
    cfg: StudyConfig,
    out: str | Path,
    max_minutes: float | None = None,
    progress: bool = True,
    log: Callable[[str], None] = print,
    analyse: bool = True,
    train: bool = True,
) -> StudyResult:
    """Train (or resume) both twins in alternating chunks of ``checkpoint_every`` steps, measuring them at
    every checkpoint; then write the final weights, the trajectory figure, ``verdict.json``, the held-out
    canvases (``heldout/``) and (``analyse``) the register analyses. Stops at the first checkpoint after
    ``max_minutes`` (rerun to continue); ``train=False`` only writes the outputs."""
    from tqdm.auto import tqdm

    out = Path(out)
    _check_same_study(cfg, out)
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    val = CanvasSource(cfg.canvas, "val", cfg.seed)
    metric = val.batch(0, cfg.eval_images)
    held = HeldOut(
        labelled(cfg, metric, "heldout"), metric.background, val.batch(1, cfg.accuracy_images)
    )
    trajectories: dict[str, list[dict]] = {}

    def measure_twin(twin: Twin) -> dict[str, Any]:
        """Measure ``twin`` (the register twin also with its twin's thresholds at the same step)."""
        first = trajectories[TWINS[0]] if twin.name != TWINS[0] else []
        thresholds = next((r["thresholds"] for r in first if r["step"] == twin.step), None)
        return measure(twin.model, twin.name, held, cfg.canvas.task, thresholds)

    def record(twin: Twin) -> None:
        """The twin's trajectory row at its step, written before it trains on."""
        row = {"step": twin.step, "train_loss": _num(twin.last_loss()), "lr": _num(twin.lr)}
        trajectories[twin.name].append({**row, **twin.record})
        twin.folder.mkdir(parents=True, exist_ok=True)
        lines = "".join(json.dumps(r) + "\n" for r in trajectories[twin.name])
        atomic_write_text(twin.folder / TRAJECTORY_NAME, lines)

    models = build_twins(cfg)
    twins = {name: Twin(name, models[name], cfg, out / name, measure_twin) for name in TWINS}
    try:
        for (
            name,
            twin,
        ) in twins.items():  # the untrained twins are the first point of every trajectory
            has_run = list_checkpoints(twin.run_dir / CHECKPOINTS)
            if (train or has_run) and twin.start():
                log(f"{name}: resumed at step {twin.step}")
            path = twin.folder / TRAJECTORY_NAME
            rows = map(
                json.loads, filter(None, path.read_text().splitlines() if path.is_file() else [])
            )
            trajectories[name] = [r for r in rows if r["step"] <= twin.step]  # later: not saved
            if not trajectories[name] or trajectories[name][-1]["step"] < twin.step:
                twin.record = measure_twin(twin)  # killed between its checkpoint and its row
                record(twin)
        done = min(t.step for t in twins.values())
        bar = tqdm(
            total=cfg.steps, initial=done, desc="register study", unit="step", disable=not progress
        )
        start = time.monotonic()
        while train and done < cfg.steps:
            until = min(cfg.steps, (done // cfg.checkpoint_every + 1) * cfg.checkpoint_every)
            for twin in twins.values():
                if twin.step < until:
                    twin.train(until)
                    record(twin)
            done = until
            bar.update(done - bar.n)
            a, b = (trajectories[t][-1] for t in TWINS)
            otr = "/".join(f"{_value(row, 'outlier_ratio', 'metrics'):.3f}" for row in (a, b))
            bar.set_postfix(acc=f"{a['accuracy']:.2f}/{b['accuracy']:.2f}", otr=otr)
            if max_minutes is not None and (time.monotonic() - start) / 60 > max_minutes:
                break
    finally:
        for twin in twins.values():
            twin.close()
    bar.close()
    for name, twin in twins.items():
        save_pretrained(
            twin.model, out / name / "final", extra={"study_step": twin.step, "twin": name}
        )
    result = StudyResult(out, trajectories, verdict(trajectories), complete=done >= cfg.steps)
    figure = trajectory_figure(trajectories, cfg)
    result.files += save_figure(figure, out / "trajectory", ("png", "pdf"))
    result.files.append(write_json(out / "verdict.json", result.verdict))
    (out / "heldout").mkdir(exist_ok=True)  # the metric canvases, for viz compare / viz ttr
    for image in held.images:
        result.files.append(out / "heldout" / f"{image.name}.png")
        if not result.files[-1].is_file():
            cv2.imwrite(str(result.files[-1]), cv2.cvtColor(image.rgb, cv2.COLOR_RGB2BGR))
    log(summary_text(result))
    if not result.complete:
        log(f"stopped at step {done} of {cfg.steps}: rerun the same command to continue")
    if analyse:
        result.files += analyse_twins(cfg, out, held, {n: t.model for n, t in twins.items()}, log)
    return result


def _check_same_study(cfg: StudyConfig, out: Path) -> None:
    """A study folder belongs to one configuration: resuming with another would mix two studies."""
    path = out / "study.json"
    doc = json.loads(json.dumps(cfg.to_dict()))
    if not path.is_file():
        out.mkdir(parents=True, exist_ok=True)
        write_json(path, doc)
        return
    old = json.loads(path.read_text())
    if old != doc:
        changed = sorted(k for k in set(old) | set(doc) if old.get(k) != doc.get(k))
        raise InputError(
            f"{out} holds a study with other settings (changed: {', '.join(changed)}): "
            "use another --out, or delete it to start over"
        )


# success thresholds: outliers in >= half the images, >= 10x fewer with registers
MIN_IMAGES_WITH_OUTLIERS = 0.5
MIN_REDUCTION = 10.0
ATTENTION_FACTOR = 2.0  # "drawing attention": at least twice the uniform share


def verdict(trajectories: dict[str, list[dict]]) -> dict[str, Any]:
    """The garbage-collector signature (Darcet et al., arXiv 2309.16588 section 2: high-norm background
    tokens that draw attention) at the latest step both twins reached, read at the block where the most
    images of the twin without registers have a background outlier (attention: the next block); each
    check is named in ``checks``, every number it reads is in ``values``."""
    step = max(set.intersection(*({r["step"] for r in trajectories[t]} for t in TWINS)))
    a, b = (next(r for r in trajectories[t] if r["step"] == step) for t in TWINS)
    background = a["images_with_background_outliers"]
    best = max(
        range(len(background)), key=lambda i: (background[i], a["metrics"]["outlier_ratio"][i] or 0)
    )
    nxt = min(best + 1, len(background) - 1)

    def at(row: dict, metric: str, block: int) -> float:
        return (row["metrics"].get(metric) or [None] * len(background))[block] or 0.0

    v = {
        "images_with_background_outliers": background[best],
        "outlier_background_share": a["outlier_background_share"][best],
        "background_rate": a["background_rate"][best],
        "outlier_ratio": at(a, "outlier_ratio", best),
        "received_outlier_mass": at(a, "received_outlier_mass", nxt),
        "sink_rate_patch": at(a, "sink_rate_patch", nxt),
        "registers_outlier_ratio": at(b, "outlier_ratio", best),
        "registers_outlier_ratio_reused_thresholds": at(
            b.get("reused") or b, "outlier_ratio", best
        ),
        "patch_register_mass": at(b, "patch_register_mass", nxt),
        "uniform_register_share": b["num_registers"] / b["num_tokens"],
        "accuracy": a["accuracy"],
        "registers_accuracy": b["accuracy"],
    }
    otr = v["outlier_ratio"]
    share = v["outlier_background_share"]
    received = v["received_outlier_mass"]
    otr_registers = max(
        v["registers_outlier_ratio"], v["registers_outlier_ratio_reused_thresholds"]
    )
    uniform = v["uniform_register_share"]
    checks = {
        "outliers_in_half_the_images": v["images_with_background_outliers"]
        >= MIN_IMAGES_WITH_OUTLIERS,
        "outliers_on_background": share is not None and share > v["background_rate"],
        "outliers_draw_attention": 0 < ATTENTION_FACTOR * otr <= received
        and v["sink_rate_patch"] > 0,
        "registers_10x_fewer_outliers": otr > 0 and MIN_REDUCTION * otr_registers <= otr,
        "registers_hold_attention": v["patch_register_mass"]
        >= max(ATTENTION_FACTOR * uniform, 0.5 * received),
    }
    success = all(checks.values())
    return {
        "step": step,
        "layer": best,
        "next_layer": nxt,
        "success": success,
        "checks": checks,
        "values": v,
    }


def summary_text(result: StudyResult) -> str:
    v = result.verdict
    outcome = "SUCCESS" if v["success"] else "no garbage-collector signature"
    numbers = ", ".join(f"{k}={'n/a' if x is None else f'{x:.3g}'}" for k, x in v["values"].items())
    checks = ", ".join(f"{k}={'yes' if ok else 'no'}" for k, ok in v["checks"].items())
    where = f"outliers at block {v['layer']}, attention at {v['next_layer']}"
    return (
        f"register study at step {v['step']}: {outcome} ({where})\n  {numbers}\n  checks: {checks}"
    )


def analyse_twins(
    cfg: StudyConfig,
    out: Path,
    held: HeldOut,
    twins: dict[str, ViT5],
    log: Callable[[str], None] = print,
) -> list[Path]:
    """Register ablation of the register twin and test-time registers on the twin without registers,
    on the held-out canvases; numbers in ``<out>/analysis/analysis.json``, figures beside them."""
    from vit5.introspect.load import load_spec
    from vit5.viz.runner import RunConfig, run_ttr
    from vit5.viz.ttr import NeuronSearch

    folder = out / "analysis"
    folder.mkdir(parents=True, exist_ok=True)
    reference = labelled(
        cfg, CanvasSource(cfg.canvas, "val", cfg.seed).batch(2, cfg.eval_images), "reference"
    )
    ablation = AblationConfig(knn_k=10, batch_size=32)
    report = run_ablation(
        twins["registers"], held.images, reference, "registers twin (trained)", ablation
    )
    log(report.table())
    files = report.write(folder) + save_figure(
        ablation_figure(report), folder / "ablation", ("png", "pdf")
    )
    summary: dict[str, Any] = {"ablation": report.records()}
    loaded = load_spec(str(out / "no_registers" / "final"), require="recording")
    ttr_cfg = RunConfig(
        out=folder,
        batch_size=32,
        max_figures=4,
        progress=False,
        log=log,
        metrics=MetricConfig(n_boot=200),
    )
    try:
        found, before, after = run_ttr(
            loaded, [str(out / "heldout")], ttr_cfg, NeuronSearch(top_k=10)
        )
    except InputError as err:  # no outliers in the twin without registers: nothing to move
        summary["ttr"] = {"applicable": False, "reason": str(err)}
        log(f"test-time registers not applicable: {err}")
    else:
        d = found.detect_layer

        def pick(r, name: str) -> float | None:
            return _num(r.report.summary[name]["value"][d]) if name in r.report.summary else None

        summary["ttr"] = {
            "applicable": True,
            "detect_layer": d,
            "threshold": found.threshold,
            "neurons": [[n.layer, n.neuron, n.score] for n in found.neurons],
            **{
                f"{name}_{when}": pick(r, name)
                for name in ("outlier_ratio", "max_median_ratio", "sink_rate_patch")
                for when, r in (("before", before), ("after", after))
            },
            "test_time_register_outlier_ratio": pick(after, "outlier_ratio_registers"),
            "patch_register_mass_after": pick(after, "patch_register_mass"),
        }
        files += before.files + after.files
    return [*files, write_json(folder / "analysis.json", summary)]


LABELS = ("no registers", "registers")  # of TWINS, which is also the colour index (colour = model)


def _both(
    metric: str, suffix: str = "", where: str = "metrics"
) -> tuple[tuple[int, str, str, str], ...]:
    return (0, metric, where, suffix), (1, metric, where, suffix)


# panel title -> lines (twin index, metric, where, label suffix); where = "metrics" (own thresholds),
# "reused" (the no-register twin's) or "background" (own thresholds, another line style)
PANELS = {
    "outlier-token ratio (max over blocks)": (
        (0, "outlier_ratio", "metrics", ""),
        (1, "outlier_ratio", "metrics", ", own thresholds"),
        (1, "outlier_ratio", "reused", ", no-register twin's thresholds"),
    ),
    "images with an outlier patch (max over blocks)": (
        *_both("images_with_outliers", ": any patch"),
        *_both("images_with_background_outliers", ": a background patch", "background"),
    ),
    "max / median patch norm (max over blocks)": _both("max_median_ratio"),
    "sink heads: patch / register (block mean)": (
        *_both("sink_rate_patch", ": patch sinks"),
        (1, "sink_rate_register", "metrics", ": register sinks"),
    ),
    "attention mass (max over blocks)": (
        (0, "received_outlier_mass", "metrics", ": on outlier patches"),
        (1, "patch_register_mass", "metrics", ": patches on registers"),
    ),
    "held-out accuracy": _both("accuracy"),
}


def _value(row: dict, metric: str, where: str) -> float:
    """One point: the metric's max over blocks (the mean for sink rates), NaN where not measured."""
    if metric == "accuracy":
        return row["accuracy"]
    block = (row.get("reused") if where == "reused" else row) or {}
    values = (
        block.get(metric)
        if metric.startswith("images_with")
        else block.get("metrics", {}).get(metric)
    )
    values = [v for v in values or [] if v is not None]
    reduce = np.mean if metric.startswith("sink_rate") else max
    return float(reduce(values)) if values else float("nan")


def trajectory_figure(
    trajectories: Mapping[str, Sequence[dict]], cfg: StudyConfig, dpi: int = S.DPI
) -> Figure:
    """One panel per quantity, x = training step; colour = twin, line style and marker = the quantity
    (which metric, or which thresholds); trained models, held-out canvases."""
    rows = -(-len(PANELS) // 2)
    fig = Figure(figsize=(S.TEXT_WIDTH, 2.3 * rows + 1.0), dpi=dpi, layout="constrained")
    for ax, (title, lines) in zip(fig.subplots(rows, 2).flat, PANELS.items()):
        kinds = list(dict.fromkeys((metric, where) for _, metric, where, _ in lines))
        for twin, metric, where, suffix in lines:
            traj = trajectories.get(TWINS[twin]) or []
            values = [_value(r, metric, where) for r in traj]
            style = S.line_kwargs(twin, kinds.index((metric, where)))
            ax.plot([r["step"] for r in traj], values, label=LABELS[twin] + suffix, **style)
        S.style_axes(ax, title, "training step")
        S.legend(ax)
    canvas = cfg.canvas
    reached = min((traj[-1]["step"] for traj in trajectories.values() if traj), default=0)
    progress = "" if reached >= cfg.steps else f"; STOPPED at step {reached} of {cfg.steps}"
    fig.suptitle(
        f"Register study: TRAINED twins on {cfg.eval_images} held-out canvases{progress}",
        fontsize=S.FONT_TITLE,
    )
    notes = [
        f"width {cfg.embed_dim}, depth {cfg.depth}, {canvas.size[0]}x{canvas.size[1]} {canvas.background} "
        f"canvases, task {canvas.task}, no CLS + average pooling, 0 vs {cfg.registers} registers",
        "outlier threshold: log-norm median + 5 MAD per block; sink: one key receives > 0.3 of a head's "
        "average attention",
    ]
    S.finish(fig, notes)
    return fig

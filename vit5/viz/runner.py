"""Run the tools over images and write figures, metrics and raw arrays under ``out/``:
``images/<image>/*``, ``summary_grid``, ``norm_histograms``, ``outlier_frequency``,
``layer_profile``, ``massive_activations``, ``metrics.json`` / ``.csv``, ``token_stats.npz``; two
models side by side under ``compare/``, a model without and with test-time registers under
``ttr/`` (plus ``register_neurons.json``). Each model comes from
:func:`vit5.introspect.load.load_spec` with its description, which is used as it is."""

from __future__ import annotations

import math
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager, nullcontext
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path

import torch
from matplotlib.figure import Figure
from torch import nn

from vit5 import runtime
from vit5.errors import InputError
from vit5.introspect import ModelInfo, describe
from vit5.introspect.load import LoadedModel
from vit5.layers.patch_embed import grid_of
from vit5.model import TokenLayout, take_indices
from vit5.model.footprint import recording_bytes
from vit5.outputs import write_json
from vit5.plotstyle import save_figure
from vit5.runtime import check_fits
from vit5.viz import figures as F
from vit5.viz import ttr
from vit5.viz.artifacts import MetricConfig, MetricReport, compute_metrics
from vit5.viz.collect import CollectConfig, collect, edit_tokens, recordable
from vit5.viz.figures import MapStyle
from vit5.viz.images import LoadedImage, default_size, list_sources, load_images
from vit5.viz.stats import TokenStats


@dataclass(frozen=True)
class PlantSpec:
    """A known, artificial high-norm token to check the tools end to end: a tiny model trained for minutes is
    not expected to grow the artifacts of Darcet et al. (arXiv 2309.16588, section 2), so one is planted."""

    layer: int
    positions: tuple[tuple[int, int], ...]  # (row, column) in the patch grid
    scale: float = 20.0

    def describe(self) -> str:
        where = ", ".join(f"({r},{c})" for r, c in self.positions)
        return (
            f"PLANTED artifacts (x{self.scale:g} norm) at layer {self.layer}, patches {where}: "
            "not a property of the model"
        )


@contextmanager
def plant_artifacts(
    model: nn.Module,
    spec: PlantSpec,
    info: ModelInfo | None = None,
) -> Iterator[None]:
    """Multiply block ``spec.layer``'s output tokens at ``spec.positions`` by ``spec.scale``
    (every later block sees the planted tokens); whatever is made inside must say "planted".
    ``info``: the model's description, if the caller has it."""
    info = info or describe(model)
    layer = take_indices(info.depth, [spec.layer])[0]

    def plant(position: int, tokens: torch.Tensor, layout: TokenLayout) -> torch.Tensor | None:
        if position != layer + 1:
            return None
        h, w = layout.grid
        for r, c in spec.positions:
            if not (0 <= r < h and 0 <= c < w):
                raise InputError(f"planted position ({r},{c}) is outside the {h}x{w} patch grid")
        start = layout.patch_slice.start
        index = [start + r * w + c for r, c in spec.positions]
        out = tokens.clone()
        out[:, index] = out[:, index] * spec.scale
        return out

    with edit_tokens(model, plant, info):
        yield


VIEWS = (
    "attention",
    "registers",
    "rollout",
    "norms",
    "histograms",
    "profile",
    "massive",
    "pca",
    "metrics",
)
RANDOM_INIT_NOTE = (
    "RANDOM-INIT weights: an untrained model, shown to demonstrate the tools, not learned behaviour"
)


@dataclass(frozen=True)
class RunConfig:
    out: Path
    views: frozenset[str] = frozenset(VIEWS)
    # (height, width); default: the images' aspect (images.default_size)
    size: tuple[int, int] | None = None
    # layers drawn in per-image figures (all layers are measured)
    layers: tuple[int, ...] = (-1,)
    batch_size: int = 8
    device: str = "cpu"
    # per-image figures and summary-grid rows for the first N images
    max_figures: int = 16
    renormalise: bool = False  # CLS maps renormalised over patches instead of raw
    # register maps explicitly asked for: fail on a model without registers
    require_registers: bool = False
    # compare: score model B with model A's outlier thresholds (twins)
    reuse_thresholds: bool = True
    save_raw: str | None = None  # "npz" or "safetensors"
    style: MapStyle = field(default_factory=MapStyle)
    metrics: MetricConfig = field(default_factory=MetricConfig)
    plant: PlantSpec | None = None
    progress: bool = True
    log: Callable[[str], None] = print

    def __post_init__(self) -> None:
        if unknown := set(self.views) - set(VIEWS):
            choices = ", ".join(VIEWS)
            raise InputError(f"unknown views {sorted(unknown)}: choose from {choices}")
        if self.save_raw not in (None, "npz", "safetensors"):
            raise InputError(f"raw arrays are saved as npz or safetensors, not {self.save_raw!r}")
        if self.max_figures < 0:
            raise InputError(f"max_figures must be >= 0, got {self.max_figures}")

    def rollout(self, drawn: bool) -> bool:
        """Whether a run records the attention rollout (keeping q and k of every block until a
        batch has run): where it is ``drawn`` (one model's figures) and asked for, or saved."""
        return (drawn and "rollout" in self.views) or self.save_raw is not None


@dataclass
class RunResult:
    stats: TokenStats
    report: MetricReport
    images: list[LoadedImage]
    files: list[Path] = field(default_factory=list)


@dataclass(frozen=True)
class Prepared:
    """A run's images, checked against its models: the size, the images at it, the blocks
    drawn in per-image figures (of the last model)."""

    size: tuple[int, int]
    images: list[LoadedImage]
    layers: list[int]


def _prepare(
    models: Sequence[LoadedModel],
    cfg: RunConfig,
    sources: Sequence[str],
    size: tuple[int, int] | None = None,
    patch: int | None = None,
    rollout: bool = True,
) -> Prepared:
    """Check every model (described: :func:`_described`) at the run's size and batch (its
    recorded attention, with q and k for the ``rollout``, must fit) before any image is
    decoded at it, then load the images."""
    count = len(list_sources(sources))
    batch = max(1, min(cfg.batch_size, count))
    for loaded in models:
        info = loaded.info
        if size is None:
            size = cfg.size or default_size(sources, info.img_size, info.patch_size)
        size = tuple(size)
        info.grid(size)
        check_recording_memory(info, size, batch, cfg.device, rollout)
        layers = take_indices(info.depth, list(cfg.layers), unique=True)
        if cfg.require_registers and info.num_registers == 0:
            raise InputError(
                f"{loaded.label} has no register tokens (R=0), so there are no register "
                "attention maps: drop --registers, or pick a model with registers (vit5_* "
                "presets, timm *_reg4_* models)",
            )
    images, skipped = load_images(sources, size, patch or info.patch_size)
    for line in skipped:
        cfg.log(f"warning: skipped {line}")
    note = f" ({len(skipped)} skipped)" if skipped else ""
    cfg.log(f"{len(images)} images at {size[0]}x{size[1]}{note}")
    return Prepared(size=size, images=images, layers=layers)


def recording_estimate(
    info: ModelInfo, size: tuple[int, int], batch: int, rollout: bool = True
) -> int:
    """Bytes :func:`vit5.model.footprint.recording_bytes` estimates for recording ``batch``
    images at ``size`` leanly (the CLS and register rows kept; q and k for the ``rollout``)."""
    layout = info.layout(size)
    kept_rows = int(layout.cls_index is not None) + layout.num_registers
    return recording_bytes(
        batch=batch,
        heads=info.num_heads,
        tokens=layout.num_tokens,
        width=info.embed_dim,
        depth=info.depth,
        kept_rows=kept_rows,
        rollout=rollout,
    )


def largest_fitting_size(
    info: ModelInfo, size: tuple[int, int], batch: int, have: int, rollout: bool = True
) -> tuple[int, int] | None:
    """The largest size of ``size``'s aspect (whole patches) whose recording (with the
    ``rollout``: :func:`recording_estimate`) fits in ``have`` bytes; None when not even one
    patch a side fits."""
    grid = info.grid(size)
    side = max(grid)

    def scaled(m: int) -> tuple[int, int]:
        rows = max(1, grid[0] * m // side)
        cols = max(1, grid[1] * m // side)
        return (rows * info.patch_size, cols * info.patch_size)

    low = 0  # the largest m known to fit (0: none)
    high = side
    while low < high:
        middle = (low + high + 1) // 2
        if recording_estimate(info, scaled(middle), batch, rollout) <= have:
            low = middle
        else:
            high = middle - 1
    return scaled(low) if low else None


def check_recording_memory(
    info: ModelInfo, size: tuple[int, int], batch: int, device: str, rollout: bool = True
) -> None:
    """Refuse a size whose lean recording (:func:`recording_estimate`, with q and k of every
    block for the ``rollout``) cannot fit on ``device`` before any work, naming the largest
    size that fits."""
    tokens = info.layout(size).num_tokens
    heads = info.num_heads
    what = (
        f"recording the attention of {batch} image(s) at {size[0]}x{size[1]} "
        f"({tokens:,} tokens, {heads} heads, {info.depth} blocks)"
    )
    if rollout:
        what += " with q and k of every block for the attention rollout"
    needed = recording_estimate(info, size, batch, rollout)
    have = runtime.available_memory(device)
    if needed <= have:
        return
    fits = largest_fitting_size(info, size, batch, have, rollout)
    if fits is None:
        fix = "free memory or use a device with more"
    else:
        fix = f"the largest size that fits is --size {fits[0]}x{fits[1]}"
    if batch > 1:
        fix += " (or --batch-size 1)"
    if rollout and recording_estimate(info, size, batch, rollout=False) <= have:
        fix += "; without the rollout this size fits (vit5 viz norms, pca or metrics)"
    check_fits(needed, device, what, fix)


def _record(
    loaded: LoadedModel,
    images: list[LoadedImage],
    cfg: RunConfig,
    rollout: bool,
    features: int = 0,
    info: ModelInfo | None = None,
) -> TokenStats:
    """Record ``loaded`` on ``images`` (checked by :func:`_prepare`), with the ``rollout``
    (:meth:`RunConfig.rollout`); ``info``: the model's description while something changes it
    (test-time registers), else ``loaded.info``."""
    info = info or loaded.info
    collect_cfg = CollectConfig(
        batch_size=cfg.batch_size,
        device=cfg.device,
        keep_features=features,
        progress=cfg.progress,
        rollout=rollout,
    )
    planted = nullcontext()
    if cfg.plant:
        planted = plant_artifacts(loaded.model, cfg.plant, info)
    with planted:
        return collect(loaded.model, images, loaded.label, collect_cfg, info)


def _described(loaded: LoadedModel) -> LoadedModel:
    """``loaded`` with its description: the loader's, or (a model loaded without one) described
    here, once; an InputError for a model whose attention cannot be recorded."""
    info = recordable(loaded.model, loaded.info)
    if loaded.info is None:
        return replace(loaded, info=info)
    return loaded


def _notes(loaded: LoadedModel, cfg: RunConfig) -> list[str]:
    notes = [RANDOM_INIT_NOTE] if loaded.random_init else []
    return notes + ([cfg.plant.describe()] if cfg.plant else [])


def run_model(loaded: LoadedModel, sources: Sequence[str], cfg: RunConfig) -> RunResult:
    """Record ``loaded`` on ``sources`` and write the views of ``cfg``; returns the arrays and
    metrics."""
    loaded = _described(loaded)
    info = loaded.info
    rollout = cfg.rollout(drawn=True)
    prepared = _prepare([loaded], cfg, sources, rollout=rollout)
    images = prepared.images
    layers = prepared.layers
    keep = cfg.max_figures if "pca" in cfg.views else 0
    stats = _record(loaded, images, cfg, rollout, features=keep)
    report = compute_metrics(stats, cfg.metrics)
    result = RunResult(stats, report, images)
    notes = _notes(loaded, cfg)
    style = cfg.style
    out = Path(cfg.out)
    views = cfg.views
    save = _saver(out, style, result.files)
    shown = images[: cfg.max_figures]
    renorm = cfg.renormalise
    pca = None
    variance = None
    if stats.features is not None:
        pca, variance = F.pca_rgb(stats.features, stats.layout.grid)
    has_cls = stats.cls_attn is not None
    if "attention" in views and not has_cls:
        cfg.log(f"{stats.model} has no CLS token: no CLS maps; rollout reads the mean patch row")
    available = {"attention": has_cls, "registers": info.num_registers > 0}
    per_image = [v for v in F.IMAGE_FIGURES if v in views and available.get(v, True)]
    outliers = report.outliers
    for i, image in enumerate(shown):
        folder = f"images/{image.name}/"
        for view in per_image:
            fig = F.image_figure(view, stats, i, image, layers, style, renorm, outliers, notes)
            save(fig, folder + F.IMAGE_FIGURES[view])
        if pca is not None:
            save(F.pca_figure(stats, image, pca[i], variance, style, notes), folder + "pca")
    grid_views = [v for v in ("attention", "rollout", "norms", "pca") if v in views]
    if shown and grid_views:
        grid_notes = notes + ([F.pca_note(variance)] if pca is not None else [])
        fig = F.summary_figure(
            [stats],
            shown,
            grid_views,
            layers[-1],
            style,
            pca,
            renorm,
            grid_notes,
        )
        save(fig, "summary_grid")
    if "histograms" in views:
        thresholds = report.thresholds
        save(F.norm_histogram_figure(stats, thresholds, style, notes), "norm_histograms")
        fig = F.outlier_frequency_figure(stats, report, layers, style, notes)
        save(fig, "outlier_frequency")
    if "profile" in views:
        save(F.layer_profile_figure({stats.model: report}, style, notes), "layer_profile")
    if "massive" in views:
        measured = {stats.model: (stats, report)}
        fig = F.massive_activation_figure(measured, style, notes)
        save(fig, "massive_activations")
    if "metrics" in views:
        result.files += report.write(out / "metrics")
        cfg.log(("\n".join(notes) + "\n" if notes else "") + report.table())
    if cfg.save_raw:
        result.files.append(stats.save(out / f"token_stats.{cfg.save_raw}"))
    cfg.log(f"wrote {len(result.files)} files to {out}")
    return result


def _saver(out: Path, style: MapStyle, files: list[Path]) -> Callable[[Figure, str], None]:
    """``save(figure, name)``: ``out/name.<format>`` for each of ``style.formats``, added to
    ``files``."""
    out.mkdir(parents=True, exist_ok=True)
    return lambda fig, name: files.extend(save_figure(fig, out / name, style.formats))


def run_compare(
    model_a: LoadedModel,
    model_b: LoadedModel,
    sources: Sequence[str],
    cfg: RunConfig,
) -> tuple[RunResult, RunResult]:
    """Both models on the same pixels: comparison figures with shared scales, metrics with A's
    thresholds for B (unless ``reuse_thresholds`` is off or explicit reference thresholds are
    given)."""
    model_a = _described(model_a)
    model_b = _described(model_b)
    info_a = model_a.info
    info_b = model_b.info
    patch_a = info_a.patch_size
    patch_b = info_b.patch_size
    patch = math.lcm(patch_a, patch_b)
    size = tuple(cfg.size or default_size(sources, info_a.img_size, patch))
    both = f", a multiple of both models' patch sizes ({patch_a} and {patch_b})"
    # one size for both: the hint is a multiple of both patch sizes
    grid_of(size, patch, "use --size {h}x{w}" + both)
    # the comparison draws no rollout
    rollout = cfg.rollout(drawn=False)
    images = _prepare([model_a, model_b], cfg, sources, size, patch, rollout).images
    if model_a.label == model_b.label:
        model_b = replace(model_b, label=f"{model_b.label} (B)")
    stats = [_record(model, images, cfg, rollout) for model in (model_a, model_b)]
    notes = sorted(set(_notes(model_a, cfg) + _notes(model_b, cfg)))
    return _write_comparison(stats, images, cfg, notes, Path(cfg.out) / "compare")


def run_ttr(
    loaded: LoadedModel,
    sources: Sequence[str],
    cfg: RunConfig,
    search: ttr.NeuronSearch | None = None,
    count: int = 1,
) -> tuple[ttr.NeuronSearchResult, RunResult, RunResult]:
    """Test-time registers (:mod:`vit5.viz.ttr`): find the register neurons of ``loaded`` on
    ``sources``, then compare the model without and with ``count`` test-time registers (figures
    and metrics, the second with the first's thresholds) under ``out/ttr``; the neurons go to
    ``out/ttr/register_neurons.json``."""
    loaded = _described(loaded)
    ttr.check_test_time_registers(loaded.model)  # before the neuron search, not after it
    rollout = cfg.rollout(drawn=False)  # the comparison draws no rollout
    images = _prepare([loaded], cfg, sources, rollout=rollout).images
    search = replace(search or ttr.NeuronSearch(), batch_size=cfg.batch_size, device=cfg.device)
    found = ttr.find_register_neurons(loaded.model, images, search)
    cfg.log(found.describe())
    before = _record(loaded, images, cfg, rollout)
    label = f"{loaded.label} + test-time register"
    info = replace(loaded.info, test_registers=count)
    with ttr.use_test_time_registers(loaded.model, found.neurons, count):
        after = _record(replace(loaded, label=label), images, cfg, rollout, info=info)
    out = Path(cfg.out) / "ttr"
    ttr_note = (
        f"TEST-TIME REGISTER ({count} untrained token) fed by {len(found.neurons)} register "
        f"neurons of blocks <= {found.top_layer} (Jiang et al. 2025)"
    )
    notes = [*_notes(loaded, cfg), ttr_note]
    result_a, result_b = _write_comparison([before, after], images, cfg, notes, out)
    neurons = write_json(out / "register_neurons.json", asdict(found))
    result_a.files.append(neurons)
    return found, result_a, result_b


def _write_comparison(
    both: list[TokenStats],
    images: list[LoadedImage],
    cfg: RunConfig,
    notes: list[str],
    out: Path,
) -> tuple[RunResult, RunResult]:
    stats_a = both[0]
    stats_b = both[1]
    metrics = cfg.metrics
    report_a = compute_metrics(stats_a, metrics)
    own = metrics.thresholds is not None or not cfg.reuse_thresholds
    if not own:
        metrics = replace(
            metrics,
            thresholds=tuple(report_a.thresholds),
            threshold_source=f"reused from {stats_a.model}",
        )
    report_b = compute_metrics(stats_b, metrics)
    results = (RunResult(stats_a, report_a, images), RunResult(stats_b, report_b, images))
    style = cfg.style
    files = results[0].files
    layer = cfg.layers[-1]
    renorm = cfg.renormalise
    save = _saver(out, style, files)
    shown = images[: cfg.max_figures]
    for i, image in enumerate(shown):
        save(F.compare_figure(both, i, image, layer, style, renorm, notes), image.name)
    if shown:
        views = ("attention", "norms")
        fig = F.summary_figure(both, shown, views, layer, style, None, renorm, notes)
        save(fig, "summary_grid")
    reports = {r.stats.model: r.report for r in results}
    save(F.layer_profile_figure(reports, style, notes), "layer_profile")
    models = {r.stats.model: (r.stats, r.report) for r in results}
    save(F.massive_activation_figure(models, style, notes), "massive_activations")
    if notes:
        cfg.log("\n".join(notes))
    for r in results:
        safe = "".join(c if c.isalnum() or c in "._-" else "_" for c in r.stats.model)
        files += r.report.write(out / f"metrics_{safe}")
        if cfg.save_raw:
            files.append(r.stats.save(out / f"token_stats_{safe}.{cfg.save_raw}"))
        cfg.log(r.report.table())
    cfg.log(f"wrote {len(files)} files to {out}")
    return results

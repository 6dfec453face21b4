"""Where does a ViT put its attention and its high-norm tokens, and do registers clean that up?

Figures (attention maps, rollout, token-norm maps and histograms, layer profiles, PCA, the
two-model "garbage collector" comparison) and per-layer metrics with bootstrap intervals
(registers.md section 3: outlier-token ratio, max/median norm, kurtosis, CLS entropy, CLS mass
on outliers, register mass, sink rate) for vit5 models and timm ViTs (``VisionTransformer``,
``Eva``), whatever their token order.

    from vit5.viz import capture, load_model_spec, run_model, RunConfig
    with capture(model, layers=[-1]) as rec:        # any supported model
        model(images)
    rec.attentions[11], rec.tokens[11], rec.layout

Command line: ``python -m viz --help``.
"""

from .adapters import ModelInfo, capture, describe, resolve_layers
from .collect import CollectConfig, collect
from .errors import VizError
from .figures import MapStyle
from .images import SKLEARN_SAMPLES, ImageError, LoadedImage, load_images, to_batch
from .load import LoadedModel, load_model_spec, parse_overrides
from .plant import PlantSpec, plant_artifacts
from .report import MetricConfig, MetricReport, compute_metrics, load_thresholds
from .rollout import attention_rollout
from .runner import VIEWS, RunConfig, RunResult, run_compare, run_model
from .stats import TokenStats

__all__ = [
    "SKLEARN_SAMPLES", "VIEWS", "CollectConfig", "ImageError", "LoadedImage", "LoadedModel", "MapStyle",
    "MetricConfig", "MetricReport", "ModelInfo", "PlantSpec", "RunConfig", "RunResult", "TokenStats", "VizError",
    "attention_rollout", "capture", "collect", "compute_metrics", "describe", "load_images", "load_model_spec",
    "load_thresholds", "parse_overrides", "plant_artifacts", "resolve_layers", "run_compare", "run_model", "to_batch",
]

"""Where does a ViT put its attention and its high-norm tokens, and do registers clean that up?

Figures (attention maps, rollout, token-norm maps and histograms, layer profiles, PCA, the
two-model "garbage collector" comparison) and per-layer metrics with bootstrap intervals
(outlier-token ratio, max/median norm, kurtosis, CLS entropy, CLS mass on outliers, register
mass, sink rate, massive activations) for vit5 models and timm ViTs (``VisionTransformer``,
``Eva``), whatever their token order; register analyses: ablation at inference
(:mod:`~vit5.viz.register_ablation`), test-time registers (:mod:`~vit5.viz.ttr`), the position-artifact
probe (:mod:`~vit5.viz.position`) and the register study that grows artifacts
(:mod:`~vit5.study.run`).

    from vit5.viz import capture, load_model_spec, run_model, RunConfig
    with capture(model, layers=[-1]) as rec:        # any supported model
        model(images)
    rec.attentions[11], rec.tokens[11], rec.layout

Command line: ``python -m viz --help``.
"""

from vit5.introspect import ModelInfo, describe
from vit5.introspect.spec import LoadedModel
from vit5.introspect.spec import parse_model_args as parse_overrides
from vit5.viz.artifacts import MetricConfig, MetricReport, compute_metrics, load_thresholds
from vit5.viz.capture import capture
from vit5.viz.collect import CollectConfig, collect
from vit5.viz.figures import MapStyle, save_figure
from vit5.viz.images import SKLEARN_SAMPLES, LoadedImage, load_images, to_batch
from vit5.viz.plant import PlantSpec, plant_artifacts
from vit5.viz.position import (
    PositionProbe,
    PositionProbeConfig,
    position_figure,
    run_position_probe,
    write_probes,
)
from vit5.viz.register_ablation import METHODS as ABLATION_METHODS
from vit5.viz.register_ablation import PLACES as ABLATION_PLACES
from vit5.viz.register_ablation import (
    AblationConfig,
    AblationReport,
    ablate_registers,
    ablation_figure,
    register_reference,
    run_ablation,
)
from vit5.viz.rollout import attention_rollout
from vit5.viz.runner import VIEWS, RunConfig, RunResult, load_model_spec, run_compare, run_model, run_ttr
from vit5.viz.stats import TokenStats
from vit5.viz.ttr import (
    NeuronSearch,
    NeuronSearchResult,
    RegisterNeuron,
    find_register_neurons,
    use_test_time_registers,
)

__all__ = [
    "ABLATION_METHODS",
    "ABLATION_PLACES",
    "SKLEARN_SAMPLES",
    "VIEWS",
    "AblationConfig",
    "AblationReport",
    "CollectConfig",
    "LoadedImage",
    "LoadedModel",
    "MapStyle",
    "MetricConfig",
    "MetricReport",
    "ModelInfo",
    "NeuronSearch",
    "NeuronSearchResult",
    "PlantSpec",
    "PositionProbe",
    "PositionProbeConfig",
    "RegisterNeuron",
    "RunConfig",
    "RunResult",
    "TokenStats",
    "ablate_registers",
    "ablation_figure",
    "attention_rollout",
    "capture",
    "collect",
    "compute_metrics",
    "describe",
    "find_register_neurons",
    "load_images",
    "load_model_spec",
    "load_thresholds",
    "parse_overrides",
    "plant_artifacts",
    "position_figure",
    "register_reference",
    "run_ablation",
    "run_compare",
    "run_model",
    "run_position_probe",
    "run_ttr",
    "save_figure",
    "to_batch",
    "use_test_time_registers",
    "write_probes",
]

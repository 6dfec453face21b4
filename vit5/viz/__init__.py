"""Where does a ViT put its attention and its high-norm tokens, and do registers clean that up? Figures
and per-layer artifact metrics for vit5 and timm ViTs (``VisionTransformer``, ``Eva``) and the register
analyses (ablation, test-time registers, position probe). Command line: ``vit5 viz --help``."""

from vit5.introspect import describe
from vit5.introspect.load import parse_model_args as parse_overrides
from vit5.plotstyle import save_figure
from vit5.viz.artifacts import MetricConfig, compute_metrics, load_thresholds
from vit5.viz.collect import CollectConfig, capture, collect
from vit5.viz.figures import MapStyle
from vit5.viz.images import LoadedImage, load_images, to_batch
from vit5.viz.position import PositionProbeConfig, position_figure, run_position_probe, write_probes
from vit5.viz.register_ablation import AblationConfig, ablation_figure, run_ablation
from vit5.viz.runner import VIEWS, PlantSpec, RunConfig, run_compare, run_model, run_ttr
from vit5.viz.stats import TokenStats
from vit5.viz.ttr import NeuronSearch

__all__ = ["VIEWS", "AblationConfig", "CollectConfig", "LoadedImage", "MapStyle", "MetricConfig"]
__all__ += ["NeuronSearch", "PlantSpec", "PositionProbeConfig", "RunConfig", "TokenStats"]
__all__ += ["ablation_figure"]
__all__ += ["capture", "collect", "compute_metrics", "describe", "load_images"]
__all__ += ["load_thresholds", "parse_overrides", "position_figure", "run_ablation", "run_compare"]
__all__ += ["run_model", "run_position_probe", "run_ttr", "save_figure", "to_batch", "write_probes"]

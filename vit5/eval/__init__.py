"""Evaluation and dense features for vit5 and timm ViTs.

* :func:`load_models` - a model spec (checkpoint directory with raw + EMA weights, official
  ``.pth``, preset, ``timm:NAME@CHECKPOINT``) to models with their preprocessing;
* :func:`evaluate` / :func:`run_sweep` - ImageFolder classification metrics (Accelerate-aware)
  and accuracy against input resolution;
* :func:`iter_features` / :func:`export_features` / :func:`read_features` - per-image dense
  features (patch grids, CLS, registers of chosen blocks), in memory or as resumable safetensors;
* :func:`run_probes` / :func:`run_segmentation_probe` - kNN, logistic-regression and dense
  linear segmentation probes on frozen features.

The command line is ``python -m eval {classify,sweep,features,probe,segprobe,make-seg}``.
"""

from vit5.data.segmentation import SegDatasetInfo, dataset_info, default_splits, list_pairs, read_mask
from vit5.eval.backbone import dense_features
from vit5.eval.classify import (
    ClassifyResult,
    ClassifySettings,
    evaluate,
    open_split,
    per_class_table,
    summary_table,
)
from vit5.eval.export import ExportSummary, export_features, read_features, read_manifest
from vit5.eval.features import FailedImage, FeatureSettings, ImageFeatures, extract, iter_features
from vit5.eval.load import LoadedModel, load_models
from vit5.eval.metrics import (
    ClassificationMeter,
    ClassificationScores,
    SegmentationScores,
    confusion_matrix,
    segmentation_scores,
)
from vit5.eval.probes import ProbeRow, ProbeSettings, knn_accuracy, logreg_accuracy, probe_table, run_probes
from vit5.eval.segmentation import SegProbeResult, SegProbeSettings, run_segmentation_probe, seg_tables
from vit5.eval.sweep import run_sweep, sizes_from_scales, sweep_plot, sweep_records, sweep_table

__all__ = [
    "ClassificationMeter",
    "ClassificationScores",
    "ClassifyResult",
    "ClassifySettings",
    "ExportSummary",
    "FailedImage",
    "FeatureSettings",
    "ImageFeatures",
    "LoadedModel",
    "ProbeRow",
    "ProbeSettings",
    "SegDatasetInfo",
    "SegProbeResult",
    "SegProbeSettings",
    "SegmentationScores",
    "confusion_matrix",
    "dataset_info",
    "default_splits",
    "dense_features",
    "evaluate",
    "export_features",
    "extract",
    "iter_features",
    "knn_accuracy",
    "list_pairs",
    "load_models",
    "logreg_accuracy",
    "open_split",
    "per_class_table",
    "probe_table",
    "read_features",
    "read_manifest",
    "read_mask",
    "run_probes",
    "run_segmentation_probe",
    "run_sweep",
    "seg_tables",
    "segmentation_scores",
    "sizes_from_scales",
    "summary_table",
    "sweep_plot",
    "sweep_records",
    "sweep_table",
]

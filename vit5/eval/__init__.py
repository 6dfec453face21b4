"""Evaluation and dense features for vit5 and timm ViTs: classification metrics and resolution sweeps,
per-image dense features (in memory or as resumable safetensors), kNN / logistic-regression and dense
segmentation probes. Command line: ``vit5 eval {classify,sweep,features,probe,segprobe,make-seg}``."""

from vit5.data.segmentation import SegDatasetInfo, dataset_info, default_splits, list_pairs, read_mask
from vit5.eval.classify import ClassifySettings, evaluate, open_split, per_class_table, summary_table
from vit5.eval.export import export_features, read_features, read_manifest
from vit5.eval.features import FeatureSettings, iter_features
from vit5.eval.figures import sweep_plot
from vit5.eval.load import LoadedModel, load_models
from vit5.eval.metrics import ClassificationMeter, confusion_matrix, segmentation_scores
from vit5.eval.probes import ProbeSettings, knn_accuracy, logreg_accuracy, probe_table, run_probes
from vit5.eval.segmentation import SegProbeSettings, run_segmentation_probe, seg_tables
from vit5.eval.sweep import run_sweep, sizes_from_scales, sweep_records, sweep_table

__all__ = [
    "ClassificationMeter",
    "ClassifySettings",
    "FeatureSettings",
    "LoadedModel",
    "ProbeSettings",
    "SegDatasetInfo",
    "SegProbeSettings",
    "confusion_matrix",
    "dataset_info",
    "default_splits",
    "evaluate",
    "export_features",
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

"""Evaluation and dense features for vit5 and timm ViTs: classification metrics and resolution sweeps,
per-image dense features (in memory or as resumable safetensors), kNN / logistic-regression and dense
segmentation probes. Command line: ``vit5 eval {classify,sweep,features,probe,segprobe,make-seg}``."""
# ruff: noqa: F401 (the re-exports are the public names)

from vit5.data.segmentation import (
    SegDatasetInfo,
    dataset_info,
    default_splits,
    list_pairs,
    read_mask,
)
from vit5.eval.classify import (
    ClassificationMeter,
    ClassifySettings,
    evaluate,
    open_split,
    per_class_table,
    run_sweep,
    sizes_from_scales,
    summary_table,
    sweep_plot,
    sweep_records,
    sweep_table,
)
from vit5.eval.common import LoadedModel, confusion_matrix
from vit5.eval.features import (
    FeatureSettings,
    export_features,
    iter_features,
    read_features,
    read_manifest,
)
from vit5.eval.probes import (
    ProbeSettings,
    SegProbeSettings,
    knn_accuracy,
    logreg_accuracy,
    probe_table,
    run_probes,
    run_segmentation_probe,
    seg_tables,
    segmentation_scores,
)
from vit5.outputs import write_json  # the one JSON writer, long reachable here too

"""Training and fine-tuning of ViT-5 with HF Accelerate: the DeiT-III-style recipe of arXiv 2602.08071
and github.com/wangf3014/ViT-5. ``Trainer(load_config("vit5_small_in1k", ["data.root=..."])).fit()``;
the command line is ``vit5 train`` (:mod:`vit5.cli.train`).
"""

from vit5.train.config import TrainConfig, config_to_yaml, load_config, validate_config
from vit5.train.errors import (
    EXIT_DIVERGED,
    EXIT_USER_ERROR,
    ResumeError,
    TrainConfigError,
    TrainingDiverged,
    TrainingInterrupted,
)
from vit5.train.trainer import Trainer

__all__ = [
    "EXIT_DIVERGED",
    "EXIT_USER_ERROR",
    "ResumeError",
    "TrainConfig",
    "TrainConfigError",
    "Trainer",
    "TrainingDiverged",
    "TrainingInterrupted",
    "config_to_yaml",
    "load_config",
    "validate_config",
]

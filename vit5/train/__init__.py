"""Training and fine-tuning of ViT-5 with HF Accelerate (the DeiT-III-style recipe of ViT-5,
arXiv 2602.08071, and its official code github.com/wangf3014/ViT-5).

    from vit5.train import Trainer, load_config
    cfg = load_config("vit5_small_in1k", ["data.root=/data/imagenet"])
    summary = Trainer(cfg).fit()

The command line is ``vit5 train [--config RECIPE] [--resume [DIR]] [key=value ...]``
(:mod:`vit5.cli.train`). The modules: :mod:`~vit5.train.config` (the settings, loading and checks),
:mod:`~vit5.train.loop` and :mod:`~vit5.train.optim` (a training step: targets, loss, accumulation;
optimizer, lr schedule, EMA), :mod:`~vit5.train.modeling` (fresh or pretrained model),
:mod:`~vit5.train.data`, :mod:`~vit5.train.evaluate`, :mod:`~vit5.train.rundir` and
:mod:`~vit5.train.checkpointing` (the run directory and its resumable checkpoints),
:mod:`~vit5.train.trainer` (the run that wires them).
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

"""Training and fine-tuning of ViT-5 with HF Accelerate (DeiT-III / ViT-5 recipe, reference §3).

    from vit5.train import Trainer, load_config
    cfg = load_config("configs/vit5_small_in1k.yaml", ["data.root=/data/imagenet"])
    summary = Trainer(cfg).fit()

The command line is ``python train.py [--config FILE] [--resume [DIR]] [key=value ...]``
(:mod:`vit5.train.cli`).
"""

from vit5.train.config import TrainConfig
from vit5.train.config_checks import validate_config
from vit5.train.config_load import config_to_yaml, load_config
from vit5.train.errors import ResumeError, TrainConfigError, TrainingDiverged
from vit5.train.trainer import Trainer

__all__ = [
    "ResumeError",
    "TrainConfig",
    "TrainConfigError",
    "Trainer",
    "TrainingDiverged",
    "config_to_yaml",
    "load_config",
    "validate_config",
]

"""``vit5 train [--config RECIPE] [--resume [DIR]] [key=value ...]``: the digits demo without arguments, a
packaged recipe or YAML file with overrides, or a run continued from its last checkpoint (an older
checkpoint continues in a new run directory ``DIR-2``). Exit statuses (docs/training.md): 0 completed,
2 user error, 3 diverged, 128 + the signal number after a stop signal and a checkpoint.
"""

from __future__ import annotations

import argparse
import warnings
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING

from vit5.cli import Parser, opt, run_main
from vit5.runtime import print_main

if TYPE_CHECKING:
    from vit5.train.config import TrainConfig

DEMO_RECIPE = "demo_digits"  # vit5.train.config.DEMO_RECIPE, named here so --help loads no torch


def parse_args(argv: Sequence[str] | None, prog: str = "vit5 train") -> argparse.Namespace:
    parser = Parser(
        prog=prog,
        description="Train or fine-tune a ViT-5 with Accelerate (no arguments: the built-in digits demo).",
        epilog="example: accelerate launch -m vit5 train --config vit5_small_in1k data.root=/data/imagenet",
    )
    config = f"a packaged recipe (`vit5 list recipes` names them) or a YAML file (default: {DEMO_RECIPE})"
    opt(parser, "--config", None, config)
    resume = (
        "continue a run directory or checkpoint; without DIR: run.output_dir/run.name of the config"
    )
    opt(parser, "--resume", None, resume, nargs="?", const="", metavar="DIR")
    parser.add_argument(
        "overrides",
        nargs="*",
        metavar="key=value",
        help="settings, e.g. optim.lr=1e-3",
    )
    args = parser.parse_args(argv)
    if (
        args.resume and "=" in args.resume and not Path(args.resume).exists()
    ):  # `--resume key=value`
        args.overrides.insert(0, args.resume)
        args.resume = ""
    return args


# settings a checkpoint's state depends on: the architecture, the optimizer's state layout, the
# number of micro-batches per step and per epoch (the resume position), and what the EMA holds
FROZEN_ON_RESUME = tuple(
    "model.name model.img_size model.num_classes model.overrides data.dataset data.batch_size "
    "data.train_split optim.name optim.accum_steps ema.enabled aug.repeated_aug aug.ra_selected_round "
    "data.class_names".split(),
)


def resolve(
    args: argparse.Namespace, default_config: str | Path = DEMO_RECIPE
) -> tuple[TrainConfig, Path | None, list[str]]:
    """The config to run, the checkpoint to resume from (or None) and notes to print."""
    from vit5.train.checkpointing import checkpoint_config, resolve_resume
    from vit5.train.config import config_diff, config_from_dict, load_config
    from vit5.train.errors import ResumeError, TrainConfigError
    from vit5.train.rundir import CONFIG_FILE

    if args.resume is None:
        return load_config(args.config or default_config, args.overrides), None, []
    if args.resume == "":
        cfg = load_config(args.config or default_config, args.overrides)
        run_dir = Path(cfg.run.output_dir).expanduser() / cfg.run.name
    elif args.config is not None:
        raise TrainConfigError(
            "--resume DIR runs with DIR's own config.yaml; drop --config (key=value still overrides)",
        )
    else:
        run_dir = Path(args.resume).expanduser()
    run_dir, checkpoint = resolve_resume(run_dir)
    # the reference is the config the checkpoint was written with (recorded in it), not the run's
    # editable config.yaml: an edit there is a change like any key=value
    saved = config_from_dict(checkpoint_config(checkpoint), where=f"{checkpoint}/checkpoint.json")
    cfg = load_config(run_dir / CONFIG_FILE, args.overrides)
    changes = config_diff(saved, cfg)
    frozen = [line for line in changes if line.startswith(FROZEN_ON_RESUME)]
    if frozen:
        raise ResumeError(
            f"--resume cannot change {'; '.join(frozen)} (set in {run_dir / CONFIG_FILE} or on the command "
            "line): the checkpoint's model, optimizer state and position in the epoch depend on them. Start "
            f"a new run from its weights instead (model.pretrained={run_dir}/final)",
        )
    return cfg, checkpoint, [f"changed on resume: {line}" for line in changes]


def main(argv: Sequence[str] | None = None, prog: str = "vit5 train") -> int:
    return run_main(lambda argv: parse_args(argv, prog), argv, _train)


def _train(args: argparse.Namespace) -> int:
    from vit5.train.config import ConfigAdjusted
    from vit5.train.errors import EXIT_DIVERGED, TrainingDiverged, TrainingInterrupted
    from vit5.train.trainer import Trainer

    with warnings.catch_warnings(record=True) as adjusted:
        warnings.simplefilter("always", ConfigAdjusted)
        cfg, checkpoint, notes = resolve(args)
    for w in adjusted:
        if issubclass(w.category, ConfigAdjusted):
            print_main(f"note: {w.message}")
        else:
            warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)
    for note in notes:
        print_main(note)
    try:
        Trainer(cfg, resume=checkpoint).fit()
    except TrainingDiverged as e:
        print_main(f"error: {e}", err=True)
        return EXIT_DIVERGED
    except TrainingInterrupted as e:
        print_main(f"stopped: {e}", err=True)
        return e.exit_code
    return 0

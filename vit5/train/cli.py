"""``python train.py [--config FILE] [--resume [DIR]] [key=value ...]``

* no arguments: the built-in digits demo (``configs/demo_digits.yaml``);
* ``--config FILE``: a recipe, e.g. ``configs/vit5_small_in1k.yaml``; ``key=value`` overrides any
  setting (``data.root=/data/imagenet optim.lr=3e-3 model.overrides.depth=6``);
* ``--resume DIR``: continue the run in ``DIR`` (or the checkpoint ``DIR/checkpoints/ckpt-N``)
  exactly where its last checkpoint left it, with the run's own ``config.yaml`` (``key=value``
  may still change settings, e.g. ``schedule.epochs``); ``--resume`` alone continues
  ``run.output_dir/run.name`` of the config. An older checkpoint (newer ones exist) continues in
  a new run directory ``DIR-2``; nothing of ``DIR`` is changed.

Launch on several GPUs / nodes with ``accelerate launch train.py ...``. User errors (config, data,
a damaged checkpoint, a full or read-only disk, a run in use) exit with status 2 and one ``error:``
line naming the fix; a diverged run exits with status 1.
"""

from __future__ import annotations

import argparse
import os
import sys
from collections.abc import Sequence
from pathlib import Path

from vit5.errors import Vit5Error, safe_console, user_message
from vit5.train.checkpointing import checkpoint_config, resolve_resume
from vit5.train.config import TrainConfig
from vit5.train.config_load import config_diff, config_from_dict, load_config
from vit5.train.errors import ResumeError, TrainConfigError, TrainingDiverged
from vit5.train.rundir import CONFIG_FILE


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="train.py",
        description="Train or fine-tune a ViT-5 with Accelerate (no arguments: the built-in digits demo).",
        epilog="example: accelerate launch train.py --config configs/vit5_small_in1k.yaml "
        "data.root=/data/imagenet",
    )
    parser.add_argument("--config", type=Path, help="YAML recipe (default: configs/demo_digits.yaml)")
    parser.add_argument(
        "--resume",
        nargs="?",
        const="",
        default=None,
        metavar="DIR",
        help="continue a run directory or checkpoint; without DIR: run.output_dir/run.name of the config",
    )
    parser.add_argument(
        "overrides", nargs="*", metavar="key=value", help="setting overrides, e.g. optim.lr=1e-3"
    )
    args = parser.parse_args(argv)
    if (
        args.resume and "=" in args.resume and not Path(args.resume).exists()
    ):  # `--resume key=value`: no DIR given
        args.overrides.insert(0, args.resume)
        args.resume = ""
    return args


# settings a checkpoint's state depends on: the architecture, the optimizer's state layout, the
# number of micro-batches per step and per epoch (the resume position), and what the EMA holds
FROZEN_ON_RESUME = (
    "model.name",
    "model.img_size",
    "model.num_classes",
    "model.overrides",
    "data.dataset",
    "data.batch_size",
    "data.train_split",
    "optim.name",
    "optim.accum_steps",
    "ema.enabled",
    "aug.repeated_aug",
    "aug.ra_selected_round",
)


def resolve(args: argparse.Namespace, default_config: Path) -> tuple[TrainConfig, Path | None, list[str]]:
    """The config to run, the checkpoint to resume from (or None) and notes to print."""
    if args.resume is None:
        return load_config(args.config or default_config, args.overrides), None, []
    if args.resume == "":
        cfg = load_config(args.config or default_config, args.overrides)
        run_dir = Path(cfg.run.output_dir).expanduser() / cfg.run.name
    elif args.config is not None:
        raise TrainConfigError(
            "--resume DIR runs with DIR's own config.yaml; drop --config (key=value still overrides)"
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
            "line): "
            "the checkpoint's model, optimizer state and position in the epoch depend on them. Start a new "
            "run "
            f"from its weights instead (model.pretrained={run_dir}/final)"
        )
    return cfg, checkpoint, [f"changed on resume: {line}" for line in changes]


def main(argv: Sequence[str] | None = None, default_config: Path | None = None) -> int:
    """Entry point of ``train.py``; returns the process exit status."""
    from vit5.train.trainer import Trainer  # heavy imports after argument errors

    safe_console()
    args = parse_args(argv)
    default = default_config or Path.cwd() / "configs" / "demo_digits.yaml"
    try:
        cfg, checkpoint, notes = resolve(args, default)
        for note in notes:
            _print_main(note)
        Trainer(cfg, resume=checkpoint).fit()
    except TrainingDiverged as e:
        _print_main(f"error: {e}", err=True)
        return 1
    except (Vit5Error, OSError) as e:  # a user error (bad input, a full or read-only disk): one line
        _print_main(f"error: {user_message(e)}", err=True)
        return 2
    return 0


def _print_main(message: str, err: bool = False) -> None:
    """Print once per job, not once per process (before Accelerate is up, read the launcher's rank)."""
    if int(os.environ.get("RANK", "0")) == 0:
        print(message, file=sys.stderr if err else sys.stdout, flush=True)

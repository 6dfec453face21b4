"""``python train.py [--config RECIPE] [--resume [DIR]] [key=value ...]``: the same as ``vit5 train``
(:mod:`vit5.cli.train`); with no arguments it trains ``vit5_tiny`` on the built-in digits."""

import os
import sys

# Idle OpenMP threads sleep instead of spinning: on a CPU shared with other jobs, spinning threads
# stall every op (we measured 3x slower CPU training); set before torch loads OpenMP.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from vit5.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(["train", *sys.argv[1:]]))

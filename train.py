"""Train or fine-tune a ViT-5: ``python train.py [--config FILE] [--resume [DIR]] [key=value ...]``.

With no arguments it trains ``vit5_tiny`` on the built-in digits (``configs/demo_digits.yaml``).
Multi-GPU / multi-node: ``accelerate launch train.py --config configs/vit5_small_in1k.yaml
data.root=/path/to/imagenet``. See ``vit5/train/cli.py`` for the options.
"""

import os
import sys
from pathlib import Path

# Idle OpenMP threads sleep instead of spinning: on a CPU shared with other jobs, spinning threads
# stall every op (we measured 3x slower CPU training); on an idle machine it costs nothing visible.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

from vit5.train.cli import main  # noqa: E402

if __name__ == "__main__":
    sys.exit(main(default_config=Path(__file__).resolve().parent / "configs" / "demo_digits.yaml"))

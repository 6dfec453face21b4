"""The viz walk (docs/architecture.md, "The viz walk"): `vit5 viz attention` traced in process
from the model spec to the saved figure. Counted: the vit5 files in which a function is called
after the command starts; code that runs while a module is imported does not count (a call with
a module body on the stack between it and the command). The model is described once, its
recorded attention checked against the memory once."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter
from pathlib import Path

import numpy as np
from viz_support import write_png

import vit5
from vit5.cli import main

PACKAGE = Path(vit5.__file__).parent
# the network built and run: vit5/model and vit5/layers (the model wing, kept as it is)
NETWORK = ("model/", "layers/")
# measured: 19 files outside the network, 31 with it (18 before the outlier rule moved to
# eval/outliers.py, the one rule the viz metrics and the feature export share); see "The viz walk"
# in docs/architecture.md
WALK_LIMIT = 19


def trace(argv: list[str]) -> tuple[int, Counter, list[str]]:
    """Run ``main(argv)`` under ``sys.setprofile``: its exit status, the calls per (file, function)
    and the files of the calls in order (import-time execution left out)."""
    calls: Counter = Counter()
    order: list[str] = []
    root = f"{PACKAGE}/"
    start = sys._getframe()

    def profile(frame, event, arg) -> None:
        if event != "call" or not frame.f_code.co_filename.startswith(root):
            return
        outer = frame
        while outer is not None and outer is not start:
            if outer.f_code.co_name == "<module>":
                return  # a module being imported
            outer = outer.f_back
        name = frame.f_code.co_filename[len(root) :]
        calls[(name, frame.f_code.co_name)] += 1
        order.append(name)

    sys.setprofile(profile)
    try:
        status = main(argv)
    finally:
        sys.setprofile(None)
    return status, calls, order


def test_the_viz_walk_describes_once_and_visits_few_files(tmp_path):
    rgb = (np.random.default_rng(0).random((32, 32, 3)) * 255).astype(np.uint8)
    image = write_png(tmp_path / "image.png", rgb)
    out = tmp_path / "out"
    argv = [
        "viz",
        "attention",
        "--model",
        "vit5_tiny",
        "--random-init",
        "--model-args",
        "depth=2",
        "img_size=32",
        "--images",
        str(image),
        "--out",
        str(out),
        "--quiet",
        "--formats",
        "png",
    ]
    status, calls, _ = trace(argv)
    assert status == 0
    assert (out / "images" / "image" / "cls_attention.png").is_file()  # the figure
    describes = calls[("introspect/describe.py", "describe")]
    assert describes == 1, f"describe ran {describes} times"
    memory_checks = calls[("viz/runner.py", "check_recording_memory")]
    assert memory_checks == 1, f"the recording memory was checked {memory_checks} times"
    files = sorted({name for name, _ in calls})
    walk = [name for name in files if not name.startswith(NETWORK)]
    listed = "\n  ".join(walk)
    assert len(walk) <= WALK_LIMIT, f"{len(walk)} files outside the network:\n  {listed}"
    assert "eval/common.py" not in files  # viz does not load through eval


def test_describing_a_model_imports_no_loader():
    # the package root's timm hook, where present, registers the presets through the factory as
    # soon as timm is imported (issue 30 removes it); what is tested here is introspect's imports
    code = (
        "import sys, vit5\n"
        "hook = getattr(vit5, '_HOOK', None)\n"
        "if hook in sys.meta_path:\n"
        "    sys.meta_path.remove(hook)\n"
        "import vit5.introspect\n"
        "vit5.introspect.describe\n"
        "print('vit5.weights.factory' in sys.modules, 'vit5.introspect.load' in sys.modules)"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, check=True
    )
    assert result.stdout.split() == ["False", "False"], result.stdout

"""The ``recording`` section: peak memory and time of recording one image's attention for the
figures (:func:`vit5.viz.collect.collect`, what ``vit5 viz attention`` runs before drawing),
lean (:func:`vit5.viz.collect.figure_keep`) against the full ``N x N`` capture, for
``vit5_small`` and timm's DINOv3-S (random weights: no network). Each case runs in a fresh
process, so its peak resident memory (``ru_maxrss``) is its own."""

from __future__ import annotations

import json
import resource
import subprocess
import sys
import time
from dataclasses import dataclass

import numpy as np

from vit5.bench.measure import BenchContext
from vit5.bench.report import Section, Table, Target
from vit5.runtime import format_bytes

MODELS = ("vit5_small", "timm:vit_small_patch16_dinov3")
GOAL_1024 = 1.5 * 2**30  # vit5 viz attention on one 1024 px image (issue 29)
GOAL_2048 = 24 * 2**30
COLUMNS = ("model", "size", "recording", "peak RSS", "seconds", "estimate")


@dataclass(frozen=True)
class Case:
    model: str
    size: int
    full: bool
    # the rollout row (vit5 viz attention draws it; viz norms, pca and metrics do not)
    rollout: bool = True

    @property
    def mode(self) -> str:
        if self.full:
            return "full"
        return "lean" if self.rollout else "lean, no rollout"


def cases(sizes: tuple[int, ...], full_up_to: int) -> list[Case]:
    """Every model at every size, lean with and without the rollout; full only up to
    ``full_up_to`` px (N x N grows)."""
    found = []
    for size in sizes:
        for model in MODELS:
            found.append(Case(model=model, size=size, full=False))
            found.append(Case(model=model, size=size, full=False, rollout=False))
            if size <= full_up_to:
                found.append(Case(model=model, size=size, full=True))
    return found


def run_case(
    model: str, size: int, full: bool, depth: int | None = None, rollout: bool = True
) -> dict:
    """Record one random image at ``size`` x ``size`` (in this process; ``depth``: fewer
    blocks, for smoke runs; with the ``rollout`` or not) and report the time, the process's
    peak RSS and the memory check's estimate."""
    import torch

    from vit5.introspect.load import load_spec
    from vit5.viz.collect import CollectConfig, collect
    from vit5.viz.images import LoadedImage
    from vit5.viz.runner import recording_estimate

    torch.manual_seed(0)
    overrides = {"depth": depth} if depth else None
    loaded = load_spec(model, overrides, random_init=True)
    rgb = np.random.default_rng(0).integers(0, 256, (size, size, 3), dtype=np.uint8)
    image = LoadedImage("random", rgb)
    cfg = CollectConfig(batch_size=1, progress=False, full_attention=full, rollout=rollout)
    start = time.perf_counter()
    collect(loaded.model, [image], model, cfg, loaded.info)
    seconds = time.perf_counter() - start
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024  # KiB on Linux
    estimate = recording_estimate(loaded.info, (size, size), 1, rollout)
    return {"seconds": seconds, "peak": peak, "estimate": estimate}


def measure_case(case: Case, threads: int | None, depth: int | None) -> dict:
    """:func:`run_case` in a fresh Python process (its own peak memory)."""
    call = f"run_case({case.model!r}, {case.size}, {case.full}, {depth}, {case.rollout})"
    code = "\n".join(
        [
            "import json, torch",
            f"torch.set_num_threads({threads or 0} or torch.get_num_threads())",
            "from vit5.bench.recording import run_case",
            f"print(json.dumps({call}))",
        ]
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    if done.returncode:
        return {"error": done.stderr.strip().splitlines()[-1]}
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(
    ctx: BenchContext, sizes: tuple[int, ...] = (1024, 2048), full_up_to: int = 1024
) -> Section:
    """The section; a smoke run (a depth override) records at its high-res image size."""
    depth = ctx.cfg.depth
    if depth is not None:
        sizes = (ctx.cfg.hires_img_size,)
        full_up_to = ctx.cfg.hires_img_size
    rows = []
    results = {}
    for case in cases(sizes, full_up_to):
        ctx.log(f"recording {case.model} at {case.size} px, {case.mode}")
        found = measure_case(case, ctx.cfg.threads, depth)
        results[f"{case.model}@{case.size}/{case.mode}"] = found
        if "error" in found:
            rows.append((case.model, case.size, case.mode, found["error"], "", ""))
            continue
        rows.append(
            (
                case.model,
                case.size,
                case.mode,
                format_bytes(found["peak"]),
                f"{found['seconds']:.1f}",
                format_bytes(found["estimate"]),
            )
        )
    targets = []
    for size, goal in ((1024, GOAL_1024), (2048, GOAL_2048)):
        found = results.get(f"vit5_small@{size}/lean", {})
        if "peak" in found:
            name = f"vit5_small, one {size} px image, lean: peak RSS"
            targets.append(Target(name, found["peak"] / 2**30, goal / 2**30, False, "GiB"))
    return Section(
        key="recording",
        title="Attention recording: lean against full",
        what=(
            "One random image through collect() (the recording and reduction of vit5 viz "
            "attention, figures not drawn), batch 1, random weights, each case in a fresh "
            "process. Peak RSS includes Python, torch and the model; the estimate is the memory "
            "check's lower bound of the lean recording."
        ),
        tables=[Table("Peak memory and time", COLUMNS, tuple(rows))],
        targets=targets,
        data={"cases": results},
    )

"""ONNX Runtime against eager torch: CPU images/s of the same exported model, side by side.

``vit5_<size>`` at the profile's resolution (``vit5_small`` at 224 in the quick and full profiles;
random weights, this measures speed only) is written with :func:`vit5.export_onnx`, which checks
onnxruntime's outputs against torch, and both forward the same batch in interleaved rounds
(:mod:`vit5.bench.timing`). Both run on the CPU in fp32 with the same number of intra-op threads.
"""

from __future__ import annotations

import torch

import vit5
from vit5.bench.context import BenchContext
from vit5.bench.results import Section, Table
from vit5.bench.timing import measure, speedup


def _session(path, threads: int):
    import onnxruntime

    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    options.inter_op_num_threads = 1
    return onnxruntime.InferenceSession(str(path), options, providers=["CPUExecutionProvider"])


def run(ctx: BenchContext) -> Section:
    cfg = ctx.cfg
    size, img = cfg.size_for_targets, cfg.img_size
    name = f"vit5_{size}"
    section = Section(
        "export",
        "ONNX Runtime against eager torch (CPU)",
        f"Forward images/s of {name} at {img}x{img}, batch {cfg.batch}, fp32 on the CPU: the eager torch "
        "model and its ONNX export run by onnxruntime, timed side by side; 'x torch' is the paired speed-up "
        "over eager torch (> 1: faster).",
    )
    model = vit5.create_model(name, img_size=img, **({"depth": cfg.depth} if cfg.depth else {})).eval()
    ctx.log(f"exporting {name} @ {img} to ONNX (and checking it with onnxruntime)")
    path = ctx.out_dir / "export" / f"{name}_{img}.onnx"
    report = vit5.export_onnx(model, path, size=(img, img), batch=cfg.batch)
    threads = torch.get_num_threads()
    session = _session(path, threads)
    images = torch.randn(cfg.batch, 3, img, img)
    feed = {session.get_inputs()[0].name: images.numpy()}

    def torch_forward() -> None:
        with torch.no_grad():
            model(images)

    ctx.log(f"timing torch eager and onnxruntime ({cfg.timing.rounds} rounds, {threads} threads)")
    samples = measure(
        {"torch eager": torch_forward, "onnxruntime": lambda: session.run(None, feed)}, cfg.timing
    )
    rows = []
    for contender, s in samples.items():
        rate = s.rate(cfg.batch)
        ratio = speedup(s, samples["torch eager"]).median
        rows.append((contender, f"{rate.median:.1f} ({rate.q1:.1f}-{rate.q3:.1f})", f"{ratio:.2f}x"))
    columns = ("runtime", "images/s (IQR)", "x torch")
    section.tables.append(
        Table(f"{name} @ {img}, batch {cfg.batch}, CPU fp32, {threads} threads", columns, tuple(rows))
    )
    section.notes.append(
        f"Export: {report.seconds:.0f} s, {sum(f.stat().st_size for f in report.files) / 2**20:.1f} MiB; "
        "onnxruntime vs torch max "
        f"|difference| {report.max_abs_diff:.1e}."
    )
    if cfg.device != "cpu" or cfg.dtype != "fp32":
        section.notes.append(
            f"Measured on the CPU in fp32 whatever the run's device ({cfg.device}) and dtype ({cfg.dtype})."
        )
    section.data = {
        "model": name,
        "img_size": img,
        "batch": cfg.batch,
        "threads": threads,
        "max_abs_diff": report.max_abs_diff,
        "export_seconds": report.seconds,
        "samples": {k: s.to_dict() for k, s in samples.items()},
    }
    return section

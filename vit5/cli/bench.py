"""``vit5 bench``: speed, attention memory, compilation and export, measured side by side (``--quick``:
minutes on 2 idle CPU cores); ``vit5 bench data-pipeline``: OpenCV + albumentations against PIL."""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

from vit5.cli import Parser, opt, run_main

# the keys of vit5.bench.SECTIONS, named here so --help loads no torch
SECTIONS = ("speed", "memory", "compile", "export", "depth", "data_index", "recording")


def main(argv: list[str] | None = None, prog: str = "vit5 bench") -> int:
    """Exit status: 0 every section ran, 1 a section failed, 2 bad arguments or an unwritable --out."""
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["data-pipeline"]:
        what = "OpenCV + albumentations (vit5.data) against torchvision's PIL pipeline"
        p = Parser(prog=f"{prog} data-pipeline", description=what)
        opt(p, "--quick", False, "fewer files, rounds and steps (about a minute)")
        opt(p, "--out", Path, "also write the results as JSON")
        return run_main(p.parse_args, argv[1:], _data_pipeline)
    p = Parser(prog=prog, description=__doc__)
    mode = p.add_mutually_exclusive_group()
    opt(mode, "--quick", False, "few rounds, real model sizes; minutes on a CPU")
    opt(mode, "--smoke", False, "tiny models; seconds")
    opt(p, "--out", Path, "output directory (default runs/bench_<mode>)")
    opt(p, "--device", "cpu", "cpu or cuda")
    dtype = "fp32 or bf16 autocast (default: bf16 on cuda, fp32 on cpu)"
    opt(p, "--dtype", None, dtype, choices=("fp32", "bf16"))
    opt(p, "--threads", int, "CPU intra-op threads (default: PyTorch's)")
    opt(p, "--only", None, f"comma-separated sections: {','.join(SECTIONS)}")
    return run_main(p.parse_args, argv, _bench)


def _bench(args: argparse.Namespace) -> int:
    os.environ.setdefault("KINETO_LOG_LEVEL", "5")  # the CPU memory profiler's start-up chatter
    from vit5.bench import BenchConfig, run_bench, select_sections
    from vit5.bench.report import format_value
    from vit5.files import check_output_dir

    profile = "smoke" if args.smoke else "quick" if args.quick else "full"
    dtype = args.dtype or ("bf16" if args.device.startswith("cuda") else "fp32")
    threads = {"threads": args.threads} if args.threads is not None else {}
    cfg = BenchConfig.profile(profile, device=args.device, dtype=dtype, **threads)
    only = select_sections(
        [s.strip() for s in args.only.split(",") if s.strip()] if args.only else None,
    )
    out = check_output_dir(args.out or Path("runs") / f"bench_{profile}", "--out")
    if profile == "full" and cfg.device == "cpu":
        print(
            "note: the full profile is sized for a GPU; on a CPU it takes long. Use --quick for minutes.",
        )
    sections, md_path = run_bench(cfg, out, only)
    failed = [s.key for s in sections if s.title.endswith("(FAILED)")]
    targets = [t for s in sections for t in s.targets]
    print(f"\n{sum(t.met for t in targets)} of {len(targets)} targets met")
    for t in targets:
        verdict = "met" if t.met else "MISSED"
        print(f"  [{verdict}] {t.name}: {format_value(t.measured, t.unit)} (needs {t.rule})")
    if failed:
        print(f"failed sections: {', '.join(failed)}")
    print(f"report: {md_path} (and report.json, figures/)")
    return 1 if failed else 0


def _data_pipeline(args: argparse.Namespace) -> int:
    from vit5.bench import data_pipeline
    from vit5.bench.report import markdown_table
    from vit5.outputs import write_json

    section = data_pipeline.run(quick=args.quick)
    print("\n\n".join([section.title, *map(markdown_table, section.tables), *section.notes]))
    if args.out is not None:
        write_json(args.out, dataclasses.asdict(section))
    return 0

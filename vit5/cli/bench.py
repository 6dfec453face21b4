"""``vit5 bench``: speed, attention memory, compilation and export, measured side by side.

vit5 bench --quick --out runs/bench_quick          # minutes on 2 idle CPU cores
vit5 bench --device cuda --dtype bf16 --out runs/bench_gpu
vit5 bench --quick --only speed,compile
vit5 bench data-pipeline [--quick]                  # OpenCV + albumentations against torchvision's PIL
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys
from pathlib import Path

os.environ.setdefault("KINETO_LOG_LEVEL", "5")  # the CPU memory profiler's start-up chatter

import torch  # noqa: E402

from vit5.bench import data_pipeline  # noqa: E402
from vit5.bench.config import BenchConfig  # noqa: E402
from vit5.bench.report import format_value, markdown_table  # noqa: E402
from vit5.bench.runner import SECTIONS, run_bench, select_sections  # noqa: E402
from vit5.cli import Parser, run_command  # noqa: E402
from vit5.errors import Vit5Error, safe_console  # noqa: E402
from vit5.files import atomic_write_json, check_output_dir  # noqa: E402


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = Parser(
        prog="vit5 bench",
        description=__doc__.split("\n")[0],
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    mode = parser.add_mutually_exclusive_group()
    mode.add_argument("--quick", action="store_true", help="few rounds, real model sizes; minutes on a CPU")
    mode.add_argument("--smoke", action="store_true", help="tiny models; seconds")
    parser.add_argument("--out", type=Path, default=None, help="output directory (default runs/bench_<mode>)")
    parser.add_argument("--device", default="cpu", help="cpu or cuda (default cpu)")
    parser.add_argument(
        "--dtype",
        choices=("fp32", "bf16"),
        default=None,
        help="fp32 or bf16 autocast (default: bf16 on cuda, fp32 on cpu)",
    )
    parser.add_argument("--threads", type=int, default=None, help="CPU intra-op threads (default: torch's)")
    parser.add_argument("--only", default=None, help=f"comma-separated sections: {','.join(SECTIONS)}")
    return parser.parse_args(argv)


def config_from_args(args: argparse.Namespace) -> BenchConfig:
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise Vit5Error("--device cuda asked for, but torch sees no CUDA device: use --device cpu")
    profile = "smoke" if args.smoke else "quick" if args.quick else "full"
    dtype = args.dtype or ("bf16" if args.device.startswith("cuda") else "fp32")
    threads = {"threads": args.threads} if args.threads is not None else {}
    return BenchConfig.profile(profile, device=args.device, dtype=dtype, **threads)


def main(argv: list[str] | None = None) -> int:
    """Exit status: 0 every section ran, 1 a section failed, 2 bad arguments or an unwritable --out."""
    safe_console()
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["data-pipeline"]:
        return main_data_pipeline(argv[1:])
    args = parse_args(argv)
    return run_command(lambda: _bench(args))


def _bench(args: argparse.Namespace) -> int:
    cfg = config_from_args(args)
    only = [s.strip() for s in args.only.split(",") if s.strip()] if args.only else None
    select_sections(only)
    profile = "smoke" if args.smoke else "quick" if args.quick else "full"
    out = check_output_dir(args.out or Path("runs") / f"bench_{profile}", "--out")
    if profile == "full" and cfg.device == "cpu":
        print("note: the full profile is sized for a GPU; on a CPU it takes long. Use --quick for minutes.")
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


def main_data_pipeline(argv: list[str] | None = None) -> int:
    parser = Parser(prog="vit5 bench data-pipeline", description=data_pipeline.__doc__.split("\n")[0])
    parser.add_argument(
        "--quick", action="store_true", help="fewer files, rounds and steps (about a minute on CPU)"
    )
    parser.add_argument("--out", type=Path, help="also write the results as JSON")
    args = parser.parse_args(argv)
    section = data_pipeline.run(quick=args.quick)
    print("\n\n".join([section.title, *map(markdown_table, section.tables), *section.notes]))
    if args.out is not None:
        atomic_write_json(args.out, dataclasses.asdict(section))
    return 0

"""``vit5 export``: a model as an ONNX file checked with onnxruntime, and/or a torch.export program."""

from __future__ import annotations

import argparse
import io
from collections.abc import Sequence
from pathlib import Path

from vit5.cli import SIZE_HELP, Parser, add_model_options, load_models, parse_size, run_command

DEFAULT_ATOL = 1e-4  # vit5.weights.export.DEFAULT_ATOL, named here so --help loads no torch


def build_parser() -> argparse.ArgumentParser:
    p = Parser(
        prog="vit5 export",
        description="Export a model as an ONNX file checked with onnxruntime (and, with --program, a "
        "torch.export .pt2).",
        epilog="Example: vit5 export --model vit5_small --onnx vit5_small.onnx --size 224",
    )
    add_model_options(p, device=False)
    p.add_argument("--onnx", type=Path, help="write the ONNX file here")
    p.add_argument("--program", type=Path, help="also write the torch.export program here (.pt2)")
    p.add_argument("--size", type=parse_size, help=f"input size, {SIZE_HELP} (default: the model's own)")
    p.add_argument("--batch", type=int, default=2, help="example batch to trace and check with (default 2)")
    p.add_argument("--static-batch", action="store_true", help="fix the batch dimension at --batch")
    p.add_argument(
        "--dynamic-size",
        action="store_true",
        help="free height and width (patch multiples, from the model's own size upward)",
    )
    p.add_argument("--opset", type=int, help="ONNX opset (default: torch's)")
    p.add_argument(
        "--atol",
        type=float,
        default=DEFAULT_ATOL,
        help=f"onnxruntime vs torch tolerance (default {DEFAULT_ATOL:g})",
    )
    p.add_argument("--no-check", action="store_true", help="skip the onnxruntime check")
    return p


def main(argv: Sequence[str] | None = None) -> int:
    """``vit5 export``: returns 0, or 2 after one ``error:`` line on bad input."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.onnx is None and args.program is None:
        parser.error("nothing to write: give --onnx OUT.onnx and/or --program OUT.pt2")
    return run_command(lambda: _export_from_args(args))


def _export_from_args(args: argparse.Namespace) -> None:
    import torch

    from vit5.files import atomic_write_bytes, check_output_dir
    from vit5.weights.export import export_onnx, export_program

    (loaded,) = load_models(args)
    dynamic = {"dynamic_batch": not args.static_batch, "dynamic_size": args.dynamic_size}
    shapes = {"size": args.size, "batch": args.batch, **dynamic}
    print(f"model: {loaded.description}")
    if args.program is not None:
        program = export_program(loaded.model, **shapes)
        check_output_dir(args.program.parent, "the --program folder")
        # in memory first: torch's zip writer aborts the process when a write fails (full disk); the
        # atomic write then never replaces a good file by a partial one
        buffer = io.BytesIO()
        torch.export.save(program, buffer)
        atomic_write_bytes(args.program, buffer.getbuffer())
        print(f"wrote {args.program} (torch.export program)")
    if args.onnx is not None:
        print(f"exporting to ONNX{'' if args.no_check else ' and checking with onnxruntime'} ...", flush=True)
        check = not args.no_check
        print(export_onnx(loaded.model, args.onnx, opset=args.opset, check=check, atol=args.atol, **shapes))

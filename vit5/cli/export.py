"""``vit5 export``: a model as an ONNX file checked with onnxruntime, and/or a torch.export program."""

from __future__ import annotations

import argparse
import io
from collections.abc import Sequence
from pathlib import Path

from vit5.cli import (
    Parser,
    add_model_options,
    from_options,
    model_request,
    opt,
    run_main,
    size_option,
)

DEFAULT_ATOL = 1e-4  # vit5.weights.export.DEFAULT_ATOL, named here so --help loads no torch


def build_parser(prog: str = "vit5 export") -> argparse.ArgumentParser:
    p = Parser(
        prog=prog,
        description="Export a model as an ONNX file checked with onnxruntime (and, with --program, a "
        "torch.export .pt2).",
        epilog="Example: vit5 export --model vit5_small --onnx vit5_small.onnx --size 224",
        check=lambda a: (
            not (a.onnx or a.program)
            and "nothing to write: give --onnx OUT.onnx and/or --program OUT.pt2"
        ),
    )
    add_model_options(p, device=False)
    opt(p, "--onnx", Path, "write the ONNX file here")
    opt(p, "--program", Path, "also write the torch.export program here (.pt2)")
    size_option(p)
    opt(p, "--batch", 2, "example batch to trace and check with")
    opt(p, "--static-batch", False, "fix the batch dimension at --batch")
    free = "free height and width (patch multiples, from the model's own size upward)"
    opt(p, "--dynamic-size", False, free)
    opt(p, "--opset", int, "ONNX opset (default: torch's)")
    opt(p, "--atol", DEFAULT_ATOL, f"onnxruntime vs torch tolerance (default {DEFAULT_ATOL:g})")
    opt(p, "--no-check", False, "skip the onnxruntime check")
    return p


def main(argv: Sequence[str] | None = None, prog: str = "vit5 export") -> int:
    return run_main(build_parser(prog).parse_args, argv, _export)


def _export(args: argparse.Namespace) -> None:
    import torch

    from vit5.files import atomic_write_bytes, check_output_dir
    from vit5.introspect.load import load_models
    from vit5.weights.export import export_onnx, export_program

    (loaded,) = load_models(model_request(args))
    print(f"model: {loaded.description}")
    dynamic_batch = not args.static_batch
    if args.program is not None:
        program = from_options(
            export_program,
            args,
            model=loaded.model,
            dynamic_batch=dynamic_batch,
        )
        check_output_dir(args.program.parent, "the --program folder")
        # in memory first: torch's zip writer aborts the process when a write fails (full disk); the
        # atomic write then never replaces a good file by a partial one
        buffer = io.BytesIO()
        torch.export.save(program, buffer)
        atomic_write_bytes(args.program, buffer.getbuffer())
        print(f"wrote {args.program} (torch.export program)")
    if args.onnx is not None:
        check = not args.no_check
        checking = " and checking with onnxruntime" if check else ""
        print(f"exporting to ONNX{checking} ...", flush=True)
        onnx = from_options(
            export_onnx,
            args,
            model=loaded.model,
            path=args.onnx,
            dynamic_batch=dynamic_batch,
            check=check,
        )
        print(onnx)

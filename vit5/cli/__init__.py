"""The ``vit5`` command: one module per subcommand, imported only when asked for, whose ``main(argv, prog)``
returns the exit status (:func:`run_main`: 2 after one ``error:`` line on bad input), with parsers built
from the standard library alone (``--help`` and argument errors answer without loading torch), and what
they share."""

from __future__ import annotations

import argparse
import importlib
import inspect
import itertools
import os
import re
import shutil
import sys
import warnings
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from vit5.errors import ESCAPE_UNDECODABLE, InputError, Vit5Error, user_message
from vit5.runtime import DEVICE_HELP, end_process_group, keep_freed_memory, print_main

if TYPE_CHECKING:
    from vit5.introspect.load import ModelRequest

# name -> (module whose main(argv, prog) runs it, one-line summary)
COMMANDS: dict[str, tuple[str, str]] = {
    "train": (
        "vit5.cli.train",
        "train or fine-tune a ViT-5 (no arguments: the built-in digits demo)",
    ),
    "eval": (
        "vit5.cli.eval",
        "classification metrics, resolution sweeps, dense features and probes",
    ),
    "viz": (
        "vit5.cli.viz",
        "attention maps, token norms, register metrics, ablations, the register study",
    ),
    "data": ("vit5.cli.data", "ImageFolder trees (the digits, Fashion-MNIST) or WebDataset shards"),
    "bench": ("vit5.cli.bench", "speed, memory and FLOPs benchmarks with a report"),
    "ablate": (
        "vit5.cli.ablate",
        "component ablation: train each variant, compare accuracy and speed",
    ),
    "export": (
        "vit5.cli.export",
        "export a model to ONNX (checked with onnxruntime) or torch.export",
    ),
    "predict": (
        "vit5.cli.predict",
        "top-k class names and probabilities for each image of a folder",
    ),
    "list": (
        "vit5.cli.catalog",
        "the model presets, the released weights and the packaged training recipes",
    ),
}
SIZE_HELP = "input size, N or HxW (height x width, patch multiples; e.g. 224 or 96x128)"
DEFAULT_MAX_PARAMS = (
    2_000_000_000  # vit5.model.footprint's, named here so that --help loads no torch
)
MODEL_HELP = (
    "model spec: a vit5 preset with its released weights (vit5_small) or a released name "
    "(vit5_base_patch16_384.in1k), PRESET@CHECKPOINT, a vit5 checkpoint directory, a checkpoint file "
    "(official ViT-5 .pth), hf-hub:USER/REPO, timm:NAME[.TAG][@CHECKPOINT] (timm's pretrained weights "
    "unless @CHECKPOINT), or transformers:USER/REPO or transformers:FOLDER (a save_pretrained folder; "
    "safetensors only, needs the transformers extra)"
)


class Parser(argparse.ArgumentParser):
    """An argument parser whose help is plain text (the reST markup of docstrings used as descriptions is
    dropped), whose subcommands report their own unknown options with their usage (argparse leaves them
    to the top parser), and whose ``check(args)`` names a usage error of the parsed options, if any."""

    def __init__(self, *args: Any, check: Callable = lambda args: None, **kwargs: Any):
        super().__init__(*args, **kwargs)
        self.check = check

    def parse_known_args(self, args=None, namespace=None):
        namespace, extras = super().parse_known_args(args, namespace)
        problem = f"unrecognized arguments: {' '.join(extras)}" if extras else self.check(namespace)
        if problem:
            self.error(problem)
        return namespace, extras

    def format_help(self) -> str:
        return re.sub(r":[a-z]+:`~?([^`]+)`", r"\1", super().format_help()).replace("``", "")


def opt(p: Any, flag: str, default: Any = None, help: str | None = None, **kwargs: Any) -> None:
    """``p.add_argument(flag)`` typed by ``default``: a type or parse function is the type (no
    default), a number gives its type, a list ``nargs="+"`` of its items' type, ``False`` a switch
    that turns something on (name the option for what it does: ``--quiet``, ``--no-check``); a
    help that does not mention the default gets it appended."""
    if callable(default):
        kwargs["type"] = kwargs.get("type", default)
        default = None
    elif isinstance(default, bool):
        if default:
            raise TypeError(f"{flag}: a switch turns something on; name it for what it does")
        kwargs.setdefault("action", "store_true")
    elif isinstance(default, list):
        kwargs.setdefault("nargs", "+")
        if default and not isinstance(default[0], str):
            kwargs.setdefault("type", type(default[0]))
    elif isinstance(default, (int, float)):
        kwargs.setdefault("type", type(default))
    shown = default not in (None, []) and not isinstance(default, bool)
    if help and "default" not in help and shown:
        value = " ".join(map(str, default)) if isinstance(default, list) else default
        help += f" (default {value})"
    p.add_argument(flag, default=default, help=help, **kwargs)


def add_model_options(
    p: argparse.ArgumentParser, several: bool = False, auto: bool = False, device: bool = True
) -> None:
    """The options of a command that loads models (:func:`model_request`); ``several``:
    ``--model`` is repeatable; ``auto``: ``--weights auto`` (the default) loads raw and EMA
    weights."""
    repeat = "; repeat --model for several models" if several else ""
    action = "append" if several else "store"
    opt(p, "--model", None, MODEL_HELP + repeat, required=True, action=action)
    overrides = "overrides: vit5 config fields or timm.create_model kwargs"
    overrides += " (e.g. depth=2 img_size=64)"
    if several:
        overrides += "; once for every model, or once per --model in order (empty for none)"
        opt(p, "--model-args", None, overrides, metavar="KEY=VALUE", nargs="*", action="append")
    else:
        opt(p, "--model-args", [], overrides, metavar="KEY=VALUE", nargs="+", action="extend")
    if auto:
        choices = ("auto", "raw", "ema")
        weights = "auto: raw, plus EMA when a checkpoint directory has it (default); raw; ema"
    else:
        choices = ("raw", "ema")
        weights = "raw (default) or the EMA weights of the checkpoint(s)"
    opt(p, "--weights", choices[0], weights, choices=choices)
    ema = "same as --weights ema"
    p.add_argument("--ema", dest="weights", action="store_const", const="ema", help=ema)
    untrained = (
        "build bare architecture names (vit5_tiny, timm:NAME) untrained instead of with their "
        "pretrained weights; checkpoints load as usual; outputs say random-init"
    )
    opt(p, "--random-init", False, untrained)
    limit = "refuse vit5 models larger than N parameters before building them"
    limit += f" (default {DEFAULT_MAX_PARAMS:.0e})"
    opt(p, "--max-params", float, limit, metavar="N")
    if device:
        opt(p, "--device", "auto", DEVICE_HELP)


def per_model_args(args: argparse.Namespace) -> list[list[str]]:
    """The ``--model-args`` of each ``--model``: given once, for every model."""
    if not isinstance(args.model, list):
        return [args.model_args]
    items = args.model_args or [[]]
    if len(items) not in (1, len(args.model)):
        raise InputError(
            f"{len(items)} --model-args for {len(args.model)} --model: give --model-args once "
            "(for every model) or once per --model in order (an empty --model-args for a model "
            "without overrides)",
        )
    if len(items) == 1:
        return items * len(args.model)
    return items


def model_request(
    args: argparse.Namespace,
    specs: list[str] | None = None,
    items: list[list[str]] | None = None,
    labels: tuple[str | None, ...] = (),
    require: str = "any",
) -> ModelRequest:
    """The :class:`~vit5.introspect.load.ModelRequest` of :func:`add_model_options` (or of
    ``specs`` with their ``items``), for :func:`vit5.introspect.load.load_models`."""
    from vit5.introspect.load import ModelRequest, parse_model_args

    if specs is None:
        specs = args.model if isinstance(args.model, list) else [args.model]
    overrides = [parse_model_args(i) for i in items or per_model_args(args)]
    return ModelRequest(
        specs=tuple(specs),
        overrides=tuple(overrides),
        labels=tuple(labels),
        weights=args.weights,
        random_init=args.random_init,
        max_params=args.max_params,
        require=require,
    )


def from_options(target: Callable, args: argparse.Namespace, **values: Any) -> Any:
    """``target`` (a settings dataclass, a function) called with ``values`` and the options named like
    its parameters (lists as tuples)."""
    names = inspect.signature(target).parameters
    values = {name: getattr(args, name) for name in names if hasattr(args, name)} | values
    return target(**{k: tuple(v) if isinstance(v, list) else v for k, v in values.items()})


def parse_size(text: str) -> tuple[int, int]:
    """The ``--size`` syntax (an argparse ``type``): ``"224"`` -> (224, 224), ``"96x128"`` -> (96, 128)."""
    parts = text.lower().split("x")
    if len(parts) > 2 or not all(p.isdecimal() and int(p) > 0 for p in parts):
        raise argparse.ArgumentTypeError(
            f"size {text!r} is not N or HxW with positive integers (e.g. 224 or 96x128)",
        )
    return (int(parts[0]), int(parts[-1]))


def size_option(p: Any, note: str | None = None) -> None:
    """``--size N|HxW`` (:func:`parse_size`); ``note``: what its help says after the syntax (the default)."""
    opt(
        p,
        "--size",
        parse_size,
        SIZE_HELP + (note or " (default: the model's own)"),
        metavar="N|HxW",
    )


def run_command(work: Callable[[], int | None], out: str | os.PathLike[str] | None = None) -> int:
    """Run a command's work; a user error (:class:`~vit5.errors.Vit5Error`, ``OSError``) ends in one
    ``error: ...`` line and exit status 2, anything else keeps its traceback. A failed command removes
    the folders it created for ``out`` while they hold no file."""
    path = Path(out) if out is not None else Path()
    new = list(
        itertools.takewhile(lambda f: not (f.exists() or f.is_symlink()), (path, *path.parents)),
    )
    status = 2
    try:
        status = work() or 0
    except (Vit5Error, OSError) as err:
        print_main(f"error: {user_message(err)}", err=True)
    finally:
        if status != 0 and new and new[-1].is_dir():
            if all(p.is_dir() and not p.is_symlink() for p in new[-1].rglob("*")):
                shutil.rmtree(new[-1], ignore_errors=True)
    end_process_group()  # not after a bug's traceback: see its docstring
    return status


def run_main(
    parse: Callable[[Any], Any],
    argv: Sequence[str] | None,
    work: Callable[[Any], Any],
) -> int:
    """``work(parse(argv))`` (:func:`run_command`, cleaning up a new ``args.out``), with a console that
    prints any file name (undecodable bytes as ``\\xNN``) and warnings as one line each."""
    for stream in (sys.stdout, sys.stderr):
        if hasattr(stream, "reconfigure"):
            stream.reconfigure(errors=ESCAPE_UNDECODABLE)  # type: ignore[union-attr]
    warnings.formatwarning = lambda message, *args, **kwargs: f"warning: {message}\n"
    args = parse(argv)
    keep_freed_memory()  # the command owns its process: the CPU steps reuse freed memory
    return run_command(lambda: work(args), getattr(args, "out", None))


def main(argv: Sequence[str] | None = None) -> int:
    """Entry point of ``vit5`` and ``python -m vit5``: dispatch to the subcommand's ``main(argv, prog)``."""
    from vit5 import __version__

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv and argv[0] in COMMANDS:
        return importlib.import_module(COMMANDS[argv[0]][0]).main(argv[1:], prog=f"vit5 {argv[0]}")
    parser = Parser(
        prog="vit5",
        description="ViT-5 (arXiv 2602.08071): train, evaluate, visualise, benchmark and export.",
        epilog="`vit5 COMMAND --help` lists its options; `vit5 list` the models and recipes. "
        "Multi-GPU: accelerate launch -m vit5 train ...",
    )
    parser.add_argument("--version", action="version", version=f"vit5 {__version__}")
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")
    for name, (_, summary) in COMMANDS.items():
        sub.add_parser(name, help=summary, add_help=False)
    parser.parse_args(argv[:1])  # --help, --version, or a usage error naming the commands
    return 2

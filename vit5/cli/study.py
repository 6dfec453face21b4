"""``vit5 viz study``: the register study's command line (vit5.study)."""

from __future__ import annotations

import argparse
import difflib
from collections.abc import Sequence
from dataclasses import fields, replace
from pathlib import Path
from typing import TYPE_CHECKING

from vit5.cli import Parser, opt, run_main
from vit5.errors import InputError

if TYPE_CHECKING:
    from vit5.study.run import StudyConfig

STUDY_PRESETS = ("full", "smoke")  # the keys of vit5.study.run.PRESETS, named here so --help loads no torch


def parse_settings(base: StudyConfig, items: Sequence[str]) -> StudyConfig:
    """``KEY=VALUE`` overrides of :class:`StudyConfig` fields, :class:`CanvasConfig` fields, or
    ``model.KEY`` (ViT5Config)."""
    from vit5.data.digits.canvases import CanvasConfig
    from vit5.introspect.spec import parse_model_args as parse_overrides
    from vit5.study.run import StudyConfig

    study_keys = {f.name for f in fields(StudyConfig)} - {"canvas", "model_args"}
    canvas_keys = {f.name for f in fields(CanvasConfig)}
    study, canvas, model = {}, {}, dict(base.model_args)
    for key, value in parse_overrides(items).items():
        if key.startswith("model."):
            model[key[len("model.") :]] = value
        elif key in study_keys:
            study[key] = value
        elif key in canvas_keys:
            canvas[key] = value
        else:
            close = difflib.get_close_matches(key, sorted(study_keys | canvas_keys), n=1)
            hint = (
                f"did you mean {close[0]!r}?"
                if close
                else "use a StudyConfig or CanvasConfig field, or model.<ViT5Config field>"
            )
            raise InputError(f"unknown study setting {key!r}: {hint}")
    try:
        return replace(base, canvas=replace(base.canvas, **canvas), model_args=tuple(model.items()), **study)
    except TypeError as err:
        raise InputError(f"bad study setting: {err}") from None


def build_parser(prog: str = "vit5 viz study") -> argparse.ArgumentParser:
    p = Parser(
        prog=prog,
        description="Train twin models without and with registers on canvases that reward a storage token, "
        "tracking the artifact metrics through training (resumable: rerun the same command to continue).",
    )
    opt(p, "--out", Path, "study folder (created; rerun to resume)", required=True)
    opt(p, "--preset", "full", "full (default): the README study; smoke: seconds", choices=STUDY_PRESETS)
    settings = "override settings, e.g. steps=500 lr=3e-3 background=noise model.qk_norm=False"
    opt(p, "--set", [], settings, metavar="KEY=VALUE", dest="settings")
    opt(p, "--max-minutes", float, "stop at the first checkpoint after this many minutes (resumable)")
    opt(p, "--no-analysis", False, "skip the register ablation / test-time register analyses")
    opt(
        p,
        "--analyse-only",
        False,
        "no training: write the figure, verdict and analyses of the twins as they are now",
    )
    opt(p, "--quiet", False, "no progress bar")
    return p


def main(argv: list[str] | None = None, prog: str = "vit5 viz study") -> int:
    """``vit5 viz study``: 0, or 2 after one ``error:`` line (:func:`vit5.cli.run_command`)."""
    return run_main(build_parser(prog).parse_args, argv, _study)


def _study(args: argparse.Namespace) -> None:
    from vit5.study.run import PRESETS, run_study

    cfg = parse_settings(PRESETS[args.preset], args.settings)
    analyse, train = not args.no_analysis, not args.analyse_only
    result = run_study(cfg, args.out, args.max_minutes, not args.quiet, analyse=analyse, train=train)
    print(f"wrote {len(result.files)} files to {args.out}")

"""``vit5 list [models|weights|recipes]``: what the other commands accept by name: the presets with their
size and parameter count, the released checkpoints with their reported top-1, the packaged training
recipes with their first comment line."""

from __future__ import annotations

import argparse
from collections.abc import Sequence

from vit5.cli import Parser, opt, run_main

SECTIONS = ("models", "weights", "recipes")


def main(argv: Sequence[str] | None = None, prog: str = "vit5 list") -> int:
    unknown = "unknown section {!r}: choose from " + ", ".join(SECTIONS)
    parser = Parser(
        prog=prog,
        description="The model presets, the released weights and the packaged training recipes.",
        epilog="example: vit5 list weights",
        check=lambda args: next(
            (unknown.format(n) for n in args.sections if n not in SECTIONS),
            None,
        ),
    )
    opt(
        parser,
        "sections",
        None,
        f"{', '.join(SECTIONS)} (default: all)",
        nargs="*",
        metavar="SECTION",
    )
    return run_main(parser.parse_args, argv, _print)


def _rows(section: str) -> list[tuple[str, ...]]:
    """The table of one section, its header first."""
    if section == "models":
        from vit5.model.footprint import parameter_count
        from vit5.model.presets import PRESETS, preset_config

        rows = [("preset", "dim", "depth", "heads", "img", "params")]
        for name, c in ((name, preset_config(name)) for name in sorted(PRESETS)):
            size = "x".join(map(str, c.img_size))
            params = f"{parameter_count(c) / 1e6:.1f}M"
            rows.append((name, *map(str, (c.embed_dim, c.depth, c.num_heads)), size, params))
        return rows
    if section == "weights":
        from vit5.weights.catalog import RELEASES

        return [("released weights", "ImageNet-1k top-1", "Hub repository")] + [
            (r.name, f"{r.top1:.1f}", r.repo) for r in RELEASES.values()
        ]
    from vit5.train.config import DEMO_RECIPE, recipes

    rows = [("recipe", "what")]
    for name, path in recipes().items():
        first = next((line for line in path.read_text().splitlines() if line.startswith("#")), "#")
        rows.append(
            (name + (" (default)" if name == DEMO_RECIPE else ""), first.lstrip("# ").strip()),
        )
    return rows


def _table(rows: list[tuple[str, ...]]) -> str:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    return "\n".join(
        "  ".join(cell.ljust(w) for cell, w in zip(row, widths)).rstrip() for row in rows
    )


def _print(args: argparse.Namespace) -> None:
    print("\n\n".join(_table(_rows(name)) for name in args.sections or SECTIONS))

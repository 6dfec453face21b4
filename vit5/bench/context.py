"""What every benchmark section receives: the config, where to write figures, how to log."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from vit5.bench.config import BenchConfig


@dataclass
class BenchContext:
    cfg: BenchConfig
    out_dir: Path
    log: Callable[[str], None] = print

    def figure(self, name: str) -> Path:
        """Path for a figure file under ``<out>/figures``."""
        path = self.out_dir / "figures" / name
        path.parent.mkdir(parents=True, exist_ok=True)
        return path

    def relative(self, path: Path) -> str:
        return path.relative_to(self.out_dir).as_posix()

"""Resumable training checkpoints (Accelerate state) and exported model directories.

**Training checkpoints** (``RUN/checkpoints/ckpt-<updates>``) hold everything ``--resume`` needs:
model and optimizer (``accelerator.save_state``), the objects registered with
``accelerator.register_for_checkpointing`` (EMA, :class:`~vit5.train.state.TrainState` with the
epoch, batch position and metrics), and every process's Python / NumPy / torch RNG states.

**Atomic**: all processes write into ``.tmp-ckpt-<updates>``; only when every one is done does
the main process rename it to its final name (a directory rename is atomic on POSIX). A kill at
any moment leaves either the complete new checkpoint or just a ``.tmp-*`` folder that is ignored
(and removed by the next save), so the latest complete checkpoint stays loadable. The newest
``keep_last`` are kept.

**Model directories** (``final/``, ``best/``): our safetensors format via
:func:`vit5.save_pretrained`, raw and EMA weights, loadable with :func:`vit5.load_model`.
"""

from __future__ import annotations

import re
import shutil
from pathlib import Path
from typing import Any

from accelerate import Accelerator
from accelerate.utils import DistributedType
from timm.utils import ModelEmaV3
from torch import nn

import vit5
from vit5 import ViT5
from vit5.train.errors import ResumeError

_NAME = re.compile(r"^ckpt-(\d+)$")
_TMP_PREFIX = ".tmp-"


def checkpoint_name(num_updates: int) -> str:
    return f"ckpt-{num_updates:09d}"


def list_checkpoints(directory: Path) -> list[Path]:
    """Complete checkpoints under ``directory``, oldest first (by update count)."""
    if not directory.is_dir():
        return []
    found = [p for p in directory.iterdir() if p.is_dir() and _NAME.match(p.name)]
    return sorted(found, key=lambda p: int(_NAME.match(p.name).group(1)))  # type: ignore[union-attr]


class CheckpointManager:
    """Saves, prunes and finds training checkpoints of one run. All methods are collective."""

    def __init__(self, accelerator: Accelerator, directory: Path, keep_last: int) -> None:
        self.accelerator = accelerator
        self.directory = directory
        self.keep_last = keep_last

    def save(self, num_updates: int) -> Path:
        """Write the full training state for ``num_updates`` atomically; prune old ones."""
        acc = self.accelerator
        final = self.directory / checkpoint_name(num_updates)
        tmp = self.directory / f"{_TMP_PREFIX}{final.name}"
        if acc.is_main_process:
            shutil.rmtree(tmp, ignore_errors=True)
            tmp.mkdir(parents=True)
        acc.wait_for_everyone()
        acc.save_state(str(tmp), safe_serialization=True)
        acc.wait_for_everyone()
        if acc.is_main_process:
            if final.exists():  # same update count saved again (e.g. resumed from an older one)
                shutil.rmtree(final)
            tmp.rename(final)
            self._prune()
        acc.wait_for_everyone()
        return final

    def load(self, path: Path) -> None:
        """Restore the training state from ``path``; later checkpoints of an abandoned
        continuation are removed so that "latest" and pruning follow the resumed timeline."""
        try:
            self.accelerator.load_state(str(path))
        except (RuntimeError, ValueError, FileNotFoundError, KeyError) as e:
            raise ResumeError(
                f"cannot restore {path}: {e}\nA checkpoint resumes only with the same model, optimizer, "
                f"EMA setting and number of processes it was written with."
            ) from e
        self.accelerator.wait_for_everyone()
        if self.accelerator.is_main_process:
            number = int(_NAME.match(path.name).group(1)) if _NAME.match(path.name) else -1  # type: ignore[union-attr]
            for later in list_checkpoints(self.directory):
                if int(_NAME.match(later.name).group(1)) > number:  # type: ignore[union-attr]
                    shutil.rmtree(later)
        self.accelerator.wait_for_everyone()

    def _prune(self) -> None:
        for stale in self.directory.glob(f"{_TMP_PREFIX}*"):
            shutil.rmtree(stale, ignore_errors=True)
        for old in list_checkpoints(self.directory)[: -self.keep_last]:
            shutil.rmtree(old, ignore_errors=True)


def resolve_resume(path: Path) -> tuple[Path, Path]:
    """``(run_dir, checkpoint)`` from a run directory (latest checkpoint) or a checkpoint directory."""
    if _NAME.match(path.name) and path.is_dir():
        return path.parent.parent, path
    if not path.is_dir():
        raise ResumeError(f"--resume {path}: no such run directory")
    latest = list_checkpoints(path / "checkpoints")
    if not latest:
        raise ResumeError(
            f"--resume {path}: the run has no complete checkpoint yet "
            f"(nothing under {path / 'checkpoints'}); start it again without --resume"
        )
    return path, latest[-1]


def save_model_dir(
    accelerator: Accelerator,
    model: nn.Module,
    ema: ModelEmaV3 | None,
    directory: Path,
    extra: dict[str, Any],
) -> None:
    """Export raw (and EMA) weights as our safetensors directory; collective, main process writes."""
    state = accelerator.get_state_dict(model)  # gathers sharded (FSDP / ZeRO-3) weights on the main process
    if accelerator.is_main_process:
        unwrapped: ViT5 = accelerator.unwrap_model(model, keep_torch_compile=False)
        if accelerator.distributed_type in (DistributedType.FSDP, DistributedType.DEEPSPEED):
            unwrapped = ViT5(unwrapped.cfg)
            unwrapped.load_state_dict({k: v.float().cpu() for k, v in state.items()})
        ema_state = ema.module.state_dict() if ema is not None else None
        vit5.save_pretrained(unwrapped, directory, ema_state_dict=ema_state, extra=extra)
    accelerator.wait_for_everyone()

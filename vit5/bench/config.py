"""``BenchConfig``: every size, count and switch of ``vit5 bench``, in three profiles: ``smoke`` (tiny models,
seconds; tests and CI), ``quick`` (real ViT-S/Ti shapes, few rounds; minutes on 2 CPU cores) and ``full``
(more rounds, larger batches, longer sequences; for a GPU). :class:`BenchContext` is what a section gets."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import torch

from vit5.bench.measure import TimingConfig
from vit5.bench.report import choose
from vit5.errors import InputError
from vit5.model.presets import SIZES


@dataclass(frozen=True)
class DepthAblationConfig:
    """Pre-norm vs post-norm at depth: a narrow model so it runs in seconds on a CPU."""

    depth: int = 24
    width: int = 64
    heads: int = 4
    steps: int = 100
    lrs: tuple[float, ...] = (1e-3, 2e-3)  # fixed learning rates, no warmup
    batch: int = 64
    grad_batch: int = 128

    def __post_init__(self) -> None:
        if self.depth < 2 or self.steps < 1 or not self.lrs or min(self.lrs) <= 0 or self.width % self.heads:
            raise InputError(f"invalid depth-ablation config {self}")


@dataclass(frozen=True)
class BenchConfig:
    device: str = "cpu"
    dtype: Literal["fp32", "bf16"] = "fp32"
    threads: int | None = None  # CPU intra-op threads; None: torch's default
    timing: TimingConfig = TimingConfig(warmup=1, rounds=5)
    sizes: tuple[str, ...] = ("tiny", "small")  # speed: every size at img_size
    target_size: str = "small"  # the size the speed targets are stated for (and measured at hires)
    depth: int | None = None  # override every model's depth (smoke runs)
    img_size: int = 224
    batch: int = 8
    hires_img_size: int = 448
    hires_batch: int = 2
    attn_seq_lens: tuple[int, ...] = (256, 1024, 2048, 4096, 8192)
    attn_heads: int = 2
    attn_head_dim: int = 64
    attn_eager_max_bytes: int = 4 * 2**30  # skip eager where its n x n tensors would exceed this
    compile_size: str = "tiny"
    compile_backend: str = "inductor"
    depth_ablation: DepthAblationConfig = field(default_factory=DepthAblationConfig)
    # data_index: synthetic ImageFolder trees indexed, and photos decoded from a folder and from shards
    index_sizes: tuple[int, ...] = (10_000, 100_000)
    index_rounds: int = 3
    decode_images: int = 64

    def __post_init__(self) -> None:
        try:
            device = torch.device(self.device)
        except RuntimeError:
            device = None
        if device is None or device.type not in ("cpu", "cuda"):
            raise InputError(f"device must be 'cpu' or 'cuda' (or 'cuda:N'), got {self.device!r}")
        if device.type == "cuda" and (device.index or 0) >= (count := torch.cuda.device_count()):
            raise InputError(f"{self.device} does not exist: torch sees {count} CUDA device(s); use cpu")
        if self.dtype not in ("fp32", "bf16"):
            raise InputError(f"dtype must be 'fp32' or 'bf16', got {self.dtype!r}")
        if self.threads is not None and self.threads < 1:
            raise InputError(f"threads must be at least 1, got {self.threads}")
        if min(self.index_sizes, default=0) < 1 or self.index_rounds < 1 or self.decode_images < 8:
            raise InputError("index_sizes must be positive, index_rounds >= 1 and decode_images >= 8")
        if not self.sizes:
            raise InputError("sizes must name at least one model size")
        choose("model size", (*self.sizes, self.target_size, self.compile_size), SIZES)

    @property
    def size_for_targets(self) -> str:
        """The speed targets are for ViT-S; smaller runs check them on their largest size."""
        return self.target_size if self.target_size in self.sizes else self.sizes[-1]

    @classmethod
    def profile(cls, name: Literal["smoke", "quick", "full"], **changes: Any) -> BenchConfig:
        choose("profile", [name], PROFILES)
        return cls(**{**PROFILES[name], **changes})


PROFILES: dict[str, dict[str, Any]] = {
    "smoke": dict(
        threads=1,  # tiny ops: a second thread only adds synchronisation stalls on a busy machine
        timing=TimingConfig(warmup=1, rounds=2),
        sizes=("tiny",),
        depth=2,
        img_size=32,
        batch=2,
        hires_img_size=64,
        hires_batch=1,
        attn_seq_lens=(64, 256),
        attn_heads=1,
        compile_backend="eager",
        depth_ablation=DepthAblationConfig(
            depth=8, width=32, heads=2, steps=4, lrs=(1e-3,), batch=32, grad_batch=32
        ),
        index_sizes=(200,),
        index_rounds=1,
        decode_images=8,
    ),
    "quick": dict(),
    "full": dict(
        timing=TimingConfig(warmup=3, rounds=15),
        batch=64,
        hires_batch=16,
        attn_seq_lens=(256, 512, 1024, 2048, 4096, 8192, 16384),
        attn_heads=6,
        attn_eager_max_bytes=32 * 2**30,
        compile_size="small",
        depth_ablation=DepthAblationConfig(width=256, steps=300, lrs=(5e-4, 1e-3, 2e-3)),
        index_sizes=(10_000, 100_000, 1_000_000),
    ),
}


@dataclass
class BenchContext:
    cfg: BenchConfig
    out_dir: Path
    log: Callable[[str], None] = print

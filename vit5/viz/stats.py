"""The arrays one model produces on one image set (B images, L blocks, H heads, N tokens, R registers,
P = h * w patches; token order from ``layout``), the single source of every metric and figure, and the
per-image maps ``[..., h, w]`` the figures draw from them."""

from __future__ import annotations

import json
from dataclasses import dataclass, fields
from pathlib import Path

import numpy as np

from vit5.errors import InputError
from vit5.model import TokenLayout
from vit5.viz.content import PatchContent


@dataclass
class TokenStats:
    model: str
    layout: TokenLayout
    layers: list[int]  # block index of each recorded layer, ascending
    names: list[str]  # image names
    patch_size: int  # pixels per token side
    norms: np.ndarray  # [B, L, N] L2 norm of each block output token, before the final norm
    received: np.ndarray  # [B, L, H, N] attention each key receives, averaged over all queries
    rollout: np.ndarray  # [B, N] attention-rollout row of CLS (or the patch mean without CLS)
    cls_attn: np.ndarray | None = None  # [B, L, H, N] the CLS query's attention row
    reg_attn: np.ndarray | None = None  # [B, L, H, R, N] each register query's attention row
    patch_to_reg: np.ndarray | None = None  # [B, L, H] mean over patch queries of the mass on registers
    features: np.ndarray | None = None  # [F, P, C] last block's final-norm patch features, first F images
    massive_top: np.ndarray | None = None  # [B, L, 3] largest |activation| of each block output
    massive_token: np.ndarray | None = None  # [B, L, 3] token position of each of them
    massive_channel: np.ndarray | None = None  # [B, L, 3] channel of each of them
    massive_median: np.ndarray | None = None  # [B, L] median |activation| of each block output
    # the input patches' local information (vit5.viz.content.PatchContent), [B, P] each
    pixel_variance: np.ndarray | None = None
    variance_percentile: np.ndarray | None = None
    neighbour_cosine: np.ndarray | None = None

    @property
    def num_images(self) -> int:
        return self.norms.shape[0]

    def layer_position(self, block: int) -> int:
        """Position in the L axis of block index ``block`` (negative counts from the last recorded)."""
        if block < 0:
            block = self.layers[block] if -len(self.layers) <= block else block
        if block not in self.layers:
            raise InputError(f"layer {block} was not recorded; recorded layers are {self.layers}")
        return self.layers.index(block)

    def patch_values(self, values: np.ndarray) -> np.ndarray:
        """The patch positions of the last (token) axis."""
        return values[..., self.layout.patch_slice]

    def register_values(self, values: np.ndarray) -> np.ndarray:
        return values[..., self.layout.register_slice]

    def to_grid(self, patch_values: np.ndarray) -> np.ndarray:
        """``[..., P]`` to ``[..., h, w]`` (row-major)."""
        return patch_values.reshape(*patch_values.shape[:-1], *self.layout.grid)

    @property
    def content(self) -> PatchContent | None:
        """The :class:`~vit5.viz.content.PatchContent` of the images, or None when not recorded."""
        if self.pixel_variance is None:
            return None
        return PatchContent(self.pixel_variance, self.variance_percentile, self.neighbour_cosine)

    def arrays(self) -> dict[str, np.ndarray]:
        return {f.name: getattr(self, f.name) for f in fields(self)[5:] if getattr(self, f.name) is not None}

    def save(self, path: str | Path) -> Path:
        """Write all arrays to ``.npz`` or ``.safetensors`` (chosen by the suffix) with the metadata."""
        path = Path(path)
        arrays = {name: np.ascontiguousarray(a) for name, a in self.arrays().items()}
        layout = self.layout
        meta = json.dumps(
            dict(
                model=self.model,
                layers=self.layers,
                names=self.names,
                patch_size=self.patch_size,
                grid=list(layout.grid),
                num_cls=layout.num_cls,
                num_registers=layout.num_registers,
                registers_first=layout.registers_first,
            )
        )
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".safetensors":
            from safetensors.numpy import save_file

            save_file(arrays, str(path), metadata={"vit5_viz": meta})
        elif path.suffix == ".npz":
            np.savez_compressed(path, vit5_viz=np.array(meta), **arrays)
        else:
            raise InputError(f"raw token statistics are saved as .npz or .safetensors, not {path.suffix!r}")
        return path

    @classmethod
    def load(cls, path: str | Path) -> TokenStats:
        path = Path(path)
        if path.suffix == ".safetensors":
            from safetensors import safe_open

            with safe_open(str(path), framework="numpy") as f:
                meta = json.loads(f.metadata()["vit5_viz"])
                arrays = {k: f.get_tensor(k) for k in f.keys()}
        else:
            with np.load(path) as f:
                meta = json.loads(str(f["vit5_viz"]))
                arrays = {k: f[k] for k in f.files if k != "vit5_viz"}
        layout = TokenLayout(
            tuple(meta["grid"]), meta["num_cls"], meta["num_registers"], meta["registers_first"]
        )
        return cls(meta["model"], layout, meta["layers"], meta["names"], meta["patch_size"], **arrays)

    @classmethod
    def concat(cls, parts: list[TokenStats]) -> TokenStats:
        """Join the stats of consecutive batches (same model, layout and layers)."""
        first = parts[0]
        joined: dict[str, list[np.ndarray]] = {}
        for part in parts:
            for name, values in part.arrays().items():
                joined.setdefault(name, []).append(values)
        names = [n for p in parts for n in p.names]
        arrays = {k: np.concatenate(v) for k, v in joined.items()}
        return cls(first.model, first.layout, first.layers, names, first.patch_size, **arrays)


def cls_maps(stats: TokenStats, image: int, layer: int, renormalise: bool = False) -> np.ndarray:
    """CLS-to-patch attention per head ``[H, h, w]``: raw (the share of *all* tokens) or renormalised over
    patches."""
    if stats.cls_attn is None:
        raise InputError(
            f"{stats.model} has no CLS token, so there is no CLS attention to show (use rollout or norms)"
        )
    rows = stats.patch_values(stats.cls_attn[image, stats.layer_position(layer)])
    if renormalise:
        rows = rows / rows.sum(axis=-1, keepdims=True)
    return stats.to_grid(rows)


def received_map(stats: TokenStats, image: int, layer: int) -> np.ndarray:
    """Attention each patch receives, averaged over all queries and heads ``[h, w]`` (raw): the
    attention map of a model without CLS token, where sinks show as bright patches."""
    return stats.to_grid(stats.patch_values(stats.received[image, stats.layer_position(layer)].mean(axis=0)))


def register_maps(stats: TokenStats, image: int, layer: int) -> np.ndarray:
    """Register-to-patch attention ``[R, h, w]`` (raw, head mean), one map per register."""
    if stats.reg_attn is None:
        raise InputError(
            f"{stats.model} has no register tokens (R=0), so there are no register attention maps: "
            "pick a model with registers (e.g. vit5_*, or a timm *_reg4_* model)"
        )
    rows = stats.patch_values(stats.reg_attn[image, stats.layer_position(layer)])  # [H, R, P]
    return stats.to_grid(rows.mean(axis=0))


def norm_map(stats: TokenStats, image: int, layer: int) -> np.ndarray:
    """L2 norm of each patch token's block output (before the final norm) ``[h, w]``."""
    return stats.to_grid(stats.patch_values(stats.norms[image, stats.layer_position(layer)]))


def rollout_map(stats: TokenStats, image: int) -> np.ndarray:
    """Attention-rollout row (CLS, or the patch mean without CLS) over the patches ``[h, w]``, raw."""
    return stats.to_grid(stats.patch_values(stats.rollout[image]))


def outlier_map(outliers: np.ndarray, stats: TokenStats, image: int, layer: int) -> np.ndarray:
    """The outlier patches ``[h, w]`` of a metric report's mask ``[B, L, P]``."""
    return stats.to_grid(outliers[image, stats.layer_position(layer)])

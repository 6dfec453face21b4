"""The arrays one model produces on one image set (B images, L blocks, H heads, N tokens, R registers,
P = h * w patches; token order from ``layout``), the single source of every metric and figure, the per-image
maps ``[..., h, w]`` the figures draw from them, and where high-norm outliers sit relative to the content.
Darcet et al. (arXiv 2309.16588, sec. 2.1, Fig. 5) find true artifacts on patches redundant with their
neighbours, so an outlier is *artifact-like* when its input patch is flat (pixel-variance percentile <=
``FLAT_PERCENTILE``) and like its 4-neighbours (mean cosine of centred pixels >= ``REDUNDANT_COSINE``),
*content-like* otherwise."""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from pathlib import Path

import numpy as np
from scipy.stats import rankdata

from vit5.errors import InputError
from vit5.model import TokenLayout

FLAT_PERCENTILE = 0.5  # in the flatter half of its image's patches
REDUNDANT_COSINE = 0.5  # and similar to its neighbours
# the pixel-vector norm (in [0, 1] units) below which a centred patch counts as the mean colour
_EPS = 1e-6


@dataclass(frozen=True)
class PatchContent:
    """Per image and patch ``[B, P]`` (row-major over the patch grid): the input's local information."""

    variance: np.ndarray  # pixel variance, pixels in [0, 1]
    variance_percentile: np.ndarray  # rank among the image's patches, in [0, 1]
    neighbour_cosine: np.ndarray  # mean cosine of the centred pixel vector to its 4-neighbours

    @property
    def artifact_like(self) -> np.ndarray:
        """``[B, P]`` flat, neighbour-redundant patches: where an outlier is artifact-like."""
        flat = self.variance_percentile <= FLAT_PERCENTILE
        redundant = self.neighbour_cosine >= REDUNDANT_COSINE
        return flat & redundant


@dataclass
class TokenStats:
    model: str
    layout: TokenLayout
    layers: list[int]  # block index of each recorded layer, ascending
    names: list[str]  # image names
    patch_size: int  # pixels per token side
    # [B, L, N] L2 norm of each block output token, before the final norm
    norms: np.ndarray
    # [B, L, H, N] attention each key receives, averaged over all queries
    received: np.ndarray
    # [B, N] attention-rollout row of CLS (or the patch mean without CLS); None: not recorded
    rollout: np.ndarray | None
    # [B, L, H, N] the CLS query's attention row
    cls_attn: np.ndarray | None = None
    # [B, L, H, R, N] each register query's attention row
    reg_attn: np.ndarray | None = None
    # [B, L, H] mean over patch queries of the mass on registers
    patch_to_reg: np.ndarray | None = None
    # [F, P, C] last block's final-norm patch features, first F images
    features: np.ndarray | None = None
    # [B, L, 3] largest |activation| of each block output
    massive_top: np.ndarray | None = None
    # [B, L, 3] token position of each of them
    massive_token: np.ndarray | None = None
    # [B, L, 3] channel of each of them
    massive_channel: np.ndarray | None = None
    # [B, L] median |activation| of each block output
    massive_median: np.ndarray | None = None
    # the input patches' local information (PatchContent), [B, P] each
    pixel_variance: np.ndarray | None = None
    variance_percentile: np.ndarray | None = None
    neighbour_cosine: np.ndarray | None = None
    # [B, L, H] mean over queries of each attention row's entropy (nats)
    head_entropy: np.ndarray | None = None
    # [B, L, H] mean over queries of each attention row's largest weight
    head_peak: np.ndarray | None = None

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
        if self.pixel_variance is None:
            return None
        return PatchContent(
            variance=self.pixel_variance,
            variance_percentile=self.variance_percentile,
            neighbour_cosine=self.neighbour_cosine,
        )

    def save(self, path: str | Path) -> Path:
        """Write all arrays to ``.npz`` or ``.safetensors`` (chosen by the suffix) with the metadata."""
        path = Path(path)
        # the fields after patch_size
        arrays = {f.name: getattr(self, f.name) for f in fields(self)[5:]}
        arrays = {name: np.ascontiguousarray(a) for name, a in arrays.items() if a is not None}
        # model to patch_size
        meta = {f.name: getattr(self, f.name) for f in fields(self)[:5]}
        meta = json.dumps(meta | {"layout": asdict(self.layout)})
        path.parent.mkdir(parents=True, exist_ok=True)
        if path.suffix == ".safetensors":
            from safetensors.numpy import save_file

            save_file(arrays, str(path), metadata={"vit5_viz": meta})
        elif path.suffix == ".npz":
            np.savez_compressed(path, vit5_viz=np.array(meta), **arrays)
        else:
            raise InputError(
                f"raw token statistics are saved as .npz or .safetensors, not {path.suffix!r}",
            )
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
        stored = meta["layout"]
        layout = TokenLayout(
            grid=tuple(stored["grid"]),
            num_cls=stored["num_cls"],
            num_registers=stored["num_registers"],
            registers_first=stored["registers_first"],
        )
        return cls(
            model=meta["model"],
            layout=layout,
            layers=meta["layers"],
            names=meta["names"],
            patch_size=meta["patch_size"],
            norms=arrays["norms"],
            received=arrays["received"],
            rollout=arrays.get("rollout"),
            cls_attn=arrays.get("cls_attn"),
            reg_attn=arrays.get("reg_attn"),
            patch_to_reg=arrays.get("patch_to_reg"),
            features=arrays.get("features"),
            massive_top=arrays.get("massive_top"),
            massive_token=arrays.get("massive_token"),
            massive_channel=arrays.get("massive_channel"),
            massive_median=arrays.get("massive_median"),
            pixel_variance=arrays.get("pixel_variance"),
            variance_percentile=arrays.get("variance_percentile"),
            neighbour_cosine=arrays.get("neighbour_cosine"),
            head_entropy=arrays.get("head_entropy"),
            head_peak=arrays.get("head_peak"),
        )


def cls_maps(stats: TokenStats, image: int, layer: int, renormalise: bool = False) -> np.ndarray:
    """CLS-to-patch attention per head ``[H, h, w]``: raw (a share of *all* tokens) or renormalised."""
    if stats.cls_attn is None:
        problem = f"{stats.model} has no CLS token, so there is no CLS attention to show"
        raise InputError(f"{problem} (use rollout or norms)")
    rows = stats.patch_values(stats.cls_attn[image, stats.layer_position(layer)])
    if renormalise:
        rows = rows / rows.sum(axis=-1, keepdims=True)
    return stats.to_grid(rows)


def received_map(stats: TokenStats, image: int, layer: int) -> np.ndarray:
    """Attention each patch receives, averaged over all queries and heads ``[h, w]`` (raw): the
    attention map of a model without CLS token, where sinks show as bright patches."""
    received = stats.received[image, stats.layer_position(layer)].mean(axis=0)
    return stats.to_grid(stats.patch_values(received))


def register_maps(stats: TokenStats, image: int, layer: int) -> np.ndarray:
    """Register-to-patch attention ``[R, h, w]`` (raw, head mean), one map per register."""
    if stats.reg_attn is None:
        raise InputError(
            f"{stats.model} has no register tokens (R=0), so there are no register attention maps: "
            "pick a model with registers (e.g. vit5_*, or a timm *_reg4_* model)"
        )
    # [H, R, P]
    rows = stats.patch_values(stats.reg_attn[image, stats.layer_position(layer)])
    return stats.to_grid(rows.mean(axis=0))


def norm_map(stats: TokenStats, image: int, layer: int) -> np.ndarray:
    """L2 norm of each patch token's block output (before the final norm) ``[h, w]``."""
    return stats.to_grid(stats.patch_values(stats.norms[image, stats.layer_position(layer)]))


def rollout_map(stats: TokenStats, image: int) -> np.ndarray:
    """Attention-rollout row (CLS, or the patch mean without CLS) over the patches ``[h, w]``, raw."""
    if stats.rollout is None:
        raise InputError(
            f"the attention rollout of {stats.model} was not recorded: record with "
            "CollectConfig(rollout=True) (vit5 viz attention and vit5 viz all draw it)"
        )
    return stats.to_grid(stats.patch_values(stats.rollout[image]))


def outlier_map(outliers: np.ndarray, stats: TokenStats, image: int, layer: int) -> np.ndarray:
    """The outlier patches ``[h, w]`` of a metric report's mask ``[B, L, P]``."""
    return stats.to_grid(outliers[image, stats.layer_position(layer)])


def patch_content(rgb: np.ndarray, patch: int) -> PatchContent:
    """``rgb [B, H, W, 3]`` (uint8, the pixels the model saw; H, W multiples of ``patch``)."""
    x = np.asarray(rgb, dtype=np.float64) / 255.0
    b, height, width, c = x.shape
    h = height // patch
    w = width // patch
    grid = x.reshape(b, h, patch, w, patch, c).transpose(0, 1, 3, 2, 4, 5)
    patches = grid.reshape(b, h, w, -1)
    variance = patches.var(axis=-1)  # [B, h, w]
    # float noise of constant patches is a tie, not an order
    flat = np.round(variance.reshape(b, -1), 12)
    # percentile rank, 0 for the flattest, 1 for the most varied;
    # ties at their mean (a constant image: 0.5)
    percentile = (rankdata(flat, axis=1) - 1) / max(1, flat.shape[1] - 1)
    # [B, 1, 1, 3]; a patch vector is (row, col, rgb)
    mean_colour = x.mean(axis=(1, 2))[:, None, None, :]
    centred = patches - np.tile(mean_colour, (1, 1, 1, patch * patch))
    norms = np.linalg.norm(centred, axis=-1)
    # a zero border: the neighbours of edge patches that do not exist
    pad = ((0, 0), (1, 1), (1, 1))
    padded = np.pad(centred, (*pad, (0, 0)))
    padded_norms = np.pad(norms, pad)
    inside = np.pad(np.ones((1, h, w)), pad)
    cosine_sum = np.zeros((b, h, w))
    count = np.zeros((1, h, w))
    # offsets in the padded grid: above, below, left, right
    for dr, dc in ((0, 1), (2, 1), (1, 0), (1, 2)):
        at = np.s_[:, dr : dr + h, dc : dc + w]
        cosine_sum += inside[at] * _cosine(centred, padded[at], norms, padded_norms[at])
        count += inside[at]
    cosine = cosine_sum / np.maximum(count, 1)
    return PatchContent(
        variance=flat,
        variance_percentile=percentile,
        neighbour_cosine=cosine.reshape(b, -1),
    )


def _cosine(a: np.ndarray, b: np.ndarray, na: np.ndarray, nb: np.ndarray) -> np.ndarray:
    """Cosine of centred pixel vectors; both at the mean colour: identical (1), one of them: unrelated (0)."""
    flat_a = na < _EPS
    flat_b = nb < _EPS
    with np.errstate(divide="ignore", invalid="ignore"):
        cos = (a * b).sum(axis=-1) / (na * nb)
    both_flat = (flat_a & flat_b).astype(np.float64)
    return np.where(flat_a | flat_b, both_flat, cos)


def classify_outliers(outliers: np.ndarray, content: PatchContent, layers: list[int]) -> list[dict]:
    """Per layer, pooled over images: the outlier count, how many are artifact-like / content-like, and the
    median variance percentile and neighbour cosine of their input patches."""
    found = []
    for pos, layer in enumerate(layers):
        mask = outliers[:, pos]
        n = int(mask.sum())
        artifact = int((mask & content.artifact_like).sum())
        percentile = None
        cosine = None
        if n:
            percentile = float(np.median(content.variance_percentile[mask]))
            cosine = float(np.median(content.neighbour_cosine[mask]))
        found.append(
            dict(
                layer=layer,
                outliers=n,
                artifact_like=artifact,
                content_like=n - artifact,
                artifact_share=artifact / n if n else None,
                median_variance_percentile=percentile,
                median_neighbour_cosine=cosine,
            )
        )
    return found

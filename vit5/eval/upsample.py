"""Training-free, edge-aware upsampling of patch features to pixels: joint bilateral upsampling
(Kopf, Cohen, Lischinski and Uyttendaele, "Joint Bilateral Upsampling", SIGGRAPH 2007, eq. 2)
guided by the image, vectorised over pixels in torch.

For pixel ``p`` (its position ``p_low`` on the patch grid, in patch units) and the grid cells
``q`` within ``radius`` cells of ``p_low``'s nearest cell:

    out(p) = sum_q f(|p_low - q|) g(|I(p) - I_low(q)|) S(q) / sum_q f(...) g(...)

with Gaussians ``f`` (``sigma_spatial``, in patches) and ``g`` (``sigma_range``, on RGB in
[0, 1]). ``I_low(q)`` is the guide's mean colour over cell ``q`` (Kopf et al. read the guide at
``q``'s position; the patch mean is what the patch token saw). The weights of a pixel sum to one,
so upsampling an affine head's logits equals the head applied to upsampled features.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

import torch
import torch.nn.functional as F

from vit5.errors import InputError, Rule, rule_problems

_RULES = (
    Rule("radius", lambda v: type(v) is int and v >= 0, "a whole number >= 0"),
    Rule("sigma_spatial", lambda v: v > 0, "> 0"),
    Rule("sigma_range", lambda v: v > 0, "> 0"),
)


@dataclass(frozen=True)
class JointBilateral:
    radius: int = 1  # grid cells on each side of the nearest one: a (2r+1)^2 window
    sigma_spatial: float = 1.0  # in patches
    sigma_range: float = 0.1  # on RGB in [0, 1]

    def __post_init__(self) -> None:
        problems = rule_problems(asdict(self), _RULES)
        if problems:
            raise InputError(f"joint bilateral upsampling: {problems[0]}")


def _low_coords(size: int, cells: int, device: torch.device) -> torch.Tensor:
    """Each pixel centre on the grid's axis, in cell units (cell centres at 0, 1, ...)."""
    pixels = torch.arange(size, device=device, dtype=torch.float32)
    return (pixels + 0.5) * (cells / size) - 0.5


def joint_bilateral_upsample(
    features: torch.Tensor, guide: torch.Tensor, settings: JointBilateral = JointBilateral()
) -> torch.Tensor:
    """``features [B, C, h, w]`` to ``[B, C, H, W]``, guided by ``guide [B, 3, H, W]`` (RGB in
    [0, 1]); computed in float32, one window offset at a time."""
    if features.dim() != 4 or guide.dim() != 4 or features.shape[0] != guide.shape[0]:
        raise InputError(
            f"features [B, C, h, w] and guide [B, 3, H, W] needed, got {tuple(features.shape)} "
            f"and {tuple(guide.shape)}"
        )
    h = features.shape[-2]
    w = features.shape[-1]
    size_h = guide.shape[-2]
    size_w = guide.shape[-1]
    device = features.device
    feats = features.float()
    guide = guide.float()
    low_guide = F.adaptive_avg_pool2d(guide, (h, w))
    ys = _low_coords(size_h, h, device)
    xs = _low_coords(size_w, w, device)
    near_y = ys.round().long()
    near_x = xs.round().long()
    total = torch.zeros_like(feats[:, :, :1, :1]).expand(-1, -1, size_h, size_w).clone()
    norm = torch.zeros(guide.shape[0], 1, size_h, size_w, device=device)
    r = settings.radius
    two_s2 = 2 * settings.sigma_spatial**2
    two_r2 = 2 * settings.sigma_range**2
    for dy in range(-r, r + 1):
        qy = near_y + dy
        valid_y = (qy >= 0) & (qy < h)
        qy = qy.clamp(0, h - 1)
        for dx in range(-r, r + 1):
            qx = near_x + dx
            valid_x = (qx >= 0) & (qx < w)
            qx = qx.clamp(0, w - 1)
            spatial = torch.exp(-((qy - ys)[:, None] ** 2 + (qx - xs)[None, :] ** 2) / two_s2)
            spatial = spatial * (valid_y[:, None] & valid_x[None, :])  # [H, W]
            cell_colour = low_guide[:, :, qy][:, :, :, qx]  # [B, 3, H, W]
            distance = ((guide - cell_colour) ** 2).sum(dim=1, keepdim=True)
            weight = spatial * torch.exp(-distance / two_r2)  # [B, 1, H, W]
            total += weight * feats[:, :, qy][:, :, :, qx]
            norm += weight
    # every pixel has its nearest cell in the window, whose spatial weight is > 0
    return total / norm.clamp_min(torch.finfo(torch.float32).tiny)

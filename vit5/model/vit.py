"""The ViT-5 backbone (arXiv 2602.08071): patch embed, APE on the patches only, ``[CLS | patches |
registers]``, blocks sharing one RoPE table per grid, final norm, head on CLS (or the patch mean). It follows
timm's model contract and is traceable (``torch.export``, ONNX, ``torch.fx``)."""

from __future__ import annotations

import math
import warnings
from collections.abc import Sequence
from typing import Any, Literal

import torch
from accelerate.utils import extract_model_from_parallel
from timm.data import IMAGENET_DEFAULT_MEAN, IMAGENET_DEFAULT_STD
from torch import nn
from torch.utils.checkpoint import checkpoint

from vit5.errors import InputError
from vit5.layers import Block, PatchEmbed, Rope2D, RopeTable, make_norm, resample_pos_embed
from vit5.model.config import ViT5Config
from vit5.model.layout import TokenLayout

_ROPE_CACHE_SIZE = 16
torch.fx.wrap(
    "resample_pos_embed"
)  # under torch.fx the grid is symbolic: resampling is recorded as one call


def default_pretrained_cfg(
    img_size: int | tuple[int, int], in_chans: int = 3, num_classes: int = 1000
) -> dict[str, Any]:
    """timm's data config: the official evaluation recipe (bicubic resize, centre crop ratio 1.0, ImageNet
    mean/std; ``--eval-crop-ratio 1.0`` and ``datasets.py:99-108`` of github.com/wangf3014/ViT-5)."""
    h, w = (img_size, img_size) if isinstance(img_size, int) else img_size
    return {
        "input_size": (in_chans, h, w),
        "mean": IMAGENET_DEFAULT_MEAN,  # the normalisation of every preset
        "std": IMAGENET_DEFAULT_STD,
        "crop_pct": 1.0,
        "interpolation": "bicubic",
        "num_classes": num_classes,
        "first_conv": "patch_embed.proj",
        "classifier": "head",
        "fixed_input_size": False,
        "license": "apache-2.0",
    }


def take_indices(
    num_blocks: int, indices: int | Sequence[int] | None, unique: bool = False
) -> list[int]:
    """The one block index rule of every tool: ``None`` all blocks, an int ``n`` the last n, a sequence
    absolute or negative indices in the order given (``unique``: sorted, each once); else InputError."""
    if indices is None:
        return list(range(num_blocks))
    if isinstance(indices, int):
        if not 0 < indices <= num_blocks:
            raise InputError(f"asked for the last {indices} blocks of a model with {num_blocks}")
        return list(range(num_blocks - indices, num_blocks))
    if not list(indices):
        raise InputError("choose at least one layer (e.g. -1 for the last block)")
    taken = []
    for i in indices:
        if not -num_blocks <= i < num_blocks:
            raise InputError(
                f"layer {i} is out of range: this model has {num_blocks} blocks, valid layers are "
                f"0..{num_blocks - 1} (or -{num_blocks}..-1 counting from the end)"
            )
        taken.append(i % num_blocks)
    return sorted(set(taken)) if unique else taken


class ViT5(nn.Module):
    """Vision Transformer with every ViT-5 component switchable through :class:`ViT5Config`."""

    def __init__(self, cfg: ViT5Config) -> None:
        super().__init__()
        self.cfg = cfg
        self.num_classes = cfg.num_classes
        self.global_pool = cfg.global_pool
        self.embed_dim = self.num_features = self.head_hidden_size = cfg.embed_dim
        self.num_prefix_tokens = cfg.num_prefix_tokens
        self.num_reg_tokens = cfg.num_registers
        self.patch_size = cfg.patch_size
        self.grad_checkpointing = False

        self.patch_embed = PatchEmbed(cfg.patch_size, cfg.in_chans, cfg.embed_dim)
        d = cfg.embed_dim
        self.cls_token = nn.Parameter(torch.zeros(1, 1, d)) if cfg.class_token else None
        registers = torch.zeros(1, cfg.num_registers, d)
        self.reg_token = nn.Parameter(registers) if cfg.num_registers else None
        patches = torch.zeros(1, math.prod(cfg.grid_size), d)
        self.pos_embed = nn.Parameter(patches) if cfg.ape else None
        self.rope = self.rope_reg = None
        convention = (cfg.rope_layout, cfg.rope_axis_order, cfg.rope_positions, cfg.rope_ref_grid)
        if cfg.rope:
            self.rope = Rope2D(cfg.head_dim, cfg.rope_theta, *convention)
        if cfg.num_registers and cfg.register_rope:  # registers on their own sqrt(R) x sqrt(R) grid
            self.rope_reg = Rope2D(cfg.head_dim, cfg.register_rope_theta, *convention[:2])
        self._rope_cache: dict[tuple, RopeTable] = {}

        self.blocks = nn.ModuleList([Block(block_cfg) for block_cfg in cfg.block_configs()])
        self.norm = make_norm(cfg.norm, cfg.embed_dim, cfg.norm_eps)
        self.head_drop = nn.Dropout(cfg.drop_rate)
        self.head = nn.Linear(cfg.embed_dim, cfg.num_classes) if cfg.num_classes else nn.Identity()
        self.feature_info = [
            dict(module=f"blocks.{i}", num_chs=cfg.embed_dim, reduction=cfg.patch_size)
            for i in range(cfg.depth)
        ]
        self.pretrained_cfg = self.default_cfg = self._pretrained_cfg()
        self.init_weights()

    def init_weights(self) -> None:
        """Official ViT-5 init: trunc-normal(0.02) linears and tokens, zero biases, default conv."""
        for param in (self.cls_token, self.reg_token, self.pos_embed):
            if param is not None:
                nn.init.trunc_normal_(param, std=0.02)
        for module in self.modules():
            if isinstance(module, nn.Linear):
                nn.init.trunc_normal_(module.weight, std=0.02)
                if module.bias is not None:
                    nn.init.zeros_(module.bias)

    def _pretrained_cfg(self) -> dict[str, Any]:
        return default_pretrained_cfg(self.cfg.img_size, self.cfg.in_chans, self.cfg.num_classes)

    def token_layout(self, grid: tuple[int, int]) -> TokenLayout:
        prefix = self.num_prefix_tokens
        return TokenLayout(tuple(grid), prefix, self.num_reg_tokens, registers_first=False)

    def rope_table(self, grid: tuple[int, int]) -> RopeTable | None:
        """The rotation of every token (None without RoPE), cached per grid and device and shared by every
        block. CLS rows (and registers without their own RoPE) have angle 0, so blocks never slice q or k."""
        if self.rope is None and self.rope_reg is None:
            return None
        tracing = torch.compiler.is_compiling() or torch.jit.is_tracing()
        tracing = tracing or torch.fx._symbolic_trace.is_fx_symbolic_tracing()
        if tracing:  # the graph computes its own table
            return self._build_rope_table(grid)
        key = (tuple(grid), self.patch_embed.proj.weight.device)
        table = self._rope_cache.get(key)
        if table is None:
            if len(self._rope_cache) >= _ROPE_CACHE_SIZE:
                self._rope_cache.clear()
            table = self._rope_cache[key] = self._build_rope_table(grid)
        return table

    @torch.inference_mode(False)  # a cached table must stay usable by a later training step
    def _build_rope_table(self, grid: tuple[int, int]) -> RopeTable:
        device = self.patch_embed.proj.weight.device
        half = self.cfg.head_dim // 2
        zeros = lambda n: torch.zeros(n, half, device=device)  # noqa: E731
        if self.rope is not None:
            patches = self.rope.angles(grid, device)
        else:
            patches = zeros(grid[0] * grid[1])
        side = math.isqrt(self.num_reg_tokens)
        registers = self.rope_reg.angles((side, side), device) if self.rope_reg else zeros(side**2)
        angles = torch.cat([zeros(self.num_prefix_tokens), patches, registers])
        return RopeTable.from_angles(angles, self.cfg.rope_layout)

    def prepare_tokens(self, x: torch.Tensor) -> tuple[torch.Tensor, tuple[int, int]]:
        """Images ``[B, C, H, W]`` to the input sequence ``[B, N, C]`` and its patch grid."""
        x = self.patch_embed(x)
        grid = (x.shape[-2], x.shape[-1])
        x = x.flatten(2).transpose(1, 2)
        if self.pos_embed is not None:
            x = x + resample_pos_embed(self.pos_embed, self.cfg.grid_size, grid)
        cls = [] if self.cls_token is None else [self.cls_token.expand(x.shape[0], -1, -1)]
        registers = [] if self.reg_token is None else [self.reg_token.expand(x.shape[0], -1, -1)]
        return torch.cat([*cls, x, *registers], dim=1), grid

    def _run_block(self, block: nn.Module, x: torch.Tensor, rope) -> torch.Tensor:
        if self.grad_checkpointing and torch.is_grad_enabled() and not torch.jit.is_scripting():
            return checkpoint(block, x, rope, use_reentrant=False)
        return block(x, rope)

    def forward_features(self, x: torch.Tensor) -> torch.Tensor:
        """All tokens after the final norm, ``[B, N, C]`` in ``[CLS | patches | registers]`` order."""
        x, grid = self.prepare_tokens(x)
        rope = self.rope_table(grid)
        for block in self.blocks:
            x = self._run_block(block, x, rope)
        return self.norm(x)

    def pool(self, x: torch.Tensor) -> torch.Tensor:
        """``"token"``: the CLS token; ``"avg"``: the mean of the patch tokens; ``""``: all tokens."""
        if self.global_pool == "token":
            return x[:, 0]
        if self.global_pool == "avg":
            return x[:, self.num_prefix_tokens : x.shape[1] - self.num_reg_tokens].mean(dim=1)
        return x

    def forward_head(self, x: torch.Tensor, pre_logits: bool = False) -> torch.Tensor:
        x = self.head_drop(self.pool(x))
        return x if pre_logits else self.head(x)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.forward_head(self.forward_features(x))

    def forward_intermediates(
        self,
        x: torch.Tensor,
        indices: int | Sequence[int] | None = None,
        return_prefix_tokens: bool = False,
        norm: bool = False,
        stop_early: bool = False,
        output_fmt: Literal["NCHW", "NLC"] = "NCHW",
        intermediates_only: bool = False,
    ) -> list | tuple[torch.Tensor, list]:
        """Outputs of the chosen blocks (timm contract): patch maps (``"NCHW"``) or tokens (``"NLC"``), with
        ``return_prefix_tokens`` also ``[B, 1 + R, C]`` (CLS then registers); raw unless ``norm``."""
        if output_fmt not in ("NCHW", "NLC"):
            raise ValueError(f"output_fmt must be 'NCHW' or 'NLC', got {output_fmt!r}")
        taken = take_indices(len(self.blocks), indices)
        wanted = set(taken)
        x, grid = self.prepare_tokens(x)
        layout = self.token_layout(grid)
        rope = self.rope_table(grid)
        last = max(taken) if stop_early else len(self.blocks) - 1
        outputs: dict[int, torch.Tensor] = {}
        for i, block in enumerate(self.blocks[: last + 1]):
            x = self._run_block(block, x, rope)
            if i in wanted:
                outputs[i] = self.norm(x) if norm else x
        intermediates = []
        for i in taken:
            y = outputs[i]
            patches = layout.patches(y)
            spatial = layout.to_nchw(patches) if output_fmt == "NCHW" else patches
            intermediates.append((spatial, layout.prefix(y)) if return_prefix_tokens else spatial)
        if intermediates_only:
            return intermediates
        return self.norm(x), intermediates

    def get_intermediate_layers(
        self,
        x: torch.Tensor,
        n: int | Sequence[int] = 1,
        reshape: bool = False,
        return_class_token: bool = False,
        return_extra_tokens: bool = False,
        norm: bool = True,
    ) -> tuple:
        """DINOv2/v3-style: per block, patch tokens (``[B, C, h, w]`` with ``reshape``), optionally with the
        CLS token and the registers ``[B, R, C]``; the DINO default ``norm=True``, unlike timm's."""
        fmt = "NCHW" if reshape else "NLC"
        outs = self.forward_intermediates(
            x, n, True, norm, stop_early=True, output_fmt=fmt, intermediates_only=True
        )
        results = []
        for patches, prefix in outs:
            item = [patches]
            if return_class_token:
                item.append(prefix[:, 0])
            if return_extra_tokens:
                item.append(prefix[:, self.num_prefix_tokens :])
            results.append(item[0] if len(item) == 1 else tuple(item))
        return tuple(results)

    def prune_intermediate_layers(
        self, indices: int | Sequence[int] = 1, prune_norm: bool = False, prune_head: bool = True
    ) -> list[int]:
        """Drop the blocks after the last one in ``indices`` (and the head / norm); returns the indices."""
        taken = take_indices(len(self.blocks), indices)
        self.blocks = self.blocks[: max(taken) + 1]
        self.cfg = self.cfg.replace(depth=len(self.blocks))
        if prune_norm:
            self.norm = nn.Identity()
        if prune_head:
            self.head_drop = nn.Identity()
            self.reset_classifier(0, "")
        return taken

    @torch.jit.ignore
    def no_weight_decay(self) -> set[str]:
        return {"pos_embed", "cls_token", "reg_token"}

    @torch.jit.ignore
    def group_matcher(self, coarse: bool = False) -> dict:
        return dict(
            stem=r"^cls_token|^reg_token|^pos_embed|^patch_embed",
            blocks=[(r"^blocks\.(\d+)", None), (r"^norm", (99999,))],
        )

    @torch.jit.ignore
    def set_grad_checkpointing(self, enable: bool = True) -> None:
        self.grad_checkpointing = enable

    @torch.jit.ignore
    def get_classifier(self) -> nn.Module:
        return self.head

    def reset_classifier(self, num_classes: int, global_pool: str | None = None) -> None:
        """Replace the head by a freshly initialised one for ``num_classes`` (0: no head); the config checks
        both values first (e.g. ``"token"`` without a CLS token), so the saved config rebuilds this model."""
        if global_pool not in (None, "token", "avg", ""):
            raise ValueError(
                f"unknown global_pool {global_pool!r}: use 'token', 'avg' or '' (no pooling)"
            )
        pool = {"global_pool": global_pool} if global_pool else {}  # '' (no pooling): no config
        self.cfg = self.cfg.replace(num_classes=num_classes, **pool)
        if global_pool is not None:
            self.global_pool = global_pool
        self.num_classes = num_classes
        device = self.patch_embed.proj.weight.device
        self.head = nn.Identity()
        if num_classes:
            self.head = nn.Linear(self.embed_dim, num_classes, device=device)
            nn.init.trunc_normal_(self.head.weight, std=0.02)
            nn.init.zeros_(self.head.bias)
        self.pretrained_cfg = self.default_cfg = self._pretrained_cfg()

    def set_input_size(self, img_size: int | tuple[int, int]) -> None:
        """Make a new input size permanent: resample the stored APE and update the config."""
        new_cfg = self.cfg.replace(img_size=img_size)
        if self.pos_embed is not None:
            with torch.no_grad():
                old = self.pos_embed.data
                resampled = resample_pos_embed(old, self.cfg.grid_size, new_cfg.grid_size)
            self.pos_embed = nn.Parameter(resampled)
        self.cfg = new_cfg
        self._rope_cache.clear()
        names = self.pretrained_cfg.get("label_names")  # the outputs still mean the same classes
        self.pretrained_cfg = self.default_cfg = self._pretrained_cfg()
        if names is not None:
            self.pretrained_cfg["label_names"] = names


def unwrap(model: nn.Module) -> nn.Module:
    """The module inside torch.compile / DDP / Accelerate wrappers, nested in any order
    (accelerate's ``extract_model_from_parallel`` peels one compile and the parallel wrappers under it)."""
    while True:
        inner = extract_model_from_parallel(model, keep_torch_compile=False)
        if inner is model:
            return model
        model = inner


def unwrap_model(model: nn.Module) -> ViT5:
    """The :class:`~vit5.ViT5` inside the wrappers :func:`unwrap` peels (TypeError for another model)."""
    vit = unwrap(model)
    if not isinstance(vit, ViT5):
        raise TypeError(f"expected a vit5 ViT5 model, got {type(vit).__name__}")
    return vit


def compile_blocks(model: nn.Module, **compile_kwargs: Any) -> nn.Module:
    """``nn.Module.compile(**compile_kwargs)`` each block in place (PyTorch's regional compilation recipe);
    returns ``model``. State-dict keys stay unchanged (no ``_orig_mod.``), so checkpoints and EMA work."""
    quiet_complex_fallback()
    for block in unwrap_model(model).blocks:
        block.compile(**compile_kwargs)
    return model


def quiet_complex_fallback() -> None:
    """Silence inductor's warning that it "does not support code generation for complex operators.
    Performance may be worse than eager" (torch/_inductor/lowering.py, ``_warn_complex_not_supported``):
    in a vit5 model the one complex operator is RoPE's product (:class:`~vit5.layers.RopeTable`),
    which runs as one aten kernel, as fast as the real formula fused (docs/speed.md), and the
    compiled step is faster than eager (docs/results.md). Called where vit5 compiles a model."""
    warnings.filterwarnings("ignore", message=_COMPLEX_FALLBACK, category=UserWarning)


_COMPLEX_FALLBACK = "Torchinductor does not support code generation for complex operators"

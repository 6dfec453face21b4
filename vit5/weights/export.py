"""Deployment: a ``torch.export`` program or an ONNX file (torch's dynamo exporter) of a model,
checked against eager torch.

The batch is dynamic, and with ``dynamic_size=True`` the sides are free from the model's own size
up (eager torch shrinks the APE with antialiasing, which one branch-free graph cannot do).
"""

from __future__ import annotations

import importlib.util
import json
import logging
import os
import shutil
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from vit5.errors import Vit5Error, storage_error
from vit5.files import fsync_file, staging_dir, sync_dir
from vit5.layers.patch_embed import grid_of

logger = logging.getLogger("vit5")

DEFAULT_ATOL = 1e-4
# protobuf files stop at 2 GiB: larger models keep their weights beside the graph
SINGLE_FILE_MAX_BYTES = 3 * 2**29


class ExportError(Vit5Error, ValueError):
    """A model cannot be exported as asked, or the export does not reproduce the model."""


@dataclass(frozen=True)
class OnnxExport:
    """What :func:`export_onnx` wrote and how closely onnxruntime reproduces torch."""

    path: Path
    # "batch" / "height" / "width" where dynamic
    input_shape: tuple[int | str, ...]
    # onnxruntime vs eager torch on random images; None when not checked
    max_abs_diff: float | None
    atol: float
    seconds: float

    @property
    def files(self) -> list[Path]:
        """The ONNX file, and the external weights file next to it when there is one."""
        data = self.path.with_name(self.path.name + ".data")
        return [p for p in (self.path, data) if p.exists()]

    def __str__(self) -> str:
        size_mb = sum(p.stat().st_size for p in self.files) / 2**20
        check = "not checked with onnxruntime"
        if self.max_abs_diff is not None:
            diff = f"max |difference| {self.max_abs_diff:.2e} (tolerance {self.atol:g})"
            check = f"onnxruntime matches torch: {diff}"
        files = " + ".join(map(str, self.files)) or self.path
        shape = "x".join(map(str, self.input_shape))
        return f"wrote {files} ({size_mb:.1f} MiB, input {shape}) in {self.seconds:.0f} s; {check}"


def export_program(
    model: nn.Module,
    size: tuple[int, int] | None = None,
    batch: int = 2,
    dynamic_batch: bool = True,
    dynamic_size: bool = False,
) -> torch.export.ExportedProgram:
    """``torch.export.export`` of ``model`` (in eval mode) for ``[batch, C, H, W]`` images (``size``
    defaults to the model's own)."""
    example, dynamic_shapes = _example_and_shapes(model, size, batch, dynamic_batch, dynamic_size)
    with _exporting(model, "torch.export", example):
        return torch.export.export(model, (example,), dynamic_shapes=dynamic_shapes)


def export_onnx(
    model: nn.Module,
    path: str | os.PathLike,
    size: tuple[int, int] | None = None,
    batch: int = 2,
    dynamic_batch: bool = True,
    dynamic_size: bool = False,
    opset: int | None = None,
    check: bool = True,
    atol: float = DEFAULT_ATOL,
    external_data: bool | None = None,
) -> OnnxExport:
    """Write ``model`` as an ONNX file (input ``"images"`` ``[batch, C, H, W]``, output
    ``"output"``), staged beside ``path`` and renamed into place, the graph last.

    ``external_data``: weights in ``PATH.data`` (default: beyond 1.5 GiB, protobuf's limit).
    ``check``: an onnxruntime output more than ``atol`` from eager torch raises
    :class:`ExportError` (the file is kept). Needs ``pip install 'vit5[export]'``.
    """
    needed = ("onnx", "onnxruntime", "onnxscript")
    missing = [name for name in needed if importlib.util.find_spec(name) is None]
    if missing:
        names = ", ".join(missing)
        raise ExportError(f"ONNX export needs {names}: pip install 'vit5[export]'")
    path = Path(path)  # its folder is created with the staging folder beside it
    example, dynamic_shapes = _example_and_shapes(model, size, batch, dynamic_batch, dynamic_size)
    if external_data is None:
        weight_bytes = sum(p.numel() * p.element_size() for p in model.parameters())
        external_data = weight_bytes > SINGLE_FILE_MAX_BYTES
    staged = staging_dir(path)
    start = time.perf_counter()
    onnx_file = staged / path.name
    try:
        with _exporting(model, "ONNX export", example, path):
            program = torch.onnx.export(
                model,
                (example,),
                input_names=["images"],
                output_names=["output"],
                dynamic_shapes=dynamic_shapes,
                opset_version=opset,
                dynamo=True,
                verbose=False,
            )
            program.model.metadata_props.update(onnx_metadata(model))
            program.save(str(onnx_file), external_data=external_data)
        seconds = time.perf_counter() - start
        diff = _onnx_difference(model, onnx_file, example) if check else None
        _put_in_place(onnx_file, path)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    sides = ("height", "width") if dynamic_size else tuple(example.shape[2:])
    batch_dim = "batch" if dynamic_batch else example.shape[0]
    report = OnnxExport(
        path=path,
        input_shape=(batch_dim, example.shape[1], *sides),
        max_abs_diff=diff,
        atol=atol,
        seconds=seconds,
    )
    if diff is not None and not diff <= atol:
        raise ExportError(
            f"{report}: above the tolerance, so the export is not faithful (kept for inspection)"
        )
    logger.info(str(report))
    return report


def _onnx_difference(model: nn.Module, onnx_file: Path, example: torch.Tensor) -> float:
    """The largest |onnxruntime - eager torch| on the example images (CPU, fp32)."""
    import onnxruntime  # the optional export extra

    providers = ["CPUExecutionProvider"]
    session = onnxruntime.InferenceSession(str(onnx_file), providers=providers)
    images = example.detach().float().cpu().numpy()
    (onnx_out,) = session.run(None, {"images": images})
    with _exporting(model), torch.no_grad():
        eager = model(example).float().cpu()
    return float((torch.from_numpy(onnx_out) - eager).abs().max())


def _put_in_place(staged: Path, path: Path) -> None:
    """Rename a staged export over ``path``, weights first, graph last: no old graph meets new
    weights."""
    data = staged.with_name(path.name + ".data")
    target_data = path.with_name(path.name + ".data")
    has_data = data.exists()
    try:
        for written in (staged, data) if has_data else (staged,):
            fsync_file(written)
        if has_data:
            path.unlink(missing_ok=True)
            os.replace(data, target_data)
        os.replace(staged, path)
        if not has_data:
            target_data.unlink(missing_ok=True)  # a previous export's weights, now stale
    except OSError as err:
        raise storage_error(err, path) from err
    sync_dir(path.parent)


def onnx_metadata(model: nn.Module) -> dict[str, str]:
    """timm's data config (``mean``, ``std``, ``input_size``, ``interpolation``, ``crop_pct``) and
    the class names (``label_names``) as ONNX ``metadata_props`` (strings; lists as JSON)."""
    from timm.data import resolve_model_data_config

    data = resolve_model_data_config(model)
    lists = [key for key in ("mean", "std", "input_size") if key in data]
    meta = {key: json.dumps(list(data[key])) for key in lists}
    scalars = [key for key in ("interpolation", "crop_pct") if key in data]
    meta.update({key: str(data[key]) for key in scalars})
    names = (getattr(model, "pretrained_cfg", None) or {}).get("label_names")
    if names:
        meta["label_names"] = json.dumps([str(n) for n in names])
    return meta


def _example_and_shapes(
    model: nn.Module,
    size: tuple[int, int] | None,
    batch: int,
    dynamic_batch: bool,
    dynamic_size: bool,
) -> tuple[torch.Tensor, tuple[dict[int, object]]]:
    """Random example images to trace with, and the dynamic dimensions of ``torch.export``."""
    cfg = getattr(model, "cfg", None)
    if cfg is not None:
        own = (cfg.in_chans, *cfg.img_size)
    else:
        own = model.pretrained_cfg["input_size"]
    in_chans = own[0]
    size = tuple(size) if size is not None else tuple(own[1:])
    patch = cfg.patch_size if cfg is not None else 1
    if len(size) != 2 or batch < 1:
        wanted = "size must be (height, width) and batch >= 1"
        raise ExportError(f"{wanted}, got size {size}, batch {batch}")
    grid = grid_of(size, patch, error=ExportError)
    dims = {}
    if dynamic_batch:
        # torch.export specialises a dimension of size 1: trace with 2 to keep it free
        batch = max(batch, 2)
        dims[0] = torch.export.Dim("batch", min=1, max=4096)
    if dynamic_size:
        if cfg is None:
            raise ExportError(
                "dynamic_size needs a vit5 model (its patch size and stored grid set the range)"
            )
        names = ("grid_h", "grid_w")
        for axis, (stored, name) in enumerate(zip(cfg.grid_size, names), start=2):
            side = torch.export.Dim(name, min=max(stored, 2), max=max(4 * stored, 64))
            dims[axis] = patch * side
        # trace inside the range
        grid = tuple(max(g, s) for g, s in zip(grid, cfg.grid_size))
        size = (grid[0] * patch, grid[1] * patch)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    return torch.randn(batch, in_chans, *size, device=device), (dims,)


@contextmanager
def _exporting(
    model: nn.Module,
    what: str = "",
    example: torch.Tensor | None = None,
    path: Path | None = None,
) -> Iterator[None]:
    """Eval mode for the duration, then the caller's mode back; an exporter's failure (``what``) is
    one :class:`ExportError`, or a storage error naming ``path`` when an OS error (a full disk) is
    behind it."""
    was_training = model.training
    model.eval()
    try:
        yield
    except Exception as err:
        if not what:
            raise
        cause = _os_error_behind(err)
        if path is not None and cause is not None:
            raise storage_error(cause, path) from err
        name = type(model).__name__
        shape = tuple(example.shape)
        raise ExportError(f"{what} failed for {name} at input {shape}: {err}") from err
    finally:
        model.train(was_training)


def _os_error_behind(err: BaseException) -> OSError | None:
    """A full disk or a file-size limit deep in an exporter's exception chain, if one is there."""
    cause: BaseException | None = err
    seen = set()
    while cause is not None and id(cause) not in seen:
        if isinstance(cause, OSError):
            return cause
        seen.add(id(cause))
        cause = cause.__cause__ or cause.__context__
    return None

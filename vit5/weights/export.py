"""Deployment: a ``torch.export`` program or an ONNX file (torch's dynamo exporter) of a model, checked
against eager torch; a dynamic batch, and with ``dynamic_size=True`` free sides from the model's own size up
(eager torch shrinks the APE with antialiasing, which one branch-free graph cannot do)."""

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
SINGLE_FILE_MAX_BYTES = (
    3 * 2**29
)  # protobuf files stop at 2 GiB: larger models keep their weights beside


class ExportError(Vit5Error, ValueError):
    """A model cannot be exported as asked, or the export does not reproduce the model."""


@dataclass(frozen=True)
class OnnxExport:
    """What :func:`export_onnx` wrote and how closely onnxruntime reproduces torch."""

    path: Path
    input_shape: tuple[int | str, ...]  # "batch" / "height" / "width" where dynamic
    max_abs_diff: float | None  # onnxruntime vs eager torch on random images; None when not checked
    atol: float
    seconds: float

    @property
    def files(self) -> list[Path]:
        """The ONNX file, and the external weights file next to it when there is one."""
        return [p for p in (self.path, self.path.with_name(self.path.name + ".data")) if p.exists()]

    def __str__(self) -> str:
        size_mb = sum(p.stat().st_size for p in self.files) / 2**20
        check = (
            f"onnxruntime matches torch: max |difference| {self.max_abs_diff:.2e} (tolerance {self.atol:g})"
            if self.max_abs_diff is not None
            else "not checked with onnxruntime"
        )
        return (
            f"wrote {' + '.join(map(str, self.files)) or self.path} ({size_mb:.1f} MiB, input "
            f"{'x'.join(map(str, self.input_shape))}) in {self.seconds:.0f} s; {check}"
        )


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
    """Write ``model`` as an ONNX file (input ``"images"`` ``[batch, C, H, W]``, output ``"output"``), staged
    beside ``path`` and renamed into place, the graph last. ``external_data``: weights in ``PATH.data``
    (default: beyond 1.5 GiB, protobuf's limit). ``check``: an onnxruntime output more than ``atol`` from
    eager torch raises :class:`ExportError` (the file is kept). Needs ``pip install 'vit5[export]'``."""
    missing = [
        name
        for name in ("onnx", "onnxruntime", "onnxscript")
        if importlib.util.find_spec(name) is None
    ]
    if missing:
        raise ExportError(f"ONNX export needs {', '.join(missing)}: pip install 'vit5[export]'")
    path = Path(path)  # its folder is created with the staging folder beside it
    example, dynamic_shapes = _example_and_shapes(model, size, batch, dynamic_batch, dynamic_size)
    if external_data is None:
        external_data = (
            sum(p.numel() * p.element_size() for p in model.parameters()) > SINGLE_FILE_MAX_BYTES
        )
    staged, start = staging_dir(path), time.perf_counter()
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
        seconds, diff = time.perf_counter() - start, None
        if check:  # largest |onnxruntime - eager torch| on the example images (CPU, fp32)
            import onnxruntime

            session = onnxruntime.InferenceSession(
                str(onnx_file), providers=["CPUExecutionProvider"]
            )
            (onnx_out,) = session.run(None, {"images": example.detach().float().cpu().numpy()})
            with _exporting(model), torch.no_grad():
                diff = float(
                    (torch.from_numpy(onnx_out) - model(example).float().cpu()).abs().max()
                )
        _put_in_place(onnx_file, path)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    hw = ("height", "width") if dynamic_size else tuple(example.shape[2:])
    report = OnnxExport(
        path,
        ("batch" if dynamic_batch else example.shape[0], example.shape[1], *hw),
        diff,
        atol,
        seconds,
    )
    if diff is not None and not diff <= atol:
        raise ExportError(
            f"{report}: above the tolerance, so the export is not faithful (kept for inspection)"
        )
    logger.info(str(report))
    return report


def _put_in_place(staged: Path, path: Path) -> None:
    """Rename a staged export over ``path``, weights first, graph last: no old graph meets new weights."""
    data, target_data = staged.with_name(path.name + ".data"), path.with_name(path.name + ".data")
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
    """timm's data config (``mean``, ``std``, ``input_size``, ``interpolation``, ``crop_pct``) and the class
    names (``label_names``) as ONNX ``metadata_props`` (strings; lists as JSON)."""
    from timm.data import resolve_model_data_config

    data = resolve_model_data_config(model)
    meta = {
        key: json.dumps(list(data[key])) for key in ("mean", "std", "input_size") if key in data
    }
    meta.update({key: str(data[key]) for key in ("interpolation", "crop_pct") if key in data})
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
    cfg = getattr(model, "cfg", None)
    in_chans, *own = (
        (cfg.in_chans, *cfg.img_size) if cfg is not None else model.pretrained_cfg["input_size"]
    )
    size, patch = (
        tuple(size) if size is not None else tuple(own),
        cfg.patch_size if cfg is not None else 1,
    )
    if len(size) != 2 or batch < 1:
        raise ExportError(
            f"size must be (height, width) and batch >= 1, got size {size}, batch {batch}"
        )
    grid, dims = grid_of(size, patch, error=ExportError), {}
    if dynamic_batch:
        batch = max(
            batch, 2
        )  # torch.export specialises a dimension of size 1: trace with 2 to keep it free
        dims[0] = torch.export.Dim("batch", min=1, max=4096)
    if dynamic_size:
        if cfg is None:
            raise ExportError(
                "dynamic_size needs a vit5 model (its patch size and stored grid set the range)"
            )
        for axis, (stored, name) in enumerate(zip(cfg.grid_size, ("grid_h", "grid_w")), start=2):
            dims[axis] = patch * torch.export.Dim(name, min=max(stored, 2), max=max(4 * stored, 64))
        grid = tuple(max(g, s) for g, s in zip(grid, cfg.grid_size))  # trace inside the range
        size = (grid[0] * patch, grid[1] * patch)
    device = next((p.device for p in model.parameters()), torch.device("cpu"))
    return torch.randn(batch, in_chans, *size, device=device), (dims,)


@contextmanager
def _exporting(
    model: nn.Module, what: str = "", example: torch.Tensor | None = None, path: Path | None = None
) -> Iterator[None]:
    """Eval mode for the duration, then the caller's mode back; an exporter's failure (``what``) is one
    :class:`ExportError`, or a storage error naming ``path`` when an OS error (a full disk) is behind it."""
    was_training = model.training
    model.eval()
    try:
        yield
    except Exception as err:
        if not what:
            raise
        cause, seen = (
            err,
            set(),
        )  # a full disk or a file-size limit deep in the exporter's exception chain
        while cause is not None and not isinstance(cause, OSError) and id(cause) not in seen:
            seen.add(id(cause))
            cause = cause.__cause__ or cause.__context__
        if path is not None and isinstance(cause, OSError):
            raise storage_error(cause, path) from err
        raise ExportError(
            f"{what} failed for {type(model).__name__} at input {tuple(example.shape)}: {err}"
        ) from err
    finally:
        model.train(was_training)

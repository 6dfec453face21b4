"""Deployment: a ``torch.export`` program or an ONNX file of a model, checked against eager torch.

    import vit5
    model = vit5.create_model("vit5_small", pretrained=True)
    program = vit5.export_program(model, size=(224, 224))          # torch.export.ExportedProgram
    report = vit5.export_onnx(model, "vit5_small.onnx", size=(224, 224))
    print(report)  # path, input shape, onnxruntime vs torch max |difference|

    vit5 export --model vit5_small --onnx vit5_small.onnx [--size N|HxW]

Both trace the eager model with ``torch.export`` (ONNX through torch's dynamo exporter), so the
graph is the model's own forward, not a re-implementation. Shapes: the batch dimension is
dynamic by default; height and width are fixed at ``size`` unless ``dynamic_size=True``. With
``dynamic_size=True`` any patch-multiple size from the model's own ``img_size`` upward runs
through one graph: the APE is then always resampled with plain bicubic interpolation, which is
exact at the stored size and what eager torch does when enlarging; eager torch shrinks with
antialiasing, which one branch-free graph cannot do, so smaller sizes are outside the exported
range (torch.export refuses them; an ONNX runtime does not check, and would resample without
antialiasing). ONNX files are verified with onnxruntime on random images before returning; the
``export`` extra installs onnx, onnxruntime and onnxscript (``pip install 'vit5[export]'``).

Files are written atomically: the ONNX file (and its ``.data`` weights, when external) is exported
and checked in a hidden staging folder beside the target, then renamed into place, the graph last,
so a kill, a full disk or a file-size limit leaves the previous export as it was (or, between the
two renames, no graph at all: never an old graph over new weights). ``vit5 export --program``
writes its program with :func:`vit5.files.atomic_write_bytes`.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from vit5.errors import Vit5Error, storage_error
from vit5.files import fsync_file, staging_dir, sync_dir
from vit5.layers.patch_embed import grid_of

logger = logging.getLogger("vit5")

DEFAULT_ATOL = 1e-4
SINGLE_FILE_MAX_BYTES = 3 * 2**29  # protobuf files stop at 2 GiB: larger models keep their weights beside


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
        data = self.path.with_name(self.path.name + ".data")
        return [p for p in (self.path, data) if p.exists()]

    def __str__(self) -> str:
        size_mb = sum(p.stat().st_size for p in self.files) / 2**20
        shape = "x".join(str(d) for d in self.input_shape)
        written = " + ".join(str(p) for p in self.files) or str(self.path)
        check = (
            f"onnxruntime matches torch: max |difference| {self.max_abs_diff:.2e} (tolerance {self.atol:g})"
            if self.max_abs_diff is not None
            else "not checked with onnxruntime"
        )
        return f"wrote {written} ({size_mb:.1f} MiB, input {shape}) in {self.seconds:.0f} s; {check}"


def export_program(
    model: nn.Module,
    size: tuple[int, int] | None = None,
    batch: int = 2,
    dynamic_batch: bool = True,
    dynamic_size: bool = False,
) -> torch.export.ExportedProgram:
    """``torch.export.export`` of ``model`` (in eval mode) for ``[batch, C, H, W]`` images.

    ``size`` defaults to the model's own input size. See the module docstring for which
    dimensions are dynamic.
    """
    example, dynamic_shapes = _example_and_shapes(model, size, batch, dynamic_batch, dynamic_size)
    with _eval_mode(model):
        try:
            return torch.export.export(model, (example,), dynamic_shapes=dynamic_shapes)
        except Exception as err:  # torch's own message follows; ours says what was being exported
            raise ExportError(
                f"torch.export failed for {type(model).__name__} at {_shape(example)}: {err}"
            ) from err


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
    """Write ``model`` as an ONNX file (input ``"images"`` ``[batch, C, H, W]``, output ``"output"``).

    ``external_data``: weights in ``PATH.data`` beside the graph; default: one self-contained file
    unless the weights exceed 1.5 GiB (protobuf's 2 GiB limit).
    ``check``: run the file with onnxruntime on random images and raise :class:`ExportError` when
    an output differs from eager torch by more than ``atol`` (the file is kept for inspection).
    """
    _require_onnx()
    path = Path(path)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise storage_error(err, path.parent, "create") from err
    example, dynamic_shapes = _example_and_shapes(model, size, batch, dynamic_batch, dynamic_size)
    if external_data is None:
        external_data = sum(p.numel() * p.element_size() for p in model.parameters()) > SINGLE_FILE_MAX_BYTES
    staged = staging_dir(path)
    try:
        report = _export_staged(
            model,
            staged / path.name,
            example,
            dynamic_shapes,
            external_data,
            opset,
            check,
            atol,
            dynamic_batch,
            dynamic_size,
        )
        _put_in_place(staged / path.name, path)
    finally:
        shutil.rmtree(staged, ignore_errors=True)
    report = OnnxExport(path, report.input_shape, report.max_abs_diff, atol, report.seconds)
    if report.max_abs_diff is not None and not report.max_abs_diff <= atol:
        raise ExportError(
            f"{report}: above the tolerance, so the export is not faithful (kept for inspection)"
        )
    logger.info(str(report))
    return report


def _export_staged(
    model: nn.Module,
    path: Path,
    example: torch.Tensor,
    dynamic_shapes: tuple[dict[int, object]],
    external_data: bool,
    opset: int | None,
    check: bool,
    atol: float,
    dynamic_batch: bool,
    dynamic_size: bool,
) -> OnnxExport:
    """Export into the staging folder and check it there."""
    start = time.perf_counter()
    with _eval_mode(model):
        try:
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
        except Exception as err:
            raise ExportError(
                f"ONNX export failed for {type(model).__name__} at {_shape(example)}: {err}"
            ) from err
        program.model.metadata_props.update(onnx_metadata(model))
        try:
            program.save(str(path), external_data=external_data)
        except Exception as err:
            disk = _os_error(err)
            if disk is None:
                raise
            # a full disk or a file-size limit, named by the target (``path`` is its staged copy)
            raise storage_error(disk, path.parent.parent / path.name) from err
    seconds = time.perf_counter() - start
    names = (
        "batch" if dynamic_batch else example.shape[0],
        example.shape[1],
        "height" if dynamic_size else example.shape[2],
        "width" if dynamic_size else example.shape[3],
    )
    diff = onnx_max_abs_diff(model, path, example) if check else None
    return OnnxExport(path, names, diff, atol, seconds)


def _put_in_place(staged: Path, path: Path) -> None:
    """Rename a complete staged export over ``path``: its weights file first, the graph last."""
    data_name = path.name + ".data"
    try:
        for written in (staged, staged.parent / data_name):
            if written.exists():
                fsync_file(written)
        if (staged.parent / data_name).exists():
            path.unlink(missing_ok=True)  # the old graph must never meet the new weights
            os.replace(staged.parent / data_name, path.with_name(data_name))
            os.replace(staged, path)
        else:
            os.replace(staged, path)
            path.with_name(data_name).unlink(missing_ok=True)  # a previous export's weights, now stale
    except OSError as err:
        raise storage_error(err, path) from err
    sync_dir(path.parent)


def _os_error(err: BaseException | None) -> OSError | None:
    """The OS error (disk full, file too large, ...) behind an exporter's exception, if any."""
    seen = set()
    while err is not None and id(err) not in seen:
        if isinstance(err, OSError):
            return err
        seen.add(id(err))
        err = err.__cause__ or err.__context__
    return None


def onnx_metadata(model: nn.Module) -> dict[str, str]:
    """What a runtime needs besides the graph, as ONNX ``metadata_props`` (strings; lists as JSON):
    the preprocessing of timm's data config (``mean``, ``std``, ``input_size``, ``interpolation``,
    ``crop_pct``) and, when the model records them, the class names (``label_names``)."""
    from timm.data import resolve_model_data_config

    data = resolve_model_data_config(model)
    meta = {key: json.dumps(list(data[key])) for key in ("mean", "std", "input_size") if key in data}
    meta.update({key: str(data[key]) for key in ("interpolation", "crop_pct") if key in data})
    names = (getattr(model, "pretrained_cfg", None) or {}).get("label_names")
    if names:
        meta["label_names"] = json.dumps([str(n) for n in names])
    return meta


def onnx_max_abs_diff(model: nn.Module, path: str | os.PathLike, images: torch.Tensor) -> float:
    """Largest |onnxruntime - eager torch| over the outputs for ``images`` (CPU, fp32)."""
    import onnxruntime

    session = onnxruntime.InferenceSession(str(path), providers=["CPUExecutionProvider"])
    images = images.detach().float().cpu()
    (onnx_out,) = session.run(None, {session.get_inputs()[0].name: images.numpy()})
    with _eval_mode(model), torch.no_grad():
        torch_out = model(images.to(_device(model)))
    return float((torch.from_numpy(onnx_out) - torch_out.float().cpu()).abs().max())


# ------------------------------------------------------------------------------------------ helpers
def _example_and_shapes(
    model: nn.Module, size: tuple[int, int] | None, batch: int, dynamic_batch: bool, dynamic_size: bool
) -> tuple[torch.Tensor, tuple[dict[int, object]]]:
    cfg = getattr(model, "cfg", None)
    own = tuple(cfg.img_size) if cfg is not None else tuple(model.pretrained_cfg["input_size"][1:])
    size = tuple(size) if size is not None else own
    patch = cfg.patch_size if cfg is not None else 1
    in_chans = cfg.in_chans if cfg is not None else model.pretrained_cfg["input_size"][0]
    if len(size) != 2 or batch < 1:
        raise ExportError(f"size must be (height, width) and batch >= 1, got size {size}, batch {batch}")
    grid = grid_of(size, patch, error=ExportError)
    if dynamic_batch and batch < 2:
        batch = 2  # torch.export specialises a dimension of size 1: trace with 2 to keep the batch free
    dims: dict[int, object] = {}
    if dynamic_batch:
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
    example = torch.randn(batch, in_chans, *size, device=_device(model))
    return example, (dims,)


def _device(model: nn.Module) -> torch.device:
    return next((p.device for p in model.parameters()), torch.device("cpu"))


def _shape(x: torch.Tensor) -> str:
    return "x".join(map(str, x.shape))


class _eval_mode:
    """Eval mode for the duration, then the caller's mode back."""

    def __init__(self, model: nn.Module) -> None:
        self.model, self.was_training = model, model.training

    def __enter__(self) -> None:
        self.model.eval()

    def __exit__(self, *exc: object) -> None:
        self.model.train(self.was_training)


def _require_onnx() -> None:
    missing = [name for name in ("onnx", "onnxruntime", "onnxscript") if _missing(name)]
    if missing:
        raise ExportError(f"ONNX export needs {', '.join(missing)}: pip install 'vit5[export]'")


def _missing(module: str) -> bool:
    import importlib.util

    return importlib.util.find_spec(module) is None

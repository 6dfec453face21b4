"""Where the work runs: the printing process (rank 0), the one way processes agree (the main process
works, the others wait and share its error), device names checked up front, and memory estimates
checked against the memory there. torch and Accelerate are imported by the functions that need
them, so the command line starts without them."""

from __future__ import annotations

import ctypes
import os
import platform
import sys
from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from vit5.errors import StorageError, Vit5Error, user_message

if TYPE_CHECKING:
    import torch
    from accelerate import Accelerator

T = TypeVar("T")

DEVICE_HELP = "auto (cuda when available), cpu, cuda, cuda:1, mps"


def resolve_device(name: str) -> torch.device:
    """``"auto"`` -> cuda when available, else cpu; any other name is checked to exist
    (Vit5Error)."""
    import torch

    if name == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    try:
        device = torch.device(name)
    except (RuntimeError, ValueError):
        raise Vit5Error(f"--device {name!r} is not a device: use {DEVICE_HELP}") from None
    if device.type == "cuda":
        count = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if count == 0:
            none = "torch sees no CUDA device on this machine"
            raise Vit5Error(f"--device {name}: {none}; use --device cpu")
        if device.index is not None and device.index >= count:
            seen = f"torch sees {count} CUDA device(s) (cuda:0..cuda:{count - 1})"
            raise Vit5Error(f"--device {name}: {seen}")
    elif device.type == "mps" and not torch.backends.mps.is_available():
        raise Vit5Error(f"--device {name}: MPS is not available on this machine; use --device cpu")
    elif device.type not in ("cpu", "cuda", "mps"):
        raise Vit5Error(f"--device {name}: vit5 runs on {DEVICE_HELP}, not {device.type}")
    return device


def available_memory(device: torch.device | str) -> int:
    """Bytes that can still be allocated on ``device``: free CUDA memory, or the host's
    available RAM."""
    import psutil
    import torch

    device = torch.device(device)
    if device.type == "cuda":
        return int(torch.cuda.mem_get_info(device)[0])
    return int(psutil.virtual_memory().available)


def format_bytes(n: float) -> str:
    """``1.5e9`` -> ``"1.40 GiB"`` (binary units)."""
    for unit, scale in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if abs(n) >= scale:
            return f"{n / scale:.2f} {unit}"
    return f"{n:.0f} B"


def check_fits(needed: int, device: torch.device | str, what: str, fix: str) -> None:
    """Refuse work whose memory estimate ``needed`` exceeds what ``device`` has available
    (Vit5Error)."""
    import torch

    have = available_memory(device)
    if needed > have:
        raise Vit5Error(
            f"{what} needs about {format_bytes(needed)} of memory, but {torch.device(device)} has "
            f"{format_bytes(have)} available; {fix}"
        )


def is_main_process() -> bool:
    """Rank 0 of a launched job (torchrun / accelerate launch set RANK), or a single process."""
    return int(os.environ.get("RANK", "0")) == 0


def print_main(message: str, err: bool = False) -> None:
    """Print once per job, not once per process (before Accelerate is up, from the launcher's
    rank)."""
    if is_main_process():
        print(message, file=sys.stderr if err else sys.stdout, flush=True)


def cpu_count() -> int:
    """The CPUs this process may run on (its affinity mask, e.g. a container's share)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):  # no affinity masks (macOS, Windows)
        return max(1, os.cpu_count() or 1)


def default_workers(most: int = 4) -> int:
    """Loader workers that leave the model a CPU: ``min(most, CPUs - 1)``
    (``docs/evaluation.md``)."""
    return max(0, min(most, cpu_count() - 1))


def fit_workers(requested: int, setting: str = "num_workers") -> tuple[int, str]:
    """``requested`` loader workers clamped to :func:`cpu_count`, and a note naming ``setting``
    if clamped."""
    cpus = cpu_count()
    if requested <= cpus:
        return requested, ""
    note = f"{setting}={requested} but this process may use {cpus} CPUs: {cpus} loader workers"
    return (cpus, note)


def fit_precision(requested: str, on_cpu: bool) -> tuple[str, str]:
    """``requested`` mixed precision (``fp32``, ``bf16``, ``fp16``) as this machine runs it, and a
    note if changed: bf16 autocast on a CPU without native bf16 matrix units (AVX512-BF16 or AMX;
    oneDNN's ``_is_mkldnn_bf16_supported``) falls back to emulated kernels, measured 16-40x slower
    than fp32 for a ViT's matrix products on an AVX2-only AMD EPYC, so such a run trains in fp32."""
    emulated = emulated_bf16(on_cpu)
    if requested != "bf16" or not emulated:
        return requested, ""
    note = (
        f"run.mixed_precision=bf16 runs as fp32: this CPU ({emulated}) has no native bf16 "
        "matrix multiply (emulated bf16 is 16-40x slower); set run.mixed_precision=fp32 to silence"
    )
    return "fp32", note


def emulated_bf16(on_cpu: bool) -> str:
    """This CPU's capability (``AVX2``, ...) where a run ``on_cpu`` would emulate bf16 matrix
    products (no AVX512-BF16 or AMX, oneDNN's ``_is_mkldnn_bf16_supported``), else ``""``."""
    import torch

    if not on_cpu or torch.ops.mkldnn._is_mkldnn_bf16_supported():
        return ""
    return torch.backends.cpu.get_cpu_capability()


def missing_cpu_compiler() -> str:
    """Why ``torch.compile`` cannot build CPU kernels here, or ``""`` when it can. Inductor compiles C++
    with the first working compiler of ``torch._inductor.config.cpp.cxx`` (``g++`` by default;
    ``get_cpp_compiler`` in torch/_inductor/cpp_builder.py) and, without one, fails at the first
    compiled call, deep inside torch."""
    try:
        from torch._inductor.cpp_builder import get_cpp_compiler
        from torch._inductor.exc import InvalidCxxCompiler
    except ImportError:  # another torch layout: torch's own error at the first compiled call
        return ""
    try:
        get_cpp_compiler()
    except InvalidCxxCompiler as e:
        return str(e)
    return ""


def fit_threads(workers: int, device: torch.device | str = "cpu") -> int:
    """On a CPU device, lower torch's thread count to the CPUs the loader workers leave free (an
    explicit ``OMP_NUM_THREADS`` wins): workers beside a full OpenMP pool spin-wait on each other.
    Returns it."""
    import torch

    if torch.device(device).type != "cpu" or "OMP_NUM_THREADS" in os.environ:
        return torch.get_num_threads()
    threads = max(1, cpu_count() - workers)
    if torch.get_num_threads() > threads:
        torch.set_num_threads(threads)
    return torch.get_num_threads()


# glibc's mallopt parameters (malloc/malloc.h) and the largest mmap threshold it takes on a 64-bit
# build (DEFAULT_MMAP_THRESHOLD_MAX, 4 MiB x sizeof(long), malloc/malloc.c)
_M_TRIM_THRESHOLD = -1
_M_MMAP_THRESHOLD = -3
_MMAP_THRESHOLD = 32 * 2**20
_TRIM_THRESHOLD = 2**30
_MALLOC_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_")


def keep_freed_memory() -> bool:
    """Make glibc's malloc keep the memory a CPU step frees for the next step's tensors.

    By default glibc maps blocks above a threshold that moves with the program's frees, and hands
    the top of its heap back to the system beyond a second one (``mallopt(3)``; the "Memory
    Allocation Tunables" of the glibc manual); a training step's activations, freed by the backward
    and allocated again by the next forward, then come back as fresh zeroed pages: 27,000-53,000
    page faults a step of the ``fashion_mnist_cpu`` trunk at batch 256 on 2 AVX2 cores, 100-190 ms
    of system time. Pinning both thresholds (blocks up to 32 MiB from the heap, which keeps up to
    1 GiB free) removes them: 1.12x the training step, about 1.06x ``vit5_small``'s forward and
    1.09x a whole ``vit5 train`` run there, for 10 % more peak memory (freed blocks are kept for
    reuse; docs/results.md, "Page faults"). The PyTorch CPU tuning guide's remedy is
    another allocator preloaded (jemalloc, tcmalloc); this is the same reuse with the one the
    process has. Nothing on other C libraries, nor when ``MALLOC_MMAP_THRESHOLD_`` /
    ``MALLOC_TRIM_THRESHOLD_`` or ``GLIBC_TUNABLES``' malloc entries choose otherwise. Returns
    whether it pinned them; the ``vit5`` command calls it once at start."""
    tunables = os.environ.get("GLIBC_TUNABLES", "")
    chosen = any(name in os.environ for name in _MALLOC_SETTINGS) or "glibc.malloc" in tunables
    if chosen or not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc":
        return False
    libc = ctypes.CDLL(None)
    pinned_mmap = libc.mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)
    pinned_trim = libc.mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD)
    return pinned_mmap == 1 and pinned_trim == 1


def end_process_group() -> None:
    """Destroy the process group a command ran in (``accelerate launch``), after its work returned.

    A group left to the interpreter's exit keeps its communication threads running while the
    interpreter tears down, which can abort the process after a successful run ("terminate called
    without an active exception", pytorch/pytorch#190489; PyTorch's "Shutdown" docs ask for this
    call). Only after the work returned: with a bug's traceback on one rank, the others may still be
    inside a collective, and waiting for them could hang (pytorch/torchtitan#1342). The group is freed
    only once nothing else holds it: :meth:`vit5.train.Trainer.close` lets go of the DDP wrapper."""
    torch = sys.modules.get("torch")  # a command that never imported torch started no group
    if (
        torch is not None
        and torch.distributed.is_available()
        and torch.distributed.is_initialized()
    ):
        torch.distributed.destroy_process_group()


def attempt(action: Callable[[], Any]) -> Exception | None:
    """Run ``action``; its user error (:class:`Vit5Error`, ``OSError``) is returned, not raised.
    Anything else is a bug and propagates with its traceback."""
    try:
        action()
    except (Vit5Error, OSError) as err:
        return err
    return None


def raise_agreed(
    accelerator: Accelerator,
    error: Exception | str | None,
    kind: type[Exception] = StorageError,
) -> None:
    """Collective: when any process failed, raise the first failure (by process index) on every
    process, so none waits at a barrier for a peer that has given up; else a barrier. ``error`` is
    this process's failure: a :class:`Vit5Error` keeps its class, an ``OSError`` (said readably)
    or a message is raised as ``kind``."""
    failures = [None if error is None else _failure(error, kind)]
    if accelerator.num_processes > 1:
        from accelerate.utils import gather_object

        failures = gather_object(failures)
    first = next((failure for failure in failures if failure is not None), None)
    if first is None:
        accelerator.wait_for_everyone()
        return
    cls, message = first
    raise cls(message) from (error if isinstance(error, BaseException) else None)


def _failure(error: Exception | str, kind: type[Exception]) -> tuple[type[Exception], str]:
    """What other processes need to raise ``error`` too: its class and its one-line message."""
    if isinstance(error, Vit5Error):
        return (type(error), str(error))
    if isinstance(error, OSError):
        return (kind, user_message(error) or str(error))
    return (kind, str(error))


def on_main(
    accelerator: Accelerator,
    action: Callable[[], T],
    kind: type[Exception] = StorageError,
) -> T | None:
    """Run ``action`` on the main process while the others wait (collective); its user error is
    raised on every process (:func:`raise_agreed`). Returns what ``action`` returned on the main
    process, None on the others (:func:`from_main` shares a value)."""
    results: list[T] = []
    error = None
    if accelerator.is_main_process:
        error = attempt(lambda: results.append(action()))
    raise_agreed(accelerator, error, kind)
    return results[0] if results else None


def from_main(accelerator: Accelerator, value: T) -> T:
    """The main process's ``value`` on every process (collective; the value must pickle)."""
    if accelerator.num_processes == 1:
        return value
    from accelerate.utils import broadcast_object_list

    shared = [value]
    broadcast_object_list(shared, from_process=0)
    return shared[0]

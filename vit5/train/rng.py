"""Every random number generator a training process draws from, as plain JSON (no pickle).

``capture_rng()`` reads Python's ``random``, NumPy's global generator, torch's CPU generator and
every CUDA device's generator; ``restore_rng(state)`` puts them back after checking the shape of
every field, so a damaged or crafted file is refused (``ValueError``) instead of silently leaving
a generator unrestored. Together with the model, optimizer and loop position this makes a resumed
run draw exactly the augmentations, drop-path masks and Mixup pairs of an uninterrupted one.

Accelerate's own ``save_state`` writes the same generators with ``torch.save`` (a pickle) and only
logs, at info level, when it cannot restore them; vit5 writes them itself to keep both properties.
"""

from __future__ import annotations

import base64
import random
from typing import Any

import numpy as np
import torch

FORMAT = "vit5-rng/1"


def capture_rng() -> dict[str, Any]:
    """The current state of every generator, JSON-serialisable."""
    version, internal, gauss = random.getstate()
    kind, keys, pos, has_gauss, cached = np.random.get_state(legacy=True)
    state: dict[str, Any] = {
        "format": FORMAT,
        "python": {"version": version, "state": list(internal), "gauss_next": gauss},
        "numpy": {
            "kind": kind,
            "keys": keys.tolist(),
            "pos": int(pos),
            "has_gauss": int(has_gauss),
            "cached_gaussian": float(cached),
        },
        "torch": _encode(torch.get_rng_state()),
        "cuda": [_encode(s) for s in torch.cuda.get_rng_state_all()] if torch.cuda.is_available() else [],
    }
    return state


def restore_rng(state: Any) -> None:
    """Set every generator from :func:`capture_rng`'s output.

    Raises:
        ValueError: a field is missing, of the wrong type or size (nothing is half-restored: every
            field is checked before any generator is set).
    """
    _require(isinstance(state, dict) and state.get("format") == FORMAT, f"not a {FORMAT} record")
    py, npy = state.get("python"), state.get("numpy")
    _require(isinstance(py, dict) and isinstance(npy, dict), "the python or numpy generator state is missing")
    internal, keys = py.get("state"), npy.get("keys")
    _require(
        isinstance(internal, list) and len(internal) == 625 and all(map(_is_uint32, internal)),
        "the python generator state is not 625 32-bit integers",
    )
    _require(
        isinstance(py.get("version"), int) and isinstance(py.get("gauss_next"), (float, type(None))),
        "the python generator version or gauss_next has the wrong type",
    )
    _require(
        isinstance(keys, list) and len(keys) == 624 and all(map(_is_uint32, keys)),
        "the numpy generator keys are not 624 32-bit integers",
    )
    _require(
        npy.get("kind") == "MT19937" and isinstance(npy.get("pos"), int) and 0 <= npy["pos"] <= 624,
        "the numpy generator kind or position is invalid",
    )
    _require(
        isinstance(npy.get("has_gauss"), int) and isinstance(npy.get("cached_gaussian"), (int, float)),
        "the numpy generator gaussian cache has the wrong type",
    )
    cpu = _decode(state.get("torch"), torch.get_rng_state().numel(), "torch")
    cuda_states = state.get("cuda")
    _require(isinstance(cuda_states, list), "the CUDA generator states are missing")
    devices = torch.cuda.device_count() if torch.cuda.is_available() else 0
    _require(
        not cuda_states or len(cuda_states) == devices,
        f"{len(cuda_states)} CUDA generator states for {devices} visible CUDA devices",
    )
    cuda = [_decode(s, None, "cuda") for s in cuda_states]

    random.setstate((py["version"], tuple(internal), py["gauss_next"]))
    np.random.set_state(
        (
            npy["kind"],
            np.asarray(keys, dtype=np.uint32),
            npy["pos"],
            npy["has_gauss"],
            float(npy["cached_gaussian"]),
        )
    )
    torch.set_rng_state(cpu)
    if cuda:
        torch.cuda.set_rng_state_all(cuda)


def _require(ok: bool, message: str) -> None:
    if not ok:
        raise ValueError(message)


def _is_uint32(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and 0 <= value < 2**32


def _encode(tensor: torch.Tensor) -> str:
    return base64.b64encode(tensor.cpu().numpy().tobytes()).decode("ascii")


def _decode(text: Any, size: int | None, what: str) -> torch.Tensor:
    _require(isinstance(text, str), f"the {what} generator state is missing")
    try:
        raw = base64.b64decode(text.encode("ascii"), validate=True)
    except (ValueError, UnicodeEncodeError):
        raise ValueError(f"the {what} generator state is not base64") from None
    if size is not None and len(raw) != size:
        raise ValueError(f"the {what} generator state has {len(raw)} bytes, not {size}")
    return torch.frombuffer(bytearray(raw), dtype=torch.uint8).clone()

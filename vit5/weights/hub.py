"""The official ViT-5 weights by timm name (Hub repo ``FengWang3211/ViT-5``, github.com/wangf3014/ViT-5
README) and every transfer to and from the Hugging Face Hub: downloads through ``hf_hub_download`` (its
cache, ``revision=``, ``HF_HUB_OFFLINE``), cache first; every failure is one :class:`CheckpointError`."""

from __future__ import annotations

import importlib
import json
import logging
import os
import re
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import huggingface_hub as hf
from huggingface_hub import HfApi, errors

from vit5.files import atomic_write_text
from vit5.model.presets import PRESETS, closest_preset
from vit5.model.vit import ViT5
from vit5.weights.convert import CheckpointError

HF_HUB_PREFIX = "hf-hub:"
PAPER_ID = "arXiv:2602.08071"
PAPER_NAME = "ViT-5: Vision Transformers for the Mid-2020s"
logger = logging.getLogger("vit5")


@dataclass(frozen=True)
class Release:
    """One released checkpoint: its timm name ``ARCH.TAG`` and the ImageNet-1k top-1 its authors report."""

    name: str
    top1: float
    repo: str = "FengWang3211/ViT-5"
    arch = property(lambda self: self.name.partition(".")[0])
    filename = property(lambda self: f"{self.arch}.pth")
    img_size = property(lambda self: PRESETS[self.arch]["img_size"])


RELEASES: dict[str, Release] = {
    r.name: r
    for r in (
        Release("vit5_small_patch16_224.in1k", 82.2),
        Release("vit5_base_patch16_224.in1k", 84.2),
        Release("vit5_base_patch16_384.in1k", 85.4),
        Release("vit5_large_patch16_224.in1k", 84.9),
        Release("vit5_large_patch16_384.in1k", 86.0),
    )
}


def is_weights_name(text: str) -> bool:
    """Whether ``text`` is written like a weights name (``ARCH.TAG`` of a preset), not a file path."""
    arch, dot, tag = text.partition(".")
    return bool(dot and tag) and arch in PRESETS and not any(sep in text for sep in "/\\")


def release(name: str) -> Release:
    """The release called ``name``; an unknown name lists the known ones."""
    if name not in RELEASES:
        raise CheckpointError(
            f"unknown pretrained weights {name!r} (and no such file): the released ViT-5 weights are "
            f"{', '.join(RELEASES)}; or pass an existing checkpoint path, or hf-hub:USER/REPO"
        )
    return RELEASES[name]


def default_release(preset: str) -> Release | None:
    """The weights a preset name means: ``vit5_small`` -> its 224 weights; an architecture, its own."""
    res = PRESETS.get(preset, {}).get("img_size", 224)
    return next((r for r in RELEASES.values() if r.arch in (preset, f"{preset}_patch16_{res}")), None)


def split_revision(repo: str) -> tuple[str, str | None]:
    """``"user/repo@v1"`` -> ``("user/repo", "v1")`` (the revision syntax of timm's ``hf-hub:``)."""
    repo_id, _, revision = repo.partition("@")
    return repo_id, revision or None


def _network_errors() -> tuple[type[BaseException], ...]:
    """A proxy refusal, a missing network or a timeout in the HTTP library of this huggingface_hub."""
    found: list[type[BaseException]] = [ConnectionError, TimeoutError]
    names = "httpx2.TransportError httpx.TransportError requests.ConnectionError requests.Timeout"
    for module, _, attr in (name.partition(".") for name in names.split()):
        with suppress(ImportError):
            found.append(getattr(importlib.import_module(module), attr))
    return tuple(found)


NETWORK_ERRORS = _network_errors()
_COMMIT = re.compile(r"[0-9a-f]{40}")
LOCAL_FORM = "pretrained=PATH"  # how the errors say to pass a local copy; model specs say theirs


def download(
    repo_id: str,
    filenames: str | Sequence[str],
    revision: str | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> Path:
    """The local path of the first of ``filenames`` that ``repo_id`` has. A cached file that cannot change (a
    release, a commit) is used without the network; else the Hub is asked once (``HF_HUB_ETAG_TIMEOUT``), and
    a proxy refusal, no network, a timeout or a 5xx falls back to the cached copy with a warning, or fails."""
    filenames = (filenames,) if isinstance(filenames, str) else tuple(filenames)
    timeout = hf.constants.HF_HUB_ETAG_TIMEOUT
    fetch = dict(revision=revision, cache_dir=cache_dir, library_name="vit5", etag_timeout=timeout)
    with clear_hub_errors(repo_id, " or ".join(filenames), revision):
        cached = next(filter(None, (cached_path(repo_id, f, revision, cache_dir) for f in filenames)), None)
        pinned = repo_id in {r.repo for r in RELEASES.values()} or bool(_COMMIT.fullmatch(revision or ""))
        if cached is not None and (pinned or hf.constants.HF_HUB_OFFLINE):
            return cached
        if hf.constants.HF_HUB_OFFLINE:  # hf_hub_download says it is not cached
            return Path(hf.hf_hub_download(repo_id, filenames[0], **fetch))
        for filename in filenames:
            try:
                hf.get_hf_file_metadata(hf.hf_hub_url(repo_id, filename, revision=revision), timeout=timeout)
            except errors.EntryNotFoundError:
                if filename != filenames[-1]:
                    continue
                raise
            except (*NETWORK_ERRORS, errors.HfHubHTTPError) as err:
                status = getattr(getattr(err, "response", None), "status_code", 500)
                answered = isinstance(err, errors.HfHubHTTPError) and status < 500 and status != 407
                if cached is None or answered:  # 401, 403, 404 or nothing cached: clear_hub_errors says what
                    raise
                logger.warning(
                    f"the Hub could not be reached ({_why(err)}): using the cached {cached.name} of {repo_id}"
                )
                return cached
            return Path(hf.hf_hub_download(repo_id, filename, **fetch))


def cached_path(
    repo_id: str, filename: str, revision: str | None = None, cache_dir: str | os.PathLike | None = None
) -> Path | None:
    """Where ``filename`` of ``repo_id`` sits in the cache, if it does (no network)."""
    found = hf.try_to_load_from_cache(repo_id, filename, cache_dir=cache_dir, revision=revision)
    return Path(found) if isinstance(found, str) else None


def _why(err: BaseException) -> str:
    """A network failure in words, with what to check."""
    name = type(err).__name__
    text = str(err).strip().splitlines()[0] if str(err).strip() else name
    if "Proxy" in name or "407" in text:
        return f"the proxy refused the connection: {text}; check HTTPS_PROXY and its credentials"
    if "Timeout" in name or isinstance(err, TimeoutError):
        return (
            f"no answer within {hf.constants.HF_HUB_ETAG_TIMEOUT} s ({text}); a slow network may need a "
            "larger HF_HUB_ETAG_TIMEOUT"
        )
    if isinstance(err, errors.HfHubHTTPError):
        return f"the Hub answered {text}"
    return f"no network? {name}: {text}"


@contextmanager
def clear_hub_errors(repo_id: str, filename: str, revision: str | None = None) -> Iterator[None]:
    """Turn huggingface_hub's download errors into one :class:`CheckpointError` with the fix."""
    first, cache = filename.split(" or ")[0], hf.constants.HF_HUB_CACHE
    pin, flag = (f" (revision {revision})", f" --revision {revision}") if revision else ("", "")
    by_hand = (
        f"fetch it by hand where there is network: `hf download {repo_id} {first}{flag}` (then copy the "
        f"cache folder {cache} here), or download https://huggingface.co/{repo_id}/resolve/"
        f"{revision or 'main'}/{first} and pass its path as {LOCAL_FORM}"
    )
    try:
        yield
    except Exception as err:
        offline = "HF_HUB_OFFLINE is set" if hf.constants.HF_HUB_OFFLINE else "the Hub could not be reached"
        reasons = (  # the first match: subclasses before their bases
            (errors.LocalEntryNotFoundError, f"it is not in the cache {cache} and {offline}; {by_hand}"),
            (errors.RevisionNotFoundError, f"the repo has no revision {revision!r}"),
            (errors.HFValidationError, str(err)),  # a malformed repo id or revision
            (
                errors.RepositoryNotFoundError,
                "the repo does not exist or is private (log in with `hf auth login` or set HF_TOKEN)",
            ),
            (errors.EntryNotFoundError, "the repo has no such file"),
            (errors.HfHubHTTPError, f"the Hub answered {err}; {by_hand}"),
            (
                NETWORK_ERRORS,
                f"the Hub could not be reached ({_why(err)}), it is not in the cache {cache}; {by_hand}",
            ),
        )
        why = next((text for kind, text in reasons if isinstance(err, kind)), None)
        if why is None:
            raise
        raise CheckpointError(
            f"cannot load {filename} of the Hugging Face Hub repo {repo_id}{pin}: {why}"
        ) from err


def push_to_hub(
    model: ViT5 | str | os.PathLike,
    repo_id: str,
    *,
    commit_message: str = "Add vit5 model",
    revision: str | None = None,
    private: bool | None = None,
    token: str | None = None,
    create_pr: bool = False,
) -> Any:
    """Upload a model, or a checkpoint directory (raw and EMA weights), to the Hub repo ``repo_id`` in one
    commit: what :func:`save_pretrained` writes, plus a model card unless the repo has one, so ``hf-hub:``
    loads it back (vit5 and timm). Returns huggingface_hub's ``CommitInfo``; needs a token."""
    api = HfApi(token=token, library_name="vit5")
    with tempfile.TemporaryDirectory() as tmp:
        folder = stage_for_hub(model, Path(tmp), repo_id)
        repo_id = api.create_repo(repo_id, private=private, exist_ok=True).repo_id
        keep_card = api.file_exists(repo_id, "README.md", revision=revision)
        return api.upload_folder(
            repo_id=repo_id,
            folder_path=folder,
            revision=revision,
            commit_message=commit_message,
            create_pr=create_pr,
            ignore_patterns=["README.md"] if keep_card else None,
        )


def stage_for_hub(model: ViT5 | str | os.PathLike, folder: Path, repo_id: str) -> Path:
    """Write into ``folder`` the files :func:`push_to_hub` uploads (hub-ready config, weights, card)."""
    # the checkpoint reader and the factory download through this module: import them when uploading
    from vit5.weights import checkpoint as ckpt
    from vit5.weights.factory import load_model

    if isinstance(model, ViT5):
        ckpt.save_pretrained(model, folder)
    else:
        directory = Path(model)
        if not (directory / ckpt.CONFIG_NAME).is_file():
            raise CheckpointError(
                f"{directory} is not a vit5 checkpoint directory; to upload other weights, load them first "
                "(model = vit5.load_model(path)) and push the model"
            )
        model, has_ema = load_model(directory), (directory / ckpt.EMA_WEIGHTS_NAME).is_file()
        ema = ckpt.read_checkpoint(directory, use_ema=True).state_dict if has_ema else None
        data = json.loads((directory / ckpt.CONFIG_NAME).read_text())  # its extra keys (epoch, run, ...) too
        ckpt.save_pretrained(model, folder, ema, data)
    table = "\n".join(f"| {k} | {v} |" for k, v in model.cfg.to_dict().items())
    atomic_write_text(
        folder / "README.md",
        f"""---
library_name: timm
tags: [image-classification, timm, vit5]
license: apache-2.0
---
# {repo_id.split("/")[-1]}

A ViT-5 model ({PAPER_NAME}, {PAPER_ID}) saved by vit5 as `{closest_preset(model.cfg)}` with \
{sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters.

```python
import timm, vit5  # importing vit5 registers its architectures in timm
model = vit5.load_model("{HF_HUB_PREFIX}{repo_id}")
model = timm.create_model("{HF_HUB_PREFIX}{repo_id}", pretrained=True)  # the same weights
```

| config | value |
|---|---|
{table}
""",
    )
    return folder

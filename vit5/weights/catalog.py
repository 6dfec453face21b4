"""The released ViT-5 weights by timm name (Hub repo ``FengWang3211/ViT-5``, the README of
github.com/wangf3014/ViT-5) and every download from the Hugging Face Hub.

Downloads go through ``hf_hub_download`` (its cache, ``revision=``, ``HF_HUB_OFFLINE``), cache
first; every failure is one :class:`CheckpointError`. This module sits below the checkpoint reader
and the factory, which both look names up here; uploading is :mod:`vit5.weights.publish`.
"""

from __future__ import annotations

import importlib
import logging
import os
import re
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from pathlib import Path

import huggingface_hub as hf
from huggingface_hub import errors

from vit5.model.presets import PRESETS
from vit5.weights.convert import CheckpointError

HF_HUB_PREFIX = "hf-hub:"
PAPER_ID = "arXiv:2602.08071"
PAPER_NAME = "ViT-5: Vision Transformers for the Mid-2020s"
OFFICIAL_REPO = "FengWang3211/ViT-5"
# how the errors say to pass a local copy; model specs replace it with their own form
LOCAL_FORM = "pretrained=PATH"
logger = logging.getLogger("vit5")


@dataclass(frozen=True)
class Release:
    """One released checkpoint: its timm name ``ARCH.TAG`` and the ImageNet-1k top-1 its authors
    report."""

    name: str
    top1: float
    repo: str = OFFICIAL_REPO

    @property
    def arch(self) -> str:
        return self.name.partition(".")[0]

    @property
    def filename(self) -> str:
        return f"{self.arch}.pth"

    @property
    def img_size(self) -> int:
        return PRESETS[self.arch]["img_size"]


RELEASES: dict[str, Release] = {
    r.name: r
    for r in (
        Release(name="vit5_small_patch16_224.in1k", top1=82.2),
        Release(name="vit5_base_patch16_224.in1k", top1=84.2),
        Release(name="vit5_base_patch16_384.in1k", top1=85.4),
        Release(name="vit5_large_patch16_224.in1k", top1=84.9),
        Release(name="vit5_large_patch16_384.in1k", top1=86.0),
    )
}
RELEASED_NAMES = ", ".join(RELEASES)


def is_weights_name(text: str) -> bool:
    """Whether ``text`` is written like a weights name (``ARCH.TAG`` of a preset), not a path."""
    arch, dot, tag = text.partition(".")
    is_path = any(sep in text for sep in "/\\")
    return bool(dot and tag) and arch in PRESETS and not is_path


def release(name: str) -> Release:
    """The release called ``name``; an unknown name lists the known ones."""
    if name not in RELEASES:
        raise CheckpointError(
            f"unknown pretrained weights {name!r} (and no such file): the released ViT-5 weights "
            f"are {RELEASED_NAMES}; or pass an existing checkpoint path, or hf-hub:USER/REPO"
        )
    return RELEASES[name]


def default_release(preset: str) -> Release | None:
    """The weights a preset name means: ``vit5_small`` -> its 224 weights; an architecture, its
    own."""
    size = PRESETS.get(preset, {}).get("img_size", 224)
    names = (preset, f"{preset}_patch16_{size}")
    return next((r for r in RELEASES.values() if r.arch in names), None)


def split_revision(repo: str) -> tuple[str, str | None]:
    """``"user/repo@v1"`` -> ``("user/repo", "v1")`` (the revision syntax of timm's ``hf-hub:``)."""
    repo_id, _, revision = repo.partition("@")
    return repo_id, revision or None


def _network_errors() -> tuple[type[BaseException], ...]:
    """A proxy refusal, a missing network or a timeout in this huggingface_hub's HTTP library."""
    found: list[type[BaseException]] = [ConnectionError, TimeoutError]
    names = "httpx2.TransportError httpx.TransportError requests.ConnectionError requests.Timeout"
    for name in names.split():
        module, _, attr = name.partition(".")
        with suppress(ImportError):
            found.append(getattr(importlib.import_module(module), attr))
    return tuple(found)


NETWORK_ERRORS = _network_errors()
_COMMIT = re.compile(r"[0-9a-f]{40}")
CacheDir = str | os.PathLike | None


def download(
    repo_id: str,
    filenames: str | Sequence[str],
    revision: str | None = None,
    cache_dir: CacheDir = None,
) -> Path:
    """The local path of the first of ``filenames`` that ``repo_id`` has.

    A cached file that cannot change (a release, a commit) is used without the network. Else the
    Hub is asked once (``HF_HUB_ETAG_TIMEOUT``); a proxy refusal, no network, a timeout or a 5xx
    falls back to the cached copy with a warning, or fails.
    """
    if isinstance(filenames, str):
        filenames = (filenames,)
    with clear_hub_errors(repo_id, " or ".join(filenames), revision):
        found = (cached_path(repo_id, f, revision, cache_dir) for f in filenames)
        cached = next(filter(None, found), None)
        released = repo_id in {r.repo for r in RELEASES.values()}
        pinned = released or bool(_COMMIT.fullmatch(revision or ""))
        offline = hf.constants.HF_HUB_OFFLINE
        if cached is not None and (pinned or offline):
            return cached
        if offline:  # hf_hub_download says that it is not cached
            return _fetch(repo_id, filenames[0], revision, cache_dir)
        for filename in filenames:
            try:
                _ask_the_hub(repo_id, filename, revision)
            except errors.EntryNotFoundError:
                if filename != filenames[-1]:
                    continue
                raise
            except (*NETWORK_ERRORS, errors.HfHubHTTPError) as err:
                if cached is None or _hub_answered(err):
                    raise  # 401, 403, 404 or nothing cached: clear_hub_errors says what
                why = _why(err)
                using = f"using the cached {cached.name} of {repo_id}"
                logger.warning(f"the Hub could not be reached ({why}): {using}")
                return cached
            return _fetch(repo_id, filename, revision, cache_dir)


def _fetch(repo_id: str, filename: str, revision: str | None, cache_dir: CacheDir) -> Path:
    """``hf_hub_download`` of one file, through the cache, waiting at most the etag timeout."""
    path = hf.hf_hub_download(
        repo_id,
        filename,
        revision=revision,
        cache_dir=cache_dir,
        library_name="vit5",
        etag_timeout=hf.constants.HF_HUB_ETAG_TIMEOUT,
    )
    return Path(path)


def _ask_the_hub(repo_id: str, filename: str, revision: str | None) -> None:
    """One request for a file's metadata: raises when the Hub cannot be reached or says no."""
    url = hf.hf_hub_url(repo_id, filename, revision=revision)
    hf.get_hf_file_metadata(url, timeout=hf.constants.HF_HUB_ETAG_TIMEOUT)


def _hub_answered(err: BaseException) -> bool:
    """Whether the Hub itself answered no (not a 5xx, not a proxy's 407)."""
    response = getattr(err, "response", None)
    status = getattr(response, "status_code", 500)
    is_http = isinstance(err, errors.HfHubHTTPError)
    return is_http and status < 500 and status != 407


def cached_path(
    repo_id: str,
    filename: str,
    revision: str | None = None,
    cache_dir: CacheDir = None,
) -> Path | None:
    """Where ``filename`` of ``repo_id`` sits in the cache, if it does (no network)."""
    found = hf.try_to_load_from_cache(repo_id, filename, cache_dir=cache_dir, revision=revision)
    return Path(found) if isinstance(found, str) else None


def _why(err: BaseException) -> str:
    """A network failure in words, with what to check."""
    name = type(err).__name__
    text = str(err).strip()
    text = text.splitlines()[0] if text else name
    if "Proxy" in name or "407" in text:
        return f"the proxy refused the connection: {text}; check HTTPS_PROXY and its credentials"
    if "Timeout" in name or isinstance(err, TimeoutError):
        seconds = hf.constants.HF_HUB_ETAG_TIMEOUT
        fix = "a slow network may need a larger HF_HUB_ETAG_TIMEOUT"
        return f"no answer within {seconds} s ({text}); {fix}"
    if isinstance(err, errors.HfHubHTTPError):
        return f"the Hub answered {text}"
    return f"no network? {name}: {text}"


def _by_hand(repo_id: str, filename: str, revision: str | None) -> str:
    """How to fetch ``filename`` by hand, and pass it as a local file."""
    first = filename.split(" or ")[0]
    flag = f" --revision {revision}" if revision else ""
    url = f"https://huggingface.co/{repo_id}/resolve/{revision or 'main'}/{first}"
    return (
        f"fetch it by hand where there is network: `hf download {repo_id} {first}{flag}` "
        f"(then copy the cache folder {hf.constants.HF_HUB_CACHE} here), "
        f"or download {url} and pass its path as {LOCAL_FORM}"
    )


@contextmanager
def clear_hub_errors(repo_id: str, filename: str, revision: str | None = None) -> Iterator[None]:
    """Turn huggingface_hub's download errors into one :class:`CheckpointError` with the fix."""
    try:
        yield
    except Exception as err:
        why = _reason(err, repo_id, filename, revision)
        if why is None:
            raise
        pin = f" (revision {revision})" if revision else ""
        raise CheckpointError(
            f"cannot load {filename} of the Hugging Face Hub repo {repo_id}{pin}: {why}"
        ) from err


def _reason(err: Exception, repo_id: str, filename: str, revision: str | None) -> str | None:
    """Why a download failed and the fix, or ``None`` for an error that is not the Hub's."""
    cache = hf.constants.HF_HUB_CACHE
    by_hand = _by_hand(repo_id, filename, revision)
    if hf.constants.HF_HUB_OFFLINE:
        offline = "HF_HUB_OFFLINE is set"
    else:
        offline = "the Hub could not be reached"
    private = "the repo does not exist or is private (log in with `hf auth login` or set HF_TOKEN)"
    reasons = (  # the first match counts: subclasses before their bases
        (
            errors.LocalEntryNotFoundError,
            f"it is not in the cache {cache} and {offline}; {by_hand}",
        ),
        (errors.RevisionNotFoundError, f"the repo has no revision {revision!r}"),
        (errors.HFValidationError, str(err)),  # a malformed repo id or revision
        (errors.RepositoryNotFoundError, private),
        (errors.EntryNotFoundError, "the repo has no such file"),
        (errors.HfHubHTTPError, f"the Hub answered {err}; {by_hand}"),
    )
    for kind, text in reasons:
        if isinstance(err, kind):
            return text
    if isinstance(err, NETWORK_ERRORS):
        why = _why(err)
        return f"the Hub could not be reached ({why}), it is not in the cache {cache}; {by_hand}"
    return None

"""The official ViT-5 weights by name, and every transfer to and from the Hugging Face Hub.

The authors released five ImageNet-1k checkpoints in the Hub repo ``FengWang3211/ViT-5``
(github.com/wangf3014/ViT-5 README, commit b7b0796: one ``<architecture>.pth`` per row of its
results table). Here they get timm names (``vit5_small_patch16_224.in1k``, ...) and timm
pretrained configs, so ``timm.create_model(name, pretrained=True)`` and
``vit5.create_model("vit5_small", pretrained=True)`` find them.

Every download goes through ``huggingface_hub.hf_hub_download``, so the usual rules hold: files
are cached under ``HF_HUB_CACHE`` (default ``$HF_HOME/hub``, ``~/.cache/huggingface/hub``) and
fetched once; ``revision=`` (or ``repo@revision``) pins a branch, tag or commit; with
``HF_HUB_OFFLINE=1`` nothing goes over the network and only cached files load. Uploads
(:func:`vit5.push_to_hub`) go through ``HfApi.upload_folder``.

The cache is looked in first (:func:`download`): a cached file that cannot have changed (the
released weights, a file at a commit) is used without asking the network at all. Otherwise the Hub
is asked once, with ``HF_HUB_ETAG_TIMEOUT`` (default 10 s) and no retries, whether the file is
there; a proxy refusal (HTTP 407), a missing network, a timeout or an HTTP 5xx then falls back to
the cached copy when there is one (with a warning), and is otherwise one error within seconds,
instead of huggingface_hub's retries with back-off (over half a minute per file). Every failure
is one :class:`~vit5.weights.convert.CheckpointError` that names the repo, the file, why, and the
way to fetch it by hand; the local-path form it advises is ``pretrained=PATH`` from Python and
``MODEL@PATH`` from a model spec (the command lines, :func:`local_path_form`).
"""

from __future__ import annotations

import importlib
import json
import logging
import os
import re
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from huggingface_hub import (
    HfApi,
    constants,
    get_hf_file_metadata,
    hf_hub_download,
    hf_hub_url,
    try_to_load_from_cache,
)
from huggingface_hub.errors import (
    EntryNotFoundError,
    HfHubHTTPError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

from vit5.files import atomic_write_text
from vit5.model.presets import PRESETS, closest_preset
from vit5.model.vit import ViT5, default_pretrained_cfg
from vit5.weights.convert import CheckpointError

OFFICIAL_REPO = "FengWang3211/ViT-5"
HF_HUB_PREFIX = "hf-hub:"
PAPER_ID = "arXiv:2602.08071"
PAPER_NAME = "ViT-5: Vision Transformers for the Mid-2020s"
ORIGIN_URL = "https://github.com/wangf3014/ViT-5"
logger = logging.getLogger("vit5")


@dataclass(frozen=True)
class Release:
    """One released checkpoint: its timm name ``ARCH.TAG`` and the top-1 its authors report."""

    name: str  # e.g. "vit5_small_patch16_224.in1k"
    top1: float  # ImageNet-1k val top-1 (%), the official README's table
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

    def pretrained_cfg(self) -> dict[str, Any]:
        """timm's pretrained config: where the file lives and how the authors evaluated it."""
        return dict(
            default_pretrained_cfg(self.img_size),
            hf_hub_id=self.repo,
            hf_hub_filename=self.filename,
            num_classes=1000,
            paper_ids=PAPER_ID,
            paper_name=PAPER_NAME,
            origin_url=ORIGIN_URL,
        )


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
    for r in RELEASES.values():
        if r.arch in (preset, f"{preset}_patch16_{res}"):
            return r
    return None


def split_revision(repo: str) -> tuple[str, str | None]:
    """``"user/repo@v1"`` -> ``("user/repo", "v1")`` (the revision syntax of timm's ``hf-hub:``)."""
    repo_id, _, revision = repo.partition("@")
    return repo_id, revision or None


# ---------------------------------------------------------------------------------- download
def _network_errors() -> tuple[type[BaseException], ...]:
    """The exceptions of a proxy refusal, a missing network or a timeout, for the HTTP library this
    huggingface_hub uses (httpx from 1.0, requests before)."""
    found: list[type[BaseException]] = [ConnectionError, TimeoutError]
    for module, names in (
        ("httpx2", ("TransportError",)),
        ("httpx", ("TransportError",)),
        ("requests", ("ConnectionError", "Timeout")),
    ):
        try:
            library = importlib.import_module(module)
        except ImportError:
            continue
        found += [getattr(library, name) for name in names if hasattr(library, name)]
    return tuple(found)


NETWORK_ERRORS = _network_errors()
_COMMIT = re.compile(r"[0-9a-f]{40}")
_LOCAL_FORM: ContextVar[str] = ContextVar("vit5_local_form", default="pretrained=PATH")


@contextmanager
def local_path_form(form: str) -> Iterator[None]:
    """How the errors inside say to pass a downloaded file instead (``pretrained=PATH`` by default;
    a model spec says ``vit5_small@PATH``)."""
    token = _LOCAL_FORM.set(form)
    try:
        yield
    finally:
        _LOCAL_FORM.reset(token)


class _Unreachable(Exception):
    """The Hub could not be asked (proxy, network, timeout, 5xx) and nothing is cached."""

    def __init__(self, cause: BaseException) -> None:
        super().__init__(str(cause))
        self.cause = cause


def download(
    repo_id: str, filename: str, revision: str | None = None, cache_dir: str | os.PathLike | None = None
) -> Path:
    """The local path of ``filename`` from ``repo_id``: from the cache when it is there, else
    downloaded once (see the module docstring for when the network is asked and how it may fail)."""
    return download_first(repo_id, (filename,), revision, cache_dir)


def download_first(
    repo_id: str,
    filenames: Sequence[str],
    revision: str | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> Path:
    """The local path of the first of ``filenames`` that ``repo_id`` has (timm looks for
    ``model.safetensors``, then ``pytorch_model.bin``). Files that never change (the released
    weights, a commit) are taken from the cache without asking the network."""
    label = " or ".join(filenames)
    with clear_hub_errors(repo_id, label, revision):
        cached = next(
            (p for p in (_cached(repo_id, f, revision, cache_dir) for f in filenames) if p is not None), None
        )
        pinned = repo_id in {r.repo for r in RELEASES.values()} or bool(_COMMIT.fullmatch(revision or ""))
        if cached is not None and (pinned or constants.HF_HUB_OFFLINE):
            return cached
        for i, filename in enumerate(filenames):
            if constants.HF_HUB_OFFLINE:
                break  # hf_hub_download below says it is not cached
            try:
                get_hf_file_metadata(
                    hf_hub_url(repo_id, filename, revision=revision), timeout=constants.HF_HUB_ETAG_TIMEOUT
                )
            except EntryNotFoundError:
                if i + 1 < len(filenames):
                    continue
                raise
            except (*NETWORK_ERRORS, HfHubHTTPError) as err:
                if isinstance(err, HfHubHTTPError) and not _server_error(err):
                    raise  # 401, 403, 404 of the repo: the Hub answered, clear_hub_errors says what
                if cached is None:
                    raise _Unreachable(err) from err
                logger.warning(
                    "the Hugging Face Hub could not be reached (%s): using the cached %s of %s",
                    _why(err),
                    cached.name,
                    repo_id,
                )
                return cached
            return Path(
                hf_hub_download(
                    repo_id,
                    filename,
                    revision=revision,
                    cache_dir=cache_dir,
                    library_name="vit5",
                    etag_timeout=constants.HF_HUB_ETAG_TIMEOUT,
                )
            )
        return Path(hf_hub_download(repo_id, filenames[0], revision=revision, cache_dir=cache_dir))


def timm_weights_file(cfg: Any, cache_dir: str | os.PathLike | None = None) -> Path | None:
    """The local copy (cache first, :func:`download_first`) of the weights a timm pretrained config
    names on the Hub, in timm's order of files; ``None`` when the config names none (a URL, a
    file, or an ``hf-hub:`` model, which timm resolves itself)."""
    get = cfg.get if isinstance(cfg, dict) else lambda key: getattr(cfg, key, None)
    hub_id = get("hf_hub_id")
    if not hub_id or get("source") == "hf-hub" or get("file") or get("state_dict") is not None:
        return None
    repo, revision = split_revision(hub_id)
    filename = get("hf_hub_filename")
    names = (filename,) if filename else ("model.safetensors", "pytorch_model.bin")
    return download_first(repo, names, revision, cache_dir)


def _cached(
    repo_id: str, filename: str, revision: str | None, cache_dir: str | os.PathLike | None
) -> Path | None:
    try:
        found = try_to_load_from_cache(repo_id, filename, cache_dir=cache_dir, revision=revision)
    except ValueError:  # a malformed repo id: the download says so
        return None
    return Path(found) if isinstance(found, str) else None


def _server_error(err: HfHubHTTPError) -> bool:
    response = getattr(err, "response", None)
    return getattr(response, "status_code", 0) >= 500 or getattr(response, "status_code", 0) == 407


def _why(err: BaseException) -> str:
    """A network failure in words, with what to check."""
    name = type(err).__name__
    text = str(err).strip().splitlines()[0] if str(err).strip() else name
    if "Proxy" in name or "407" in text:
        return f"the proxy refused the connection: {text}; check HTTPS_PROXY and its credentials"
    if "Timeout" in name or isinstance(err, TimeoutError):
        return (
            f"no answer within {constants.HF_HUB_ETAG_TIMEOUT} s ({text}); a slow network may need a "
            "larger HF_HUB_ETAG_TIMEOUT"
        )
    if isinstance(err, HfHubHTTPError):
        return f"the Hub answered {text}"
    return f"no network? {name}: {text}"


@contextmanager
def clear_hub_errors(repo_id: str, filename: str, revision: str | None = None) -> Iterator[None]:
    """Turn huggingface_hub's download errors into one :class:`CheckpointError` with the fix."""
    where = f"{filename} of the Hugging Face Hub repo {repo_id}" + (
        f" (revision {revision})" if revision else ""
    )
    first = filename.split(" or ")[0]
    url = f"https://huggingface.co/{repo_id}/resolve/{revision or 'main'}/{first}"
    by_hand = (
        f"fetch it by hand where there is network: `hf download {repo_id} {first}"
        + (f" --revision {revision}" if revision else "")
        + f"` (then copy the cache folder {cache_root()} here), or download {url} and pass its path as "
        + _LOCAL_FORM.get()
    )
    try:
        yield
    except _Unreachable as err:
        raise CheckpointError(
            f"cannot load {where}: the Hub could not be reached ({_why(err.cause)}) and it is not in the "
            f"cache {cache_root()}; {by_hand}"
        ) from err.cause
    except LocalEntryNotFoundError as err:
        reason = (
            "HF_HUB_OFFLINE is set"
            if constants.HF_HUB_OFFLINE
            else "the Hub could not be reached (no network?)"
        )
        raise CheckpointError(
            f"cannot load {where}: it is not in the cache {cache_root()} and {reason}; {by_hand}"
        ) from err
    except RevisionNotFoundError as err:
        raise CheckpointError(f"cannot load {where}: the repo has no revision {revision!r}") from err
    except RepositoryNotFoundError as err:
        raise CheckpointError(
            f"cannot load {where}: the repo does not exist or is private (log in with `hf auth login` "
            "or set HF_TOKEN for a private repo)"
        ) from err
    except EntryNotFoundError as err:
        raise CheckpointError(f"cannot load {where}: the repo has no such file") from err
    except HfHubHTTPError as err:
        raise CheckpointError(f"cannot load {where}: the Hub answered {err}; {by_hand}") from err
    except NETWORK_ERRORS as err:  # during the download itself
        raise CheckpointError(f"cannot load {where}: {_why(err)}; {by_hand}") from err


def cache_root() -> str:
    return constants.HF_HUB_CACHE


def cached_copy_advice(path: Path) -> str:
    """What to do with a cached download that cannot be read: delete it so it is fetched again."""
    blob = Path(os.path.realpath(path))
    files = f"{path}" + (f" and the blob it points to, {blob}" if blob != Path(path) else "")
    return (
        f"{path} is a cached download from the Hugging Face Hub; if it is damaged (an interrupted or "
        f"altered download), delete {files}, then load again to fetch a fresh copy"
    )


def cached_path(repo_id: str, filename: str, revision: str | None = None) -> Path | None:
    """Where ``filename`` of ``repo_id`` sits in the cache, if it does (no network)."""
    found = try_to_load_from_cache(repo_id, filename, revision=revision)
    return Path(found) if isinstance(found, str) else None


def download_model_dir(repo: str, weights: str, cache_dir: str | os.PathLike | None = None) -> Path:
    """Fetch ``config.json`` and ``weights`` of a model repo (``USER/REPO[@REVISION]``); their folder."""
    repo_id, revision = split_revision(repo)
    config = download(repo_id, "config.json", revision, cache_dir)
    commit = config.parent.name  # the snapshot folder is named by its commit: take the weights from it too
    return download(repo_id, weights, commit, cache_dir).parent


# ---------------------------------------------------------------------------------- upload
def upload_folder(
    folder: Path,
    repo_id: str,
    *,
    commit_message: str = "Add vit5 model",
    revision: str | None = None,
    private: bool | None = None,
    token: str | None = None,
    create_pr: bool = False,
) -> Any:
    """Create ``repo_id`` if needed and upload ``folder`` in one commit; a README.md already in the
    repo (a model card written by hand) is kept."""
    api = HfApi(token=token, library_name="vit5")
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


def model_card(repo_id: str, architecture: str, cfg: dict[str, Any], num_params: int) -> str:
    """A README.md for a pushed model: timm metadata, how to load it, its config."""
    lines = [
        "---",
        "library_name: timm",
        "tags: [image-classification, timm, vit5]",
        "license: apache-2.0",
        "---",
        f"# {repo_id.split('/')[-1]}",
        "",
        (
            f"A ViT-5 model ({PAPER_NAME}, {PAPER_ID}) saved by vit5 as `{architecture}` "
            f"with {num_params / 1e6:.1f}M parameters."
        ),
        "",
        "```python",
        "import timm, vit5  # importing vit5 registers its architectures in timm",
        f'model = vit5.load_model("{HF_HUB_PREFIX}{repo_id}")',
        f'model = timm.create_model("{HF_HUB_PREFIX}{repo_id}", pretrained=True)  # the same weights',
        "```",
        "",
        "| config | value |",
        "|---|---|",
        *(f"| {k} | {v} |" for k, v in cfg.items()),
        "",
    ]
    return "\n".join(lines)


# ---------------------------------------------------------------------------------- upload
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
    """Upload a model, or a checkpoint directory (raw and EMA weights), to the Hub repo ``repo_id``.

    What is uploaded is what :func:`save_pretrained` writes, plus a model card when the repo has
    none, so ``vit5.load_model("hf-hub:USER/REPO")`` and ``timm.create_model("hf-hub:USER/REPO",
    pretrained=True)`` load it back. Returns huggingface_hub's ``CommitInfo``. Needs a token
    (``hf auth login`` or ``token=``).
    """
    with tempfile.TemporaryDirectory() as tmp:
        folder = stage_for_hub(model, Path(tmp), repo_id)
        return upload_folder(
            folder,
            repo_id,
            commit_message=commit_message,
            revision=revision,
            private=private,
            token=token,
            create_pr=create_pr,
        )


def stage_for_hub(model: ViT5 | str | os.PathLike, folder: Path, repo_id: str) -> Path:
    """Write into ``folder`` the files :func:`push_to_hub` uploads (hub-ready config, weights, card)."""
    # the checkpoint reader and the factory download through this module: import them when uploading
    from vit5.weights.checkpoint import (
        CONFIG_NAME,
        EMA_WEIGHTS_NAME,
        HUB_CONFIG_KEYS,
        read_checkpoint,
        save_pretrained,
    )
    from vit5.weights.factory import load_model

    if isinstance(model, ViT5):
        save_pretrained(model, folder)
    else:
        directory = Path(model)
        raw = read_checkpoint(directory)
        if raw.config is None:
            raise CheckpointError(
                f"{directory} is not a vit5 checkpoint directory; to upload other weights, load them first "
                "(model = vit5.load_model(path)) and push the model"
            )
        loaded = load_model(directory)
        ema = (
            read_checkpoint(directory, use_ema=True).state_dict
            if (directory / EMA_WEIGHTS_NAME).is_file()
            else None
        )
        data = json.loads((directory / CONFIG_NAME).read_text())
        extra = {k: v for k, v in data.items() if k not in (*HUB_CONFIG_KEYS, "config")}
        save_pretrained(loaded, folder, ema_state_dict=ema, extra=extra)
        model = loaded
    card = model_card(
        repo_id, closest_preset(model.cfg), model.cfg.to_dict(), sum(p.numel() for p in model.parameters())
    )
    atomic_write_text(folder / "README.md", card)
    return folder

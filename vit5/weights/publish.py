"""Publishing weights: stage a folder that timm's and vit5's ``hf-hub:`` loaders read back, and push
it to the Hugging Face Hub in one commit (``HfApi.upload_folder``).

This module sits above the factory (it loads a checkpoint directory to check and re-save it); the
release names and downloads below the checkpoint reader are :mod:`vit5.weights.catalog`.
"""

from __future__ import annotations

import json
import os
import tempfile
from pathlib import Path
from typing import Any

from huggingface_hub import HfApi

from vit5.files import atomic_write_text
from vit5.model.presets import closest_preset
from vit5.model.vit import ViT5
from vit5.weights.catalog import HF_HUB_PREFIX, PAPER_ID, PAPER_NAME
from vit5.weights.checkpoint import (
    CONFIG_NAME,
    EMA_WEIGHTS_NAME,
    read_checkpoint,
    save_pretrained,
)
from vit5.weights.convert import CheckpointError
from vit5.weights.factory import load_model

ModelOrFolder = ViT5 | str | os.PathLike


def push_to_hub(
    model: ModelOrFolder,
    repo_id: str,
    *,
    commit_message: str = "Add vit5 model",
    revision: str | None = None,
    private: bool | None = None,
    token: str | None = None,
    create_pr: bool = False,
) -> Any:
    """Upload a model, or a checkpoint directory (raw and EMA weights), to the Hub repo ``repo_id``
    in one commit: what :func:`save_pretrained` writes, plus a model card unless the repo has one,
    so ``hf-hub:`` loads it back (vit5 and timm). Returns huggingface_hub's ``CommitInfo``; needs a
    token."""
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


def stage_for_hub(model: ModelOrFolder, folder: Path, repo_id: str) -> Path:
    """Write into ``folder`` the files :func:`push_to_hub` uploads (config, weights, card)."""
    if isinstance(model, ViT5):
        save_pretrained(model, folder)
    else:
        model = _restage(Path(model), folder)
    card = model_card(model, repo_id)
    atomic_write_text(folder / "README.md", card)
    return folder


def _restage(directory: Path, folder: Path) -> ViT5:
    """Load the checkpoint directory ``directory`` (checked as any load) and save it into
    ``folder``, with its EMA weights and the extra keys of its config (epoch, run, ...)."""
    if not (directory / CONFIG_NAME).is_file():
        raise CheckpointError(
            f"{directory} is not a vit5 checkpoint directory; to upload other weights, "
            "load them first (model = vit5.load_model(path)) and push the model"
        )
    model = load_model(directory)
    ema = None
    if (directory / EMA_WEIGHTS_NAME).is_file():
        ema = read_checkpoint(directory, use_ema=True).state_dict
    data = json.loads((directory / CONFIG_NAME).read_text())
    save_pretrained(model, folder, ema, data)
    return model


def model_card(model: ViT5, repo_id: str) -> str:
    """The README of a pushed model: the timm tags, how to load it, its config."""
    rows = "\n".join(f"| {k} | {v} |" for k, v in model.cfg.to_dict().items())
    millions = sum(p.numel() for p in model.parameters()) / 1e6
    title = repo_id.split("/")[-1]
    spec = f"{HF_HUB_PREFIX}{repo_id}"
    return f"""---
library_name: timm
tags: [image-classification, timm, vit5]
license: apache-2.0
---
# {title}

A ViT-5 model ({PAPER_NAME}, {PAPER_ID}) saved by vit5 as `{closest_preset(model.cfg)}` with \
{millions:.1f}M parameters.

```python
import timm
import vit5.weights  # registers the vit5 architectures in timm

model = vit5.load_model("{spec}")
model = timm.create_model("{spec}", pretrained=True)  # the same weights
```

| config | value |
|---|---|
{rows}
"""

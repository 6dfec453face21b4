import os

# Before anything imports huggingface_hub (it reads its environment once, at import): no test may
# reach the network or read the user's own Hugging Face cache.
os.environ["HF_HUB_OFFLINE"] = "1"

import huggingface_hub.constants  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402


@pytest.fixture(autouse=True)
def _seed():
    torch.manual_seed(0)


@pytest.fixture(autouse=True, scope="session")
def _offline_hub(tmp_path_factory):
    """Offline mode and an empty Hugging Face home for the whole run, subprocesses included."""
    home = tmp_path_factory.mktemp("hf_home")
    with pytest.MonkeyPatch.context() as mp:
        _point_hub_at(mp, home)
        yield home


@pytest.fixture
def hf_cache(tmp_path, monkeypatch):
    """A fresh, empty Hugging Face cache for one test (``hub/`` under a new ``HF_HOME``)."""
    home = tmp_path / "hf_home"
    _point_hub_at(monkeypatch, home)
    return home / "hub"


def _point_hub_at(mp: pytest.MonkeyPatch, home) -> None:
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(home), "HF_HUB_CACHE": str(home / "hub")}
    for name, value in env.items():
        mp.setenv(name, value)
    mp.setattr(huggingface_hub.constants, "HF_HUB_OFFLINE", True)
    mp.setattr(huggingface_hub.constants, "HF_HOME", str(home))
    mp.setattr(huggingface_hub.constants, "HF_HUB_CACHE", str(home / "hub"))

import os

# Before anything imports huggingface_hub (it reads its environment once, at import): no test may
# reach the network or read the user's own Hugging Face cache.
os.environ["HF_HUB_OFFLINE"] = "1"

# Under pytest-xdist (`make test` runs `pytest -n 2`) each worker gets its share of the cores, so that
# the workers' OpenMP pools do not fight over them; OMP_NUM_THREADS carries the share to the
# subprocesses the tests start. A plain `pytest` (no -n) keeps torch's own default.
_WORKERS = int(os.environ.get("PYTEST_XDIST_WORKER_COUNT", "0"))
if _WORKERS:
    os.environ["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // _WORKERS))

import huggingface_hub.constants  # noqa: E402
import pytest  # noqa: E402
import torch  # noqa: E402

if _WORKERS:
    torch.set_num_threads(int(os.environ["OMP_NUM_THREADS"]))


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


# Tests that start several processes (two gloo ranks, torchrun, a run killed and resumed): under
# pytest-xdist (`make test`) they share one xdist_group, which `--dist loadgroup` runs on one worker,
# one at a time, so two of them never fight over the cores their timeouts were set for.
MULTIPROCESS_FILES = {
    "test_train_distributed.py",
    "test_train_elastic.py",
    "test_train_resume.py",
    "test_train_shards.py",
}
MULTIPROCESS_TESTS = {"test_two_processes_give_the_numbers_of_one"}


def pytest_collection_modifyitems(config, items):
    if not config.pluginmanager.hasplugin("xdist"):
        return
    for item in items:
        if item.path.name in MULTIPROCESS_FILES or item.originalname in MULTIPROCESS_TESTS:
            item.add_marker(pytest.mark.xdist_group("multiprocess"))

"""glibc's malloc keeps the memory a CPU step frees (vit5.runtime.keep_freed_memory), and the ``vit5``
command asks it to."""

import ctypes
import os
import platform
import subprocess
import sys
import textwrap

import pytest

import vit5.cli
from vit5 import runtime

GLIBC = sys.platform.startswith("linux") and platform.libc_ver()[0] == "glibc"

# page faults per training step of a small ViT-5, before and after keep_freed_memory, in a fresh
# process (this one may have been pinned already by a command a test ran)
_FAULTS = textwrap.dedent(
    """
    import resource, torch, vit5
    from vit5.runtime import keep_freed_memory

    torch.manual_seed(0)
    cfg = vit5.preset_config(
        "vit5_tiny", img_size=28, patch_size=7, depth=2, embed_dim=192, num_heads=3, num_classes=10
    )
    model = vit5.ViT5(cfg)
    images = torch.randn(16, 3, 28, 28)

    def faults_per_step(steps=3):
        before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
        for _ in range(steps):
            model(images).square().mean().backward()
        return (resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before) / steps

    faults_per_step()  # first-call allocations (weights' gradients, kernels' buffers)
    default = faults_per_step()
    pinned = keep_freed_memory()
    faults_per_step()  # the heap grows once to the step's size, then serves every step from it
    print(default, pinned, faults_per_step(steps=6))
    """
)


@pytest.mark.skipif(not GLIBC, reason="glibc's malloc thresholds")
def test_pinned_thresholds_remove_the_page_faults_of_a_training_step():
    env = {k: v for k, v in os.environ.items() if not k.startswith("MALLOC_")}
    env.pop("GLIBC_TUNABLES", None)
    done = subprocess.run(
        [sys.executable, "-c", _FAULTS], capture_output=True, text=True, env=env, check=True
    )
    default, pinned, after = done.stdout.split()
    # glibc's moving thresholds hand the step's freed activations back to the system (hundreds
    # of faults a step here, tens of thousands at the Fashion-MNIST recipe's batch of 256)
    assert float(default) >= 100, done.stdout
    assert pinned == "True"
    # tens of faults are left under load (1,298 -> 69 with the suite running beside it), none idle
    assert float(after) <= float(default) / 5, done.stdout


def _refuse_libc(*args, **kwargs):
    raise AssertionError("mallopt was called")


@pytest.mark.parametrize(
    "name, value",
    [
        ("MALLOC_MMAP_THRESHOLD_", "131072"),
        ("MALLOC_TRIM_THRESHOLD_", "131072"),
        ("GLIBC_TUNABLES", "glibc.malloc.trim_threshold=131072"),
    ],
)
def test_a_users_own_malloc_settings_are_kept(monkeypatch, name, value):
    monkeypatch.setenv(name, value)
    monkeypatch.setattr(ctypes, "CDLL", _refuse_libc)
    assert runtime.keep_freed_memory() is False


def test_other_c_libraries_are_left_alone(monkeypatch):
    for name in ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "GLIBC_TUNABLES"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setattr(platform, "libc_ver", lambda: ("", ""))
    monkeypatch.setattr(ctypes, "CDLL", _refuse_libc)
    assert runtime.keep_freed_memory() is False


def test_the_command_pins_them_once_before_its_work(monkeypatch, capsys):
    calls = []
    monkeypatch.setattr(vit5.cli, "keep_freed_memory", lambda: calls.append("pinned"))
    assert vit5.cli.main(["list"]) == 0
    assert calls == ["pinned"]
    assert "vit5_small" in capsys.readouterr().out

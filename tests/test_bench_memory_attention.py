"""The memory meter and the attention section's backends: exact bytes, agreeing outputs."""

import pytest
import torch

from vit5.bench.measure import measure_memory
from vit5.bench.speed import BACKENDS
from vit5.model.footprint import attention_bytes


def test_cpu_meter_counts_exact_tensor_bytes():
    reading, kept = measure_memory(lambda: torch.empty(1000, dtype=torch.float32))
    assert reading.peak == reading.retained == 4000
    del kept

    def temporary_then_small():
        big = torch.ones(250_000)  # 1 MB, freed before returning
        return big[:10].clone()

    reading, _ = measure_memory(temporary_then_small)
    assert reading.peak >= 1_000_000
    assert reading.retained == 40


def test_meter_rejects_unknown_devices():
    with pytest.raises(ValueError, match="cpu and cuda"):
        measure_memory(lambda: None, "meta")


@pytest.mark.parametrize("n", [17, 256])
def test_sdpa_and_eager_outputs_agree(n):
    g = torch.Generator().manual_seed(n)
    q, k, v = (torch.randn(2, 3, n, 16, generator=g) for _ in range(3))
    reference = torch.softmax(q @ k.transpose(-2, -1) / 4.0, dim=-1) @ v  # explicit, independent
    for name, fn in BACKENDS.items():
        torch.testing.assert_close(fn(q, k, v), reference, rtol=1e-4, atol=1e-5, msg=name)


def test_eager_holds_n_squared_and_sdpa_does_not():
    n, heads = 1024, 2
    q, k, v = (torch.randn(1, heads, n, 32) for _ in range(3))
    with torch.inference_mode():
        eager, _ = measure_memory(lambda: BACKENDS["eager"](q, k, v))
        sdpa, _ = measure_memory(lambda: BACKENDS["sdpa"](q, k, v))
    scores = heads * n * n * 4
    assert (
        attention_bytes(1, heads, n, torch.float32.itemsize) == 2 * scores
    )  # the skip rule's estimate
    assert eager.peak >= 2 * scores  # scores and probabilities alive together
    assert sdpa.peak < scores / 4


def test_recording_cases_and_one_case_measured():
    from vit5.bench.recording import MODELS, cases, run_case

    found = cases((1024, 2048), full_up_to=1024)
    assert [(c.size, c.mode) for c in found if c.model == MODELS[0]] == [
        (1024, "lean"),
        (1024, "lean, no rollout"),
        (1024, "full"),
        (2048, "lean"),
        (2048, "lean, no rollout"),
    ]
    lean = run_case("timm:vit_small_patch16_dinov3", 64, False, depth=2)
    full = run_case("timm:vit_small_patch16_dinov3", 64, True, depth=2)
    assert lean["seconds"] > 0 and lean["peak"] > lean["estimate"] > 0
    assert full["estimate"] == lean["estimate"]  # the memory check estimates the lean recording
    bare = run_case("timm:vit_small_patch16_dinov3", 64, False, depth=2, rollout=False)
    # q and k of both blocks, [1, 21, 384] fp32 each (16 patches, CLS, 4 registers): the rollout's
    assert lean["estimate"] - bare["estimate"] == 2 * 2 * 21 * 384 * 4

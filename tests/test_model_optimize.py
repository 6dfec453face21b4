"""Regional compilation (vit5.compile_blocks)."""

import torch

import vit5


def randomised(preset: str = "vit5_tiny", **overrides) -> vit5.ViT5:
    """A tiny model whose gains and biases are far from their init, so a wrong graph shows in the logits."""
    torch.manual_seed(0)
    kwargs = dict(depth=2, img_size=32, patch_size=8, num_classes=7, **overrides)
    model = vit5.create_model(preset, **kwargs).eval()
    with torch.no_grad():
        for name, param in model.named_parameters():
            if name.endswith("gamma"):
                param.uniform_(0.3, 1.0)  # LayerScale: large enough that the blocks move the logits
            elif param.ndim == 1 and name.endswith("weight"):
                param.uniform_(0.5, 1.5)
            elif param.ndim == 1 and name.endswith("bias"):
                param.normal_(0, 0.5)
    return model


def test_regional_compile_compiles_one_block_for_all_and_keeps_outputs_and_keys():
    """Every block runs compiled code (aot_eager traces forward and backward like inductor, without a
    C++ compiler); the blocks share one compiled graph; outputs, gradients and keys are unchanged."""
    model = randomised()
    twin = randomised()
    x = torch.randn(2, 3, 32, 48)
    keys = list(model.state_dict())
    torch._dynamo.reset()
    from torch._dynamo.utils import counters

    counters.clear()
    assert vit5.compile_blocks(model, backend="aot_eager", fullgraph=True) is model
    assert (
        list(model.state_dict()) == keys
    )  # no _orig_mod. prefix: checkpoints and EMA are unaffected
    with torch.no_grad():
        torch.testing.assert_close(model(x), twin(x), rtol=1e-5, atol=1e-5)
    assert counters["stats"]["unique_graphs"] == 1  # two blocks, one compilation
    model.train()
    twin.train()
    model(x).square().sum().backward()
    twin(x).square().sum().backward()
    for (name, p), q in zip(model.named_parameters(), twin.parameters()):
        torch.testing.assert_close(p.grad, q.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_compiling_silences_only_inductors_complex_fallback_warning():
    """Inductor's own warning (its text, called as it is) is silenced once vit5 compiles, since RoPE's
    complex product is measured fast as an aten kernel; any other UserWarning still shows."""
    import warnings

    from torch._inductor.lowering import _warn_complex_not_supported

    with warnings.catch_warnings(record=True) as before:
        warnings.simplefilter("always")
        _warn_complex_not_supported.__wrapped__()
    assert [str(w.message) for w in before][0].startswith("Torchinductor does not support")
    with warnings.catch_warnings(record=True) as after:
        warnings.simplefilter("always")
        vit5.compile_blocks(randomised(), backend="aot_eager")
        _warn_complex_not_supported.__wrapped__()
        warnings.warn("another warning", UserWarning, stacklevel=1)
    assert [str(w.message) for w in after] == ["another warning"]

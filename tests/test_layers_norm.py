"""RMSNorm against its formula: gain only, fp32 statistics, eps inside the root, input dtype out."""

import pytest
import torch

from vit5.layers import RMSNorm, make_norm


def rmsnorm_formula(x, g, eps):
    x64 = x.double()
    return x64 / torch.sqrt((x64**2).mean(-1, keepdim=True) + eps) * g.double()


def test_rmsnorm_matches_formula_fp32():
    norm = RMSNorm(32, eps=1e-6)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 2.0)
    x = torch.randn(4, 7, 32) * 3 + 1
    torch.testing.assert_close(
        norm(x).double(), rmsnorm_formula(x, norm.weight, 1e-6), rtol=1e-5, atol=1e-6
    )
    assert [name for name, _ in norm.named_parameters()] == ["weight"]  # no bias


def test_eps_is_inside_the_root():
    norm = RMSNorm(8, eps=1e-2)
    x = torch.full((1, 8), 0.1)
    # mean square 0.01: with eps inside, 0.1 / sqrt(0.02); eps outside would give 0.1 / (0.1 + 0.01)
    torch.testing.assert_close(norm(x), torch.full((1, 8), 0.1 / 0.02**0.5))
    assert torch.isfinite(norm(torch.zeros(2, 8))).all()


def test_bf16_input_is_normalised_in_fp32_and_returned_in_bf16():
    norm = RMSNorm(256)
    x = (torch.randn(3, 256) * 300).to(torch.bfloat16)
    y = norm(x)
    assert y.dtype == torch.bfloat16
    expected = rmsnorm_formula(x.float(), norm.weight, 1e-6).to(torch.bfloat16)
    torch.testing.assert_close(y, expected, rtol=0, atol=0)


def test_make_norm_kinds_and_error():
    assert isinstance(make_norm("rmsnorm", 4), RMSNorm)
    assert isinstance(make_norm("layernorm", 4), torch.nn.LayerNorm)
    with pytest.raises(ValueError, match="unknown norm 'batchnorm'"):
        make_norm("batchnorm", 4)


def test_rms_norm_under_bf16_autocast_is_the_fp32_formula_and_f_rms_norm():
    """Statistics in fp32 from a bf16 input under autocast, gain before the cast: the explicit
    formula, and PyTorch's ``F.rms_norm`` on the fp32 input, both rounded to bf16."""
    torch.manual_seed(0)
    norm = RMSNorm(64)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 2.0)
    x = (torch.randn(4, 9, 64) * 30).to(torch.bfloat16)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = norm(x)
        f_rms = torch.nn.functional.rms_norm(x.float(), (64,), norm.weight, 1e-6).to(x.dtype)
    assert y.dtype == torch.bfloat16
    expected = rmsnorm_formula(x.float(), norm.weight, 1e-6).to(torch.bfloat16)
    assert (y.float() - expected.float()).abs().max() <= 2**-7 * expected.float().abs().max()
    assert (y.float() - f_rms.float()).abs().max() <= 2**-7 * expected.float().abs().max()


def test_rms_norm_gradients_equal_the_float64_formula():
    torch.manual_seed(0)
    norm = RMSNorm(48)
    with torch.no_grad():
        norm.weight.uniform_(0.5, 2.0)
    x = torch.randn(3, 5, 48, requires_grad=True)
    grads = torch.autograd.grad(norm(x).square().sum(), [x, norm.weight])
    x64 = x.detach().double().requires_grad_()
    w64 = norm.weight.detach().double().requires_grad_()
    expected = torch.autograd.grad(rmsnorm_formula(x64, w64, 1e-6).square().sum(), [x64, w64])
    for got, want in zip(grads, expected):
        assert (got.double() - want).abs().max() <= 1e-5 * want.abs().max()
    zero = torch.zeros(2, 48, requires_grad=True)
    (grad,) = torch.autograd.grad(norm(zero).sum(), zero)
    assert torch.isfinite(grad).all()  # the reduction's backward at a zero vector

"""bf16 autocast on a CPU without native bf16 kernels trains in fp32, with a note (vit5.runtime)."""

import pytest
import torch

from vit5.runtime import fit_precision


@pytest.mark.parametrize("native", [True, False])
def test_bf16_on_cpu_follows_native_support(monkeypatch, native):
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: native)
    precision, note = fit_precision("bf16", on_cpu=True)
    assert precision == ("bf16" if native else "fp32")
    assert (note == "") == native
    if not native:
        assert "run.mixed_precision=fp32" in note and "no native bf16" in note


def test_other_precisions_and_gpus_are_kept(monkeypatch):
    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)
    assert fit_precision("bf16", on_cpu=False) == ("bf16", "")
    assert fit_precision("fp32", on_cpu=True) == ("fp32", "")
    assert fit_precision("fp16", on_cpu=True) == ("fp16", "")


def test_the_trainer_runs_the_fallback(monkeypatch, tmp_path):
    from vit5.train.config import load_config
    from vit5.train.trainer import Trainer

    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: False)
    cfg = load_config("demo_digits", ["run.mixed_precision=bf16", f"run.output_dir={tmp_path}"])
    trainer = Trainer(cfg)
    assert trainer.accelerator.mixed_precision == "no"
    assert any("no native bf16" in note for note in trainer.machine_notes)


@pytest.mark.parametrize("native", [True, False])
def test_muon_on_a_cpu_that_emulates_bf16_gets_a_note(monkeypatch, native):
    """Where bf16 is emulated, Muon orthogonalises in fp32 instead of timm's bf16: the header says so."""
    from vit5.train.loop import optimizer_note

    monkeypatch.setattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", lambda: native)
    note = optimizer_note("muon", on_cpu=True)
    assert (note == "") == native
    if not native:
        assert "optim.name=muon" in note and "fp32" in note
    assert optimizer_note("adamw", on_cpu=True) == ""
    assert optimizer_note("muon", on_cpu=False) == ""


@pytest.mark.parametrize("compile_mode", ["regional", "true"])
def test_compile_without_a_cpu_compiler_is_one_error_before_any_work(
    monkeypatch, tmp_path, compile_mode
):
    """torch.compile on a CPU needs a C++ compiler; without one the run stops up front with the fix,
    not at the first step inside inductor."""
    import torch._inductor.cpp_builder as cpp_builder
    from torch._inductor.exc import InvalidCxxCompiler

    from vit5.train import TrainConfigError, Trainer
    from vit5.train.config import load_config

    def no_compiler():
        raise InvalidCxxCompiler()

    monkeypatch.setattr(cpp_builder, "get_cpp_compiler", no_compiler)
    overrides = [f"model.compile={compile_mode}", "run.cpu=true", f"run.output_dir={tmp_path}"]
    cfg = load_config("demo_digits", overrides)
    with pytest.raises(TrainConfigError, match="model.compile=false") as info:
        Trainer(cfg)
    assert "C++ compiler" in str(info.value)
    assert not any(tmp_path.iterdir())  # nothing written


def test_a_working_cpu_compiler_is_no_problem(monkeypatch):
    import torch._inductor.cpp_builder as cpp_builder

    from vit5.runtime import missing_cpu_compiler

    monkeypatch.setattr(cpp_builder, "get_cpp_compiler", lambda: "g++")
    assert missing_cpu_compiler() == ""

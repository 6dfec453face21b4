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

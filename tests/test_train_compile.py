"""``model.compile=regional``: the trainer compiles each block of the raw model in place (one compiled
block shared by all), trains through it, and saves plain checkpoints."""

from functools import partial

from test_train_support import single_thread, tiny_config  # noqa: F401 (autouse fixture)

import vit5
import vit5.train.trainer as trainer_module
from vit5.train import Trainer


def test_regional_compile_trains_and_saves_plain_weights(tmp_path, monkeypatch):
    # aot_eager traces forward and backward as inductor would, without minutes of C++ compilation
    monkeypatch.setattr(
        trainer_module, "compile_blocks", partial(vit5.compile_blocks, backend="aot_eager")
    )
    trainer = Trainer(tiny_config(tmp_path, "model.compile=regional", "schedule.epochs=2"))
    assert all(block._compiled_call_impl is not None for block in trainer.raw_model.blocks)
    keys = set(trainer.raw_model.state_dict())
    summary = trainer.fit()
    assert summary["final_top1"] > 20  # chance is 10%
    reloaded = vit5.load_model(summary["run_dir"] + "/final")
    assert set(reloaded.state_dict()) == keys  # no _orig_mod. prefix anywhere

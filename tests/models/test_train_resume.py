"""models.train: a finished run extends to more steps, and a run resumes under another thread
count or logging cadence; any other change of config is refused."""

from dataclasses import replace

import numpy as np
import pytest
import torch

from acespec.cloud.target.config import ModelArgs
from acespec.models.train import TrainConfig, train

ARGS = ModelArgs(arch="llama", vocab_size=64, hidden_size=32, intermediate_size=64, num_layers=1,
                 num_heads=2, num_kv_heads=1, head_dim=16)
CFG = TrainConfig(steps=2, batch=2, seq_len=16, warmup=1, ckpt_every=1, log_every=1)
STREAM = np.random.default_rng(0).integers(0, 64, 4096).astype(np.uint16)


def test_a_finished_run_extends_and_records_its_sittings(tmp_path, caplog):
    ckpt = tmp_path / "m.ckpt"
    train(ARGS, CFG, STREAM, ckpt)
    first = torch.load(ckpt, weights_only=False)
    assert first["step"] == 2 and first["sittings"] == [2]
    with caplog.at_level("INFO"):
        train(ARGS, replace(CFG, steps=5), STREAM, ckpt)
    state = torch.load(ckpt, weights_only=False)
    assert state["step"] == 5 and state["sittings"] == [2, 5]
    assert "extending a finished 2-step run to 5 steps" in caplog.text
    assert "resuming at step 2/5" in caplog.text
    moved = [not torch.equal(first["model"][k], state["model"][k]) for k in state["model"]]
    assert any(moved)  # the three new steps trained


def test_a_run_resumes_under_another_thread_count(tmp_path):
    ckpt = tmp_path / "m.ckpt"
    train(ARGS, CFG, STREAM, ckpt)
    train(ARGS, replace(CFG, steps=3, threads=2, log_every=5, ckpt_every=2), STREAM, ckpt)
    assert torch.load(ckpt, weights_only=False)["step"] == 3


def test_bfloat16_autocast_trains_float32_weights(tmp_path):
    model = train(ARGS, replace(CFG, autocast=True), STREAM, tmp_path / "m.ckpt")
    assert all(p.dtype == torch.float32 for p in model.parameters())
    assert torch.load(tmp_path / "m.ckpt", weights_only=False)["config"]["autocast"] is True


@pytest.mark.parametrize("change", [{"lr": 1e-3}, {"batch": 3}, {"steps": 1},
                                    {"autocast": True}])
def test_any_other_change_is_refused(tmp_path, change):
    ckpt = tmp_path / "m.ckpt"
    train(ARGS, CFG, STREAM, ckpt)
    with pytest.raises(ValueError, match="different config"):
        train(ARGS, replace(CFG, **change), STREAM, ckpt)

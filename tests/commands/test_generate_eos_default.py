"""`generate` stops at <|endoftext|> by default (--no-stop-at-eos to go on), and says when --chat
runs on a model never fine-tuned on chat (issue 41 item 7)."""

from __future__ import annotations

import pytest
import torch

from gptforge.cli import main


@pytest.fixture(scope="module")
def base_run(tiny_shards, tmp_path_factory):
    from gptforge.config import ModelConfig, RunConfig, TrainConfig
    from gptforge.train.run import train

    run = tmp_path_factory.mktemp("gen") / "run"
    cfg = RunConfig(model=ModelConfig(preset="gpt2-nano", d_model=32, n_head=2, block_size=64),
                    train=TrainConfig(max_steps=3, micro_batch_size=4, eval_interval=0, checkpoint_interval=0,
                                      tensorboard=False, report=False, seed=0))
    train(cfg, tiny_shards, run, progress=False)
    return run


def _fake_generate(seen):
    def fake(model, idx, max_new_tokens, **kw):
        seen.update(kw)
        eos = 0
        tail = torch.tensor([[5, 6, eos, 7, 8]] * idx.shape[0], dtype=torch.long)
        return torch.cat([idx, tail], dim=1)
    return fake


def test_generate_stops_at_eos_by_default(base_run, monkeypatch, capsys):
    import gptforge.infer.generate as g
    from gptforge.data.tokenizer import Tokenizer

    tok = Tokenizer.from_file(base_run / "tokenizer.json")
    assert tok.eos_id == 0
    seen: dict = {}
    monkeypatch.setattr(g, "generate", _fake_generate(seen))
    assert main(["generate", str(base_run), "--prompt", "def", "--max-new-tokens", "5", "--device", "cpu"]) == 0
    out = capsys.readouterr().out
    assert seen["eos_id"] == 0 and out.strip() == "def" + tok.decode([5, 6])
    assert main(["generate", str(base_run), "--prompt", "def", "--max-new-tokens", "5", "--device", "cpu",
                 "--no-stop-at-eos"]) == 0
    assert seen["eos_id"] is None and tok.decode([7, 8]) in capsys.readouterr().out


def test_chat_on_a_base_run_says_it_uses_the_default_template(base_run, monkeypatch, capsys):
    import gptforge.infer.generate as g

    monkeypatch.setattr(g, "generate", _fake_generate({}))
    assert main(["generate", str(base_run), "--prompt", "hi", "--chat", "--max-new-tokens", "5",
                 "--device", "cpu"]) == 0
    err = capsys.readouterr().err
    assert "not fine-tuned on chat" in err and "default" in err

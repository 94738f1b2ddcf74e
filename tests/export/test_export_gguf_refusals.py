"""`gptforge export --format gguf` refuses, before writing anything, a model with options llama.cpp
cannot compute (naming each), and prints the kept-in-f16 note as one `warning:` line."""

from __future__ import annotations

from gptforge.cli import main


def _train(data, run_dir, **model):
    from gptforge.config import ModelConfig, RunConfig, TrainConfig
    from gptforge.train.run import train

    tc = TrainConfig(max_steps=2, micro_batch_size=2, lr=1e-3, warmup_steps=1, eval_interval=0,
                     checkpoint_interval=0, tensorboard=False, seed=0)
    train(RunConfig(model=ModelConfig(**model), train=tc), data, run_dir, progress=False)
    return run_dir


def test_gguf_refuses_modern_options_by_name_without_writing(tiny_shards, tmp_path, capsys):
    run = _train(tiny_shards, tmp_path / "modern", preset="modern-nano", d_model=32, n_head=2, block_size=32)
    out = tmp_path / "g"
    assert main(["export", str(run), "--format", "gguf", "--out", str(out)]) == 1
    err = capsys.readouterr().err
    lines = [ln for ln in err.splitlines() if ln.startswith("gptforge export: error:")]
    assert len(lines) == 1 and "Traceback" not in err and "KeyError" not in err
    for option in ("model.logit_softcap=15.0", "model.activation=relu2"):
        assert option in lines[0]
    # zero_init_proj is only the initialisation, and QK-norm on Llama blocks is llama.cpp's qwen3.
    assert "zero_init_proj" not in lines[0] and "qk_norm" not in lines[0]
    assert not out.exists()
    assert not list(tmp_path.glob(".g.tmp*"))  # no staging folder left


def test_gguf_kept_f16_is_one_warning_line(tiny_shards, tmp_path, capsys, recwarn):
    # d_ff 48: ffn_down rows (48 long) do not split into 32-value blocks.
    run = _train(tiny_shards, tmp_path / "llama", preset="llama-nano", d_model=32, n_head=2, n_kv_head=2,
                 d_ff=48, block_size=32)
    assert main(["export", str(run), "--format", "gguf", "--quantize", "q4_0", "--out", str(tmp_path / "q"),
                 "--quiet"]) == 0
    err = capsys.readouterr().err
    warn = [ln for ln in err.splitlines() if "kept in f16" in ln]
    assert len(warn) == 1 and warn[0].startswith("gptforge export: warning: --quantize q4_0: 2 of")
    assert "blk.0.ffn_down.weight [32, 48]" in warn[0]
    assert "UserWarning" not in err and not [w for w in recwarn if "kept in f16" in str(w.message)]


def test_gguf_refuses_qk_norm_where_qwen3_has_no_counterpart():
    import re

    import pytest

    from gptforge.config import ModelConfig
    from gptforge.errors import InputError
    from gptforge.export.gguf import check_representable, gguf_arch

    assert gguf_arch(ModelConfig(preset="qwen3-nano").resolved()) == "qwen3"
    check_representable(ModelConfig(preset="qwen3-nano"))
    for extra, words in ((dict(arch="gpt2"), "gpt2 graph has no per-head"),
                         (dict(qkv_bias=True), "qwen3 graph (QK-norm) has no biases"),
                         (dict(rope_scaling={"rope_type": "llama3", "factor": 2.0, "low_freq_factor": 1.0,
                                             "high_freq_factor": 4.0, "original_max_position_embeddings": 64}),
                          "per-frequency")):
        with pytest.raises(InputError, match=re.escape(words)):
            check_representable(ModelConfig(preset="qwen3-nano", **extra))

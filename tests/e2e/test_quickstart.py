"""The built-in default job, shrunk: a few library files, a few seconds of training."""

import pytest

from gptforge.quickstart import run_quickstart


@pytest.mark.slow
def test_quickstart_learns_beyond_unigram(tmp_path):
    lines = []
    # The default recipe's family (Qwen3 blocks + Muon), at the smallest shape.
    r = run_quickstart(tmp_path / "qs", vocab_size=384, preset="qwen3-nano", micro_batch_size=16, block_size=64,
                       max_files=40, workers=1, steps=150, progress=False, log=lines.append)
    assert r.steps == 150
    assert (r.run_dir / "checkpoints" / "latest").exists() and (r.data_dir / "meta.json").exists()
    assert r.val_loss < r.unigram_entropy - 0.3, (r.val_loss, r.unigram_entropy)
    assert r.val_bits_per_byte is not None and 0 < r.val_bits_per_byte < 8
    assert len(r.samples) == 3 and all(s.startswith(p) for s, p in zip(r.samples, ["def ", "class ", '"""'], strict=True))
    text = "\n".join(lines)
    assert "unigram entropy" in text and "tensorboard --logdir" in text

    # What the quickstart trains exports as the README's next steps say.
    from gptforge.cli import main

    assert main(["export", str(r.run_dir), "--format", "hf", "--out", str(tmp_path / "hf"), "--quiet"]) == 0
    pytest.importorskip("gguf")
    assert main(["export", str(r.run_dir), "--format", "gguf", "--out", str(tmp_path / "gguf"), "--quiet"]) == 0
    pytest.importorskip("onnxscript")
    assert main(["export", str(r.run_dir), "--format", "onnx", "--out", str(tmp_path / "onnx"), "--quiet"]) == 0


TINY = dict(vocab_size=300, preset="qwen3-nano", micro_batch_size=4, block_size=32, max_files=6, workers=1,
            steps=2, progress=False)


@pytest.mark.parametrize("folder", ["run", "data"])
def test_quickstart_never_replaces_folders_it_did_not_write(tmp_path, folder):
    """`quickstart --out PROJ` replaced PROJ/run (a user's pretrain run) and PROJ/data (with notes)."""
    from gptforge.errors import InputError

    proj = tmp_path / "proj"
    (proj / folder).mkdir(parents=True)
    (proj / folder / "my_notes.txt").write_text("keep me\n")
    with pytest.raises(InputError, match=f"{folder} exists and was not written by gptforge quickstart"):
        run_quickstart(proj, log=lambda _: None, **TINY)
    assert (proj / folder / "my_notes.txt").read_text() == "keep me\n"
    assert not (proj / ("data" if folder == "run" else "run")).exists()


def test_quickstart_rerun_says_it_replaces_the_previous_run(tmp_path):
    first, second = [], []
    r = run_quickstart(tmp_path / "qs", log=first.append, **TINY)
    assert (tmp_path / "qs" / ".gptforge-quickstart").is_file() and not any("replaces" in x for x in first)
    (r.run_dir / "stale.txt").write_text("from the first run\n")
    run_quickstart(tmp_path / "qs", log=second.append, **TINY)
    assert any("this rerun replaces the previous quickstart run" in x for x in second)
    assert not (r.run_dir / "stale.txt").exists() and (r.run_dir / "checkpoints" / "latest").exists()


@pytest.mark.parametrize("argv, said", [
    (["--steps", "0"], "--steps must be >= 1, got 0"),
    (["--minutes", "0"], "--minutes must be > 0"),
    (["--max-files", "-3"], "--max-files must be >= 1, got -3"),
    (["--preset", "gpt2-nanoo"], "did you mean 'gpt2-nano'"),
    (["--minutes", "1e400"], "--minutes must be > 0 (a finite number), got inf"),
    (["--micro-batch-size", "0"], "--micro-batch-size must be >= 1, got 0"),
    (["--workers", "-3"], "--workers must be >= 0, got -3"),
    (["--optimizer", "sgdx"], "--optimizer 'sgdx': the quickstart trains with muon or adamw"),
    (["--vocab-size", "0"], "--vocab-size must be in [257, 4294967296], got 0"),
    (["--vocab-size", "10"], "--vocab-size must be in [257, 4294967296], got 10"),
    (["--vocab-size", str(10**20)], f"--vocab-size must be in [257, 4294967296], got {10**20}"),
    (["--block-size", "0"], "--block-size must be >= 1, got 0"),
    (["--preset", "bogus"], "--preset: unknown preset 'bogus'; choose one of gpt2-nano, "),
])
def test_quickstart_refuses_bad_options_before_preparing_anything(tmp_path, capsys, argv, said):
    from gptforge.cli import main

    out = tmp_path / "qs"
    try:
        rc = main(["quickstart", "--out", str(out), *argv])
    except SystemExit as e:  # the option parser's exit
        rc = e.code
    assert rc == 2  # gptforge.errors.USAGE_EXIT, whether the parser or a later check refused it
    err = capsys.readouterr().err
    assert said in err and "model." not in err  # the quickstart's own option, not the config key
    assert not out.exists()  # nothing prepared, no folder claimed


def test_quickstart_short_val_warning_names_quickstart_options(tiny_shards):
    """The quickstart's trainer source names `gptforge quickstart` options, not `gptforge prepare` ones."""
    from gptforge.quickstart import _open_source
    from tests.train.test_short_val_advice import short_val_warning

    lines: list[str] = []
    warning = short_val_warning(_open_source(tiny_shards, 1, lines.append), lines)
    assert "--max-files" in warning and "--block-size" in warning
    assert "--val-fraction" not in warning and "--doc-separator" not in warning and "model.block_size" not in warning


def test_quickstart_trains_on_its_own_source(tiny_shards, tmp_path, monkeypatch):
    """`_train` hands train() the source it is given (the quickstart's, with its own messages)."""
    import gptforge.train.run as run_module
    from gptforge.config import ModelConfig, RunConfig, TrainConfig
    from gptforge.quickstart import _open_source, _train

    handed = {}

    def fake_train(cfg, data_dir, run_dir, progress=True, log=None, *, data=None, **kw):
        handed["data"], handed["dir"] = data, data_dir
        return type("Result", (), {"step": 0})()

    monkeypatch.setattr(run_module, "train", fake_train)
    source = _open_source(tiny_shards, 1, lambda _: None)
    _train(RunConfig(model=ModelConfig(preset="qwen3-nano"), train=TrainConfig(micro_batch_size=1)), source,
           tmp_path / "run", False, lambda _: None)
    assert handed["data"] is source and handed["dir"] == tiny_shards


def test_quickstart_few_val_windows_note_names_no_train_fields(tiny_shards):
    """`quickstart --max-files 30` said "fewer than the 128 asked (train.eval_steps x micro_batch_size)"."""
    from gptforge.config import TrainConfig
    from gptforge.quickstart import _open_source

    lines: list[str] = []
    source = _open_source(tiny_shards, 16, lines.append)
    window = int(source.meta["splits"]["val"]["tokens"]) // 4  # a few val windows, far fewer than 128
    try:
        source.batches(window, TrainConfig(micro_batch_size=1, eval_interval=1), 0, 1)
    finally:
        source.close()
    (note,) = [m for m in lines if "asked" in m]
    assert "fewer than the 128 asked" in note and "--micro-batch-size" in note
    assert "train.eval_steps" not in note and "micro_batch_size" not in note


def test_quickstart_one_file_split_warning_names_max_files(tmp_path, caplog):
    """`quickstart --max-files 1` advised prepare's --doc-separator for a split by document."""
    from gptforge.quickstart import _library_files, _prepare_corpus

    with caplog.at_level("WARNING", logger="gptforge.data"):
        _prepare_corpus(tmp_path / "data", _library_files(1), 300, 1, False, lambda _: None)
    assert "split by position" in caplog.text and "--max-files" in caplog.text
    assert "--doc-separator" not in caplog.text


def test_quickstart_refuses_a_block_longer_than_its_train_split_before_timing(tmp_path, monkeypatch):
    """`quickstart --max-files 2 --block-size 4096` timed 16x4096-token steps for 100 s on 3,161 train tokens
    (here the tiny vocabulary gives more tokens: a longer block)."""
    import gptforge.train.budget as budget
    from gptforge.errors import InputError

    monkeypatch.setattr(budget, "measure_step_seconds", lambda *a, **k: pytest.fail("timed a shape the data cannot fill"))
    with pytest.raises(InputError, match=r"fewer than one window of 100001 tokens.*--max-files.*--block-size"):
        run_quickstart(tmp_path / "qs", log=lambda _: None, **{**TINY, "block_size": 100_000, "max_files": 2,
                                                                "minutes": 1.0, "steps": None})
    assert not (tmp_path / "qs" / "run").exists()


def test_quickstart_short_steps_run_times_nothing(tmp_path, monkeypatch):
    """With a short --steps run nothing needs a step time: the threads probe is skipped."""
    import gptforge.train.budget as budget

    monkeypatch.setattr(budget, "measure_step_seconds", lambda *a, **k: pytest.fail("a short --steps run timed steps"))
    lines: list[str] = []
    r = run_quickstart(tmp_path / "qs", log=lines.append, **TINY)
    assert r.steps == TINY["steps"] and any("no timing probe" in m for m in lines)

"""prepare says when a recipe removed most of a corpus, on every path (issue 41 item 2)."""

from __future__ import annotations

import logging
import subprocess
import sys

from gptforge.data.prepare import PrepareConfig, prepare
from gptforge.data.prepare_sources import prepare_sources

WORDS = "the river city garden market school teacher children morning winter summer bridge station".split()


def _corpus(root, name="en"):
    """7 short documents (40 characters) and 3 long ones: a 100-character minimum removes 70% of
    the documents but ~15% of the characters, so no single step crosses the characters rule."""
    d = root / name
    d.mkdir(parents=True)
    import random

    rng = random.Random(name)
    for k in range(7):
        (d / f"short{k}.txt").write_text(" ".join(rng.choice(WORDS) for _ in range(6)) + ".", encoding="utf-8")
    for k in range(3):
        (d / f"long{k}.txt").write_text(" ".join(rng.choice(WORDS) for _ in range(60)) + ".", encoding="utf-8")
    return d


def _recipe(root):
    path = root / "short.yaml"
    path.write_text("steps:\n  - length: {min_chars: 100}\n", encoding="utf-8")
    return str(path)


def test_single_input_warns_when_most_documents_are_removed(tmp_path, caplog):
    src = _corpus(tmp_path)
    with caplog.at_level(logging.WARNING, logger="gptforge.data"):
        prepare(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "out"), recipe=_recipe(tmp_path), vocab_size=300,
                              val_fraction=0.0, workers=1), show_progress=False)
    msgs = [r.getMessage() for r in caplog.records if "removed 70% of the documents" in r.getMessage()]
    assert len(msgs) == 1, [r.getMessage() for r in caplog.records]
    assert "length: too_short" in msgs[0] and "--recipe" in msgs[0]


def test_mixture_warns_per_source_and_prints_each_step_table(tmp_path, caplog):
    en, zh = _corpus(tmp_path, "en"), _corpus(tmp_path, "zh")
    recipe = _recipe(tmp_path)
    with caplog.at_level(logging.WARNING, logger="gptforge.data"):
        prepare_sources(PrepareConfig(inputs=[], out=str(tmp_path / "mix"), vocab_size=300, val_fraction=0.0,
                                      workers=1), {"en": [str(en)], "zh": [str(zh)]}, recipes={"zh": recipe},
                        show_progress=False)
    msgs = [r.getMessage() for r in caplog.records if "of the documents" in r.getMessage()]
    assert len(msgs) == 1 and msgs[0].startswith("source zh:"), msgs
    assert "--source-recipe zh=" in msgs[0]
    # The CLI prints each source's table of what every step removed.
    cmd = [sys.executable, "-m", "gptforge.cli", "prepare", "--source", f"en={en}", "--source", f"zh={zh}",
           "--source-recipe", f"zh={recipe}", "--out", str(tmp_path / "mix2"), "--vocab-size", "300",
           "--val-fraction", "0", "--workers", "1", "--quiet"]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr
    assert "length: too_short" in done.stdout and "7" in done.stdout
    assert done.stdout.count("documents kept") == 2

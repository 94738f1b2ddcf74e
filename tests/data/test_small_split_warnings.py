"""A split of a few documents is said, by prepare and by pretrain on a mixture (issue 41 item 3)."""

from __future__ import annotations

import logging
import random

from gptforge.data.prepare import PrepareConfig, prepare, summary_rows
from gptforge.data.prepare_sources import prepare_sources

WORDS = "the river city garden market school teacher children morning winter summer bridge station".split()


def _corpus(root, n: int, name: str = "en"):
    rng = random.Random(name)
    d = root / name
    d.mkdir(parents=True)
    for k in range(n):
        (d / f"{k:03d}.txt").write_text(" ".join(rng.choice(WORDS) for _ in range(80)) + ".", encoding="utf-8")
    return d


def test_prepare_warns_for_a_val_split_under_10_documents(tmp_path, caplog):
    src = _corpus(tmp_path, 40)
    with caplog.at_level(logging.WARNING, logger="gptforge.data"):
        r = prepare(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "out"), recipe="none", vocab_size=300,
                                  val_fraction=0.05, workers=1), show_progress=False)
    n_val = r.meta["splits"]["val"]["documents"]
    assert 0 < n_val < 10
    msgs = [m.getMessage() for m in caplog.records if "val split" in m.getMessage()]
    assert len(msgs) == 1 and f"{n_val} document" in msgs[0] and "--val-fraction" in msgs[0], msgs
    assert any(label == "WARNING" and "val split" in value for label, value in summary_rows(r))


def test_no_warning_for_a_large_enough_split(tmp_path, caplog):
    src = _corpus(tmp_path, 40)
    with caplog.at_level(logging.WARNING, logger="gptforge.data"):
        prepare(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "out"), recipe="none", vocab_size=300,
                              val_fraction=0.4, workers=1), show_progress=False)
    assert not [m for m in caplog.records if "split" in m.getMessage()]


def test_mixture_names_the_source_of_a_small_split(tmp_path, caplog):
    en, zh = _corpus(tmp_path, 40, "en"), _corpus(tmp_path, 60, "zh")
    with caplog.at_level(logging.WARNING, logger="gptforge.data"):
        prepare_sources(PrepareConfig(inputs=[], out=str(tmp_path / "mix"), recipe="none", vocab_size=300,
                                      val_fraction=0.4, workers=1), {"en": [str(en)], "zh": [str(zh)]},
                        recipes=None, show_progress=False)
    assert not [m for m in caplog.records if "split" in m.getMessage()]
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="gptforge.data"):
        prepare_sources(PrepareConfig(inputs=[], out=str(tmp_path / "mix2"), recipe="none", vocab_size=300,
                                      val_fraction=0.05, workers=1), {"en": [str(en)], "zh": [str(zh)]},
                        show_progress=False)
    msgs = [m.getMessage() for m in caplog.records if "val split" in m.getMessage()]
    assert {m.split(":")[0] for m in msgs} == {"source en", "source zh"}, msgs


def test_pretrain_warns_per_source_for_fewer_val_windows_than_asked(tmp_path):
    from gptforge.config import TrainConfig
    from gptforge.train.sources.mixture import open_source

    en, zh = _corpus(tmp_path, 40, "en"), _corpus(tmp_path, 40, "zh")
    prepare_sources(PrepareConfig(inputs=[], out=str(tmp_path / "mix"), recipe="none", vocab_size=300,
                                  val_fraction=0.3, workers=1), {"en": [str(en)], "zh": [str(zh)]},
                    show_progress=False)
    lines: list[str] = []
    source = open_source(str(tmp_path / "mix"), 50, 4, lines.append)
    try:
        source.batches(32, TrainConfig(micro_batch_size=4, eval_interval=1, eval_steps=50,
                                       data_weights={"en": 0.5, "zh": 0.5}), 0, 1)
    finally:
        source.close()
    warned = [m for m in lines if "fewer than the 200 asked" in m]
    assert len(warned) == 2 and all(m.startswith("WARNING") for m in warned), lines
    assert any(str(tmp_path / "mix" / "zh") in m for m in warned)

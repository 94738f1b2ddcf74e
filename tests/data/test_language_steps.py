"""Language-aware recipe steps: each document's own language's thresholds (issue 24 item 1)."""

from __future__ import annotations

import pickle
import subprocess
import sys
from dataclasses import replace

import pytest

from gptforge.data.filters import C4Quality, FineWebQuality, GopherQuality
from gptforge.data.languages import table_language
from gptforge.data.pipeline import apply_steps, build_recipe, parameters_in_force, recipe_languages, with_languages
from gptforge.data.readers import Document

# Five sentences, no space after any sentence end (as Chinese is written), on two lines.
ZH = ("今天我们在北京召开了年度会议。会议讨论了明年的发展计划和主要目标！各部门负责人都发表了自己的看法。\n"
      "大家认为新的产品线应该尽快上线吗？最后，总经理对全体员工的努力表示了感谢。")
EN = ("The river ran past the old mill. Children played on the bridge every morning! "
      "Was the market open on Sunday? The teacher said it was. We walked home before dark.")


def _run(recipe: dict, docs: list[Document]) -> tuple[list[Document], list]:
    stats: list = []
    out = list(apply_steps(docs, build_recipe(recipe).steps, stats))
    return out, stats


def test_chinese_sentences_counted_without_spaces():
    # English rules (the default): 。！？ need a space after them, so this is one sentence.
    out, stats = _run({"steps": [{"c4": {}}]}, [Document(ZH, "a")])
    assert out == [] and stats[0].dropped == {"few_sentences": 1}
    assert stats[0].counts["removed en"] == 1
    # The recipe's language, or the document's own label, gives Chinese rules: five sentences.
    out, _ = _run({"language": "zh", "steps": [{"c4": {}}]}, [Document(ZH, "a")])
    assert [d.text for d in out] == [ZH]
    out, _ = _run({"steps": [{"c4": {}}]}, [Document(ZH, "a", language="zh")])
    assert [d.text for d in out] == [ZH]


def test_mixed_corpus_applies_each_documents_language_and_counts_removals_per_language():
    docs = [Document(EN, "en1", language="en"), Document(ZH, "zh1", language="zh"),
            Document(ZH, "zh-unlabelled"), Document("太短了。", "zh2", language="zh-TW"),
            Document("Too short.", "en2", language="en")]
    out, stats = _run({"steps": [{"c4": {}}]}, docs)
    assert [d.id for d in out] == ["en1", "zh1"]
    assert stats[0].dropped == {"few_sentences": 3}
    assert stats[0].counts["removed en"] == 2 and stats[0].counts["removed zh"] == 1


def test_recipe_options_apply_to_every_language():
    out, _ = _run({"steps": [{"c4": {"min_sentences": 1, "min_words_per_line": 1}}]}, [Document("太短了。", "a", language="zh"),
                                                                Document("Short.", "b", language="en")])
    assert [d.id for d in out] == ["a", "b"]
    step = build_recipe({"steps": [{"gopher_quality": {"min_words": 10}}]}).steps[0]
    assert isinstance(step, GopherQuality) and step.language == "en"
    assert step.for_language("zh").min_words == 10 and step.for_language("zh").min_alpha_words_ratio == 0.735
    assert step.for_language("en") is step and step.min_words == 10 and step.min_alpha_words_ratio == 0.8
    # A filter made directly carries the fields it was given to other languages.
    assert GopherQuality(min_words=7).for_language("zh").min_words == 7


def test_english_documents_decide_as_the_filters_alone():
    texts = [EN, EN + "\nMenu\nHome | About", "Short.", "{code} " + EN, ZH, EN + "\n" + EN]
    for name, cls in (("c4", C4Quality), ("gopher_quality", GopherQuality), ("fineweb", FineWebQuality)):
        wrapped = build_recipe({"steps": [{name: {}}]}).steps[0]
        plain = cls()
        for i, t in enumerate(texts):
            for lang in (None, "en", "fr"):  # no label, English, a language without a table
                doc = Document(t, str(i), language=lang)
                a, b = wrapped(doc), plain.decide(doc)
                assert (a if isinstance(a, str) else a.text) == (b if isinstance(b, str) else b.text), (name, i)


def test_chinese_stop_words_are_characters():
    step = GopherQuality(min_words=10)
    with_stop = Document("我们的工作在明年会有新的进展和变化，大家都很期待。" * 2, "a", language="zh")
    without = Document("春眠不觉晓处处闻啼鸟夜来风雨声花落知多少" * 3, "b", language="zh")
    assert step(with_stop) is with_stop
    assert step(without) == "stop_words"
    # Under English rules the stop-word rule is skipped for Chinese text, as before.
    assert step(replace(without, language="en")).text == without.text


def test_parameters_in_force_and_show_recipe():
    recipe = with_languages({"steps": [{"c4": {"filter_curly_bracket": False}}, {"fineweb": {}}]}, ["en", "zh"], None)
    assert recipe_languages(recipe) == ["en", "zh"]
    params = parameters_in_force(recipe)
    assert params["c4"]["zh"]["min_words_per_line"] == 5 and params["c4"]["en"]["min_words_per_line"] == 3
    assert params["c4"]["zh"]["filter_curly_bracket"] is False
    assert params["fineweb"]["zh"]["short_line_length"] == 10 and params["fineweb"]["en"]["short_line_length"] == 30
    assert recipe_languages({"steps": []}) == ["en"] and recipe_languages({"language": "ja", "steps": []}) == ["ja"]
    out = subprocess.run([sys.executable, "-m", "gptforge.cli", "prepare", "--show-recipe", "web", "--languages", "zh"],
                         capture_output=True, text=True, check=True).stdout
    assert "- zh" in out and "#     zh:" in out and "#     en:" not in out
    assert "short_line_length: 10" in out and "min_words: 85" in out


def test_bad_language_and_labels():
    with pytest.raises(ValueError, match="recipe: language: no language table for 'xx'"):
        build_recipe({"language": "xx", "steps": [{"c4": {}}]})
    with pytest.raises(ValueError, match="unknown option 'min_sentence'"):
        build_recipe({"steps": [{"c4": {"min_sentence": 1}}]})
    assert table_language("cmn_Hani", "en") == "zh" and table_language("fr", "ko") == "ko"
    assert table_language(None, "en") == "en"


def test_language_aware_step_pickles():
    step = pickle.loads(pickle.dumps(build_recipe({"language": "zh", "steps": [{"c4": {}}]}).steps[0]))
    assert isinstance(step, C4Quality) and step.language == "zh" and step.min_words_per_line == 5
    assert not isinstance(step(Document(ZH, "a")), str)


def test_near_dedup_threshold_option_and_record():
    from gptforge.data.dedup import DedupConfig

    rec = build_recipe({"steps": [{"dedup": {}}]}).mask_step.near_dedup_record()
    assert (rec["bands"], rec["rows"], rec["ngram"]) == (14, 8, 5) and rec["similarity_threshold"] == 0.719
    assert "Han character" in rec["shingle_unit"] and rec["threshold_given"] is None
    step = build_recipe({"steps": [{"dedup": {"threshold": 0.8}}]}).mask_step
    assert step.bands == 6 and abs(step.near_dedup_record()["similarity_threshold"] - 0.8) < 0.01
    assert DedupConfig(threshold=0.6, rows=4).bands == 8
    with pytest.raises(ValueError, match="threshold or bands, not both"):
        DedupConfig(threshold=0.8, bands=20)
    with pytest.raises(ValueError, match="between 0 and 1"):
        DedupConfig(threshold=1.5)


ZH_SENTENCES = ("我们今天在图书馆里学习了很久。", "这家小店的面条非常好吃！", "明天的天气会不会变冷？",
                "老师说这本书值得每个学生认真阅读。", "城市里的公园在春天开满了花。", "他每天早上骑自行车去上班。",
                "这个问题需要大家一起讨论才能解决。", "我们的新产品在下个月正式发布！", "你觉得这部电影的结局怎么样？",
                "农民们在秋天收获了大量的粮食。", "博物馆里展出了许多古代的文物。", "孩子们在河边快乐地玩耍。")
EN_WORDS = ("the of and to in is was for on that with river city garden market school teacher children "
            "morning winter summer bridge station village farmer harvest letter window kitchen library").split()


def test_prepare_mixed_corpus_languages(tmp_path):
    """prepare --languages en zh: each document's own rules, per-language val figures, near-dedup record."""
    import json
    import random

    from gptforge.data.prepare import PrepareConfig, prepare

    rng = random.Random(24)
    rows = []
    for _ in range(40):
        rows.append("".join(rng.sample(ZH_SENTENCES, 7)))
        rows.append(" ".join(" ".join(rng.choice(EN_WORDS) for _ in range(12)).capitalize() + "."
                             for _ in range(7)))
    src = tmp_path / "docs.jsonl"
    src.write_text("".join(json.dumps({"text": t}, ensure_ascii=False) + "\n" for t in rows), encoding="utf-8")
    recipe = tmp_path / "r.yaml"
    recipe.write_text("steps:\n  - c4: {}\n  - dedup: {threshold: 0.8}\n", encoding="utf-8")
    res = prepare(PrepareConfig(inputs=[str(src)], out=str(tmp_path / "out"), recipe=str(recipe), languages=["en", "zh"],
                                val_fraction=0.3, vocab_size=600, workers=1), show_progress=False)
    c4 = next(s for s in res.steps if s.name == "c4")
    assert c4.documents_out >= 75  # 。！？ end Chinese sentences: the Chinese documents pass C4
    langs = res.meta["prepare_config"]["val_languages"]
    assert set(langs) == {"en", "zh"}
    for c in langs.values():
        assert c["documents"] > 0 and c["bytes_per_token"] == round(c["bytes"] / c["tokens"], 4)
    # A Han character is 3 UTF-8 bytes: more bytes than characters per token in Chinese only.
    assert langs["zh"]["bytes_per_token"] > 2 * langs["zh"]["characters_per_token"]
    assert langs["en"]["bytes_per_token"] == langs["en"]["characters_per_token"]
    near = res.meta["prepare_config"]["near_dedup"]
    assert near["bands"] == 6 and near["threshold_given"] == 0.8 and near["similarity_threshold"] == 0.7993


def test_every_table_builds_every_language_aware_step():
    from gptforge.data.languages import LANGUAGES
    from gptforge.data.pipeline import LANGUAGE_STEPS

    recipe = {"steps": [{name: {}} for name in LANGUAGE_STEPS]}
    for lang in LANGUAGES:
        steps = build_recipe({**recipe, "language": lang}).steps
        assert [s.language for s in steps] == [lang] * len(LANGUAGE_STEPS)
        assert all(not isinstance(s(Document(ZH + "\n" + EN, "x")), type(None)) for s in steps)

"""CMMLU and C-Eval csv layouts as task files, lm-eval's prompts, and bits per byte on Chinese text."""

from __future__ import annotations

import csv
import importlib.util
import io
import json
import math
from pathlib import Path

import pytest

from gptforge.cli import main
from gptforge.errors import InputError
from gptforge.eval.runner import fewshot_contexts, run_task
from gptforge.eval.tasks import load_task
from gptforge.eval.tasks_zh import DESCRIPTIONS

# Questions written for these tests.
QUESTIONS = [
    ("中国的首都是哪座城市？", "上海", "北京", "广州", "深圳", "B"),
    ("一年有多少个月？", "十二", "十", "十一", "十三", "A"),
    ("水在标准大气压下的沸点是多少摄氏度？", "90", "80", "100", "120", "C"),
    ("下列哪一项是哺乳动物？", "鲨鱼", "企鹅", "青蛙", "鲸鱼", "D"),
]


def _csv(path: Path, header: list[str], rows: list[list[str]]) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    buf = io.StringIO()
    w = csv.writer(buf, lineterminator="\n")
    w.writerow(header)
    w.writerows(rows)
    path.write_text(buf.getvalue(), encoding="utf-8")
    return path


def _cmmlu(root: Path) -> Path:
    header = ["", "Question", "A", "B", "C", "D", "Answer"]
    _csv(root / "dev" / "common_sense.csv", header, [[str(i), *q] for i, q in enumerate(QUESTIONS[2:])])
    return _csv(root / "test" / "common_sense.csv", header, [[str(i), *q] for i, q in enumerate(QUESTIONS[:2])])


def _ceval(root: Path) -> Path:
    header = ["id", "question", "A", "B", "C", "D", "answer", "explanation"]
    _csv(root / "dev" / "common_sense_dev.csv", header, [[str(i), *q, "1. 解析"] for i, q in enumerate(QUESTIONS[2:])])
    (root / "subject_mapping.json").write_text(json.dumps({"common_sense": ["Common Sense", "常识", "Other"]},
                                                          ensure_ascii=False), encoding="utf-8")
    return _csv(root / "val" / "common_sense_val.csv", header, [[str(i), *q, ""] for i, q in enumerate(QUESTIONS[:2])])


def test_cmmlu_layout_prompt_and_fewshot(tmp_path):
    task = load_task(_cmmlu(tmp_path / "cmmlu"))
    assert (task.format, task.type, len(task.examples)) == ("cmmlu", "multiple_choice", 2)
    e = task.examples[0]
    assert e.contexts == ["中国的首都是哪座城市？\nA. 上海\nB. 北京\nC. 广州\nD. 深圳\n答案："]
    assert e.continuations == [" A", " B", " C", " D"] and e.label == 1
    assert task.examples[1].label == 0 and task.chance == pytest.approx(0.25)
    assert task.description == "以下是关于common sense的单项选择题，请直接给出正确答案的选项。\n\n"
    assert task.fewshot_sampler == "first_n" and len(task.fewshot_pool) == 2
    ctx = fewshot_contexts(task, 0, 2, seed=0)[0]
    assert ctx == (task.description + "水在标准大气压下的沸点是多少摄氏度？\nA. 90\nB. 80\nC. 100\nD. 120\n答案： C\n\n"
                   "下列哪一项是哺乳动物？\nA. 鲨鱼\nB. 企鹅\nC. 青蛙\nD. 鲸鱼\n答案： D\n\n" + e.contexts[0])


def test_ceval_val_with_dev_fewshot_and_subject_mapping(tmp_path):
    task = load_task(_ceval(tmp_path / "ceval"))
    assert task.format == "ceval" and [x.label for x in task.examples] == [1, 0]
    assert task.examples[1].contexts == ["一年有多少个月？\nA. 十二\nB. 十\nC. 十一\nD. 十三\n答案："]
    assert task.description == "以下是中国关于常识的单项选择题，请选出其中的正确答案。\n\n"
    assert [x.label for x in task.fewshot_pool] == [2, 3]


def test_ceval_test_split_and_bad_rows_are_named(tmp_path):
    test = _csv(tmp_path / "ceval" / "test" / "x_test.csv", ["id", "question", "A", "B", "C", "D"],
                [["0", "问题？", "甲", "乙", "丙", "丁"]])
    with pytest.raises(InputError, match=r"x_test.csv: C-Eval's test split publishes no answers .*val/SUBJECT_val"):
        load_task(test)
    bad = _csv(tmp_path / "bad" / "test" / "y.csv", ["", "Question", "A", "B", "C", "D", "Answer"],
               [["0", "问题？", "甲", "乙", "丙", "丁", "E"]])
    with pytest.raises(InputError, match=r"y.csv, line 2: column 'Answer' = 'E'; expected A, B, C or D"):
        load_task(bad)
    short = _csv(tmp_path / "short" / "test" / "z.csv", ["", "Question", "A", "B", "C", "D", "Answer"],
                 [["0", "问题？", "甲", "乙"]])
    with pytest.raises(InputError, match=r"z.csv, line 2: 4 cells, but the header has 7"):
        load_task(short)


@pytest.mark.skipif(importlib.util.find_spec("lm_eval") is None, reason="lm_eval is not installed")
def test_prompts_are_lm_evals(tmp_path):
    """lm-eval's own cmmlu/ceval templates (doc_to_text, description) render what we build."""
    import jinja2
    import lm_eval
    import yaml

    tasks_dir = Path(lm_eval.__file__).parent / "tasks"
    cases = [("cmmlu", "_default_template_yaml", "cmmlu_agronomy.yaml", "农学", _cmmlu(tmp_path / "c1"), "Question"),
             ("ceval", "_default_ceval_yaml", "ceval-valid_accountant.yaml", "注册会计师", _ceval(tmp_path / "c2"),
              "question")]
    for fmt, default, subject_yaml, subject, path, q_key in cases:
        spec = yaml.safe_load((tasks_dir / fmt / default).read_text(encoding="utf-8"))
        doc = dict(zip([q_key, "A", "B", "C", "D"], QUESTIONS[0][:5], strict=True))
        want = jinja2.Template(spec["doc_to_text"]).render(**doc)
        assert load_task(path).examples[0].contexts == [want]
        assert spec["fewshot_config"]["sampler"] == "first_n"
        described = yaml.safe_load((tasks_dir / fmt / subject_yaml).read_text(encoding="utf-8"))["description"]
        assert DESCRIPTIONS[fmt].format(subject=subject) == described


def test_scoring_a_cmmlu_file(tmp_path, loaded):
    model, tok = loaded
    result = run_task(model, tok, _cmmlu(tmp_path / "cmmlu"), num_fewshot=1, batch_size=4)
    assert result.n == 2 and 0.0 <= result.metrics["acc"]["value"] <= 1.0


def test_bits_per_byte_on_chinese_text_counts_utf8_bytes(trained_run, tmp_path, capsys):
    text = "".join(q[0] for q in QUESTIONS) * 4  # 3 UTF-8 bytes per Han character
    path = tmp_path / "zh.txt"
    path.write_text(text, encoding="utf-8")
    assert main(["evaluate", str(trained_run), "--text", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["text_bytes"] == len(text.encode("utf-8")) > 2.5 * len(text)
    assert out["bytes"] == out["text_bytes"]
    assert out["bits_per_byte"] == pytest.approx(out["total_nats"] / math.log(2) / out["text_bytes"])


def test_cmmlu_without_the_index_column(tmp_path):
    """`Question,A,B,C,D,Answer` (no leading index column) read its header as an MMLU data row."""
    path = _csv(tmp_path / "cmmlu" / "test" / "common_sense.csv", ["Question", "A", "B", "C", "D", "Answer"],
                [list(q) for q in QUESTIONS])
    task = load_task(path)
    assert (task.format, len(task.examples)) == ("cmmlu", 4)
    assert task.examples[0].contexts == ["中国的首都是哪座城市？\nA. 上海\nB. 北京\nC. 广州\nD. 深圳\n答案："]
    assert [e.label for e in task.examples] == [1, 0, 2, 3]

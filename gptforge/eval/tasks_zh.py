"""CMMLU and C-Eval task files: their published csv layouts, scored with lm-eval's conventions.

| format  | csv header                                   | split folders                                        |
|---------|----------------------------------------------|------------------------------------------------------|
| `cmmlu` | `,Question,A,B,C,D,Answer` (index column first, or without it) | `dev/SUBJECT.csv`, `test/SUBJECT.csv`              |
| `ceval` | `id,question,A,B,C,D,answer,explanation`     | `dev/SUBJECT_dev.csv`, `val/SUBJECT_val.csv`, `test/SUBJECT_test.csv` |

The prompt is lm-evaluation-harness 0.4's (tasks/cmmlu and tasks/ceval): the question, the
lettered choices and `答案：`, scored on " A" ... " D" (target delimiter " "), after the
subject's description, with few-shot examples from the dev file in order (`first_n`). C-Eval
publishes no answers for its test split: score `val/SUBJECT_val.csv` (lm-eval's ceval-valid).
The description names the subject: lm-eval names it in Chinese; here the Chinese name comes from
C-Eval's `subject_mapping.json` when the data folder has one (beside `dev/`), else the subject of
the file name is used ("high_school_physics" -> "high school physics"); a YAML task definition's
`description` replaces it.
"""

from __future__ import annotations

import json
from pathlib import Path

from gptforge.errors import InputError

HEADERS = {"cmmlu": ["Question", "A", "B", "C", "D", "Answer"], "ceval": ["id", "question", "A", "B", "C", "D"]}
DESCRIPTIONS = {"cmmlu": "以下是关于{subject}的单项选择题，请直接给出正确答案的选项。\n\n",
                "ceval": "以下是中国关于{subject}的单项选择题，请选出其中的正确答案。\n\n"}


def header_format(cells: list[str]) -> str | None:
    """"cmmlu" or "ceval" when `cells` (a csv file's first row) is that benchmark's header, else None.

    CMMLU's header is accepted with its leading index column (as published) and without it
    (`Question,A,B,C,D,Answer`, as a csv saved without the index writes it): the header names the
    columns either way.
    """
    cells = [c.strip().lstrip("\ufeff") for c in cells]
    if cells[-6:] == HEADERS["cmmlu"] and len(cells) in (6, 7):
        return "cmmlu"
    if cells[:6] == HEADERS["ceval"]:
        return "ceval"
    return None


def header_rows(path: Path, rows: list[tuple[int, list[str]]], fmt: str) -> list[tuple[int, dict]]:
    """The data rows of a CMMLU / C-Eval csv as (line, {column: cell}) (the header row dropped).

    Raises:
        InputError: a row with a different number of cells than the header; a C-Eval file
            without an `answer` column (its test split) or with an empty answer.
    """
    header = [c.strip().lstrip("\ufeff") for c in rows[0][1]]
    if fmt == "ceval" and "answer" not in header:
        raise InputError(f"{path}: C-Eval's test split publishes no answers (no 'answer' column); score its "
                         "val split (val/SUBJECT_val.csv), with few-shot examples from dev/SUBJECT_dev.csv")
    out = []
    for line, cells in rows[1:]:
        if len(cells) != len(header):
            raise InputError(f"{path}, line {line}: {len(cells)} cells, but the header has {len(header)} "
                             f"({','.join(header)})")
        out.append((line, dict(zip(header, cells, strict=True))))
    return out


def question_and_answer(path: Path, line: int, row: dict, fmt: str) -> tuple[str, int]:
    """(context, gold index) of one row: lm-eval's `doc_to_text` and `doc_to_target`.

    Raises:
        InputError: an answer that is not A, B, C or D (names the file, line and column).
    """
    q_key, a_key = ("Question", "Answer") if fmt == "cmmlu" else ("question", "answer")
    answer = row[a_key].strip()
    if answer not in ("A", "B", "C", "D"):
        raise InputError(f"{path}, line {line}: column {a_key!r} = {row[a_key]!r}; expected A, B, C or D")
    context = row[q_key].strip() + "\n" + "".join(f"{k}. {row[k]}\n" for k in "ABCD") + "答案："
    return context, "ABCD".index(answer)


def subject_of(data: Path) -> str:
    """The subject key of a split file: "accountant_val.csv" -> "accountant", "agronomy.csv" -> "agronomy"."""
    stem = data.stem
    for split in ("_val", "_dev", "_test"):
        if stem.endswith(split):
            return stem[: -len(split)]
    return stem


def dev_file(data: Path, fmt: str) -> Path:
    """Where the published layout keeps the dev (few-shot) file of the split file `data`."""
    subject = subject_of(data)
    return data.parent.parent / "dev" / (f"{subject}_dev.csv" if fmt == "ceval" else f"{subject}.csv")


def description(data: Path, fmt: str) -> str:
    """lm-eval's description for the subject of `data` (see the module doc for the subject's name)."""
    subject = subject_of(data)
    name = subject.replace("_", " ")
    mapping = data.parent.parent / "subject_mapping.json"
    if mapping.is_file():
        try:
            entry = json.loads(mapping.read_text(encoding="utf-8")).get(subject)
        except (ValueError, UnicodeDecodeError) as e:
            raise InputError(f"{mapping}: not readable JSON ({e}); fix or remove it") from None
        if isinstance(entry, list) and len(entry) > 1 and isinstance(entry[1], str):
            name = entry[1]  # C-Eval's [English name, Chinese name, category]
    return DESCRIPTIONS[fmt].format(subject=name)

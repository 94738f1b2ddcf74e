"""Task files: read a benchmark file into `Example`s that the scorer turns into requests.

A task is a file; its format is recognised from its rows (every row must be in the same format):

| format        | rows                                                        | type            |
|---------------|-------------------------------------------------------------|-----------------|
| `mc`          | jsonl `{"context", "choices": [...], "label": index or text}` | multiple_choice |
| `hellaswag`   | HellaSwag jsonl `{"ctx_a", "ctx_b", "endings", "label", "activity_label"}` | multiple_choice |
| `arc`         | ARC jsonl `{"question": {"stem", "choices": [{"text", "label"}]}, "answerKey"}` | multiple_choice |
| `mmlu`        | MMLU csv without header: question, A, B, C, D, answer letter | multiple_choice |
| `cmmlu`, `ceval` | CMMLU / C-Eval csv with their headers (`gptforge.eval.tasks_zh`) | multiple_choice |
| `piqa`        | `{"goal", "sol1", "sol2", "label"}`                         | multiple_choice |
| `winogrande`  | `{"sentence" with one "_", "option1", "option2", "answer": "1"/"2"}` | multiple_choice |
| `classification` | `{"text", "label"}`                                      | classification  |
| `generation`  | `{"prompt", "answer": str or [str, ...]}`                   | generation      |
| `gsm8k`       | GSM8K jsonl `{"question": str, "answer": "... #### 72"}`    | generation      |
| `cloze`       | `{"text"}`: predict the last word (LAMBADA)                 | cloze           |
| `perplexity`  | `{"text"}` with `type: perplexity` in a YAML definition      | perplexity      |

Prompts follow lm-evaluation-harness 0.4's task definitions, so scores are comparable:
HellaSwag `activity_label: ctx_a ctx_b.capitalize()` with its bracket clean-up; ARC and PIQA
`Question: ...\\nAnswer:`; MMLU the question, the lettered choices and `Answer:`, scored on the
letters, after `The following are multiple choice questions (with answers) about SUBJECT.\\n\\n`
(SUBJECT from the file name, `abstract_algebra_test.csv` -> abstract algebra); WinoGrande's
partial scoring (one context per option, the text after `_` as the shared continuation);
LAMBADA's last word with no delimiter; GSM8K `Question: ...\nAnswer:` until `Question:`, 256 new
tokens, scored on the final answer (`gptforge.eval.answers`). Every choice is scored as
`target_delimiter + choice` (default " ") after the context.

A YAML task definition (`.yaml` / `.yml`) names a data file and may set the rest:

    name: sentiment                 # default: the file's stem
    data: reviews.jsonl             # relative to the YAML file
    type: classification            # default: recognised from the rows
    prompt: "Review: {text}\\nSentiment:"   # str.format over the row's fields
    labels: {pos: positive, neg: negative}  # classification: label -> verbalizer (order kept)
    target_delimiter: " "
    fewshot_data: train.jsonl       # few-shot examples from here instead of the other rows
    description: "..."              # text before the few-shot examples
    stop: ["\\n"]                    # generation stop strings
    max_new_tokens: 32              # generation length limit

Without `labels`, a classification task's classes are its distinct labels (sorted) and each
verbalizer is the label itself. Errors name the file, the line and the field (`InputError`).
"""

from __future__ import annotations

import csv
import io
import json
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from gptforge.atomic import file_sha256
from gptforge.errors import InputError, MissingInputError
from gptforge.eval import tasks_zh

TASK_TYPES = ("multiple_choice", "classification", "generation", "cloze", "perplexity")

FORMAT_TYPE = {"mc": "multiple_choice", "hellaswag": "multiple_choice", "arc": "multiple_choice",
               "mmlu": "multiple_choice", "cmmlu": "multiple_choice", "ceval": "multiple_choice", "piqa": "multiple_choice", "winogrande": "multiple_choice",
               "classification": "classification", "generation": "generation", "gsm8k": "generation", "cloze": "cloze",
               "perplexity": "perplexity"}

FORMAT_FIELDS = {"mc": ("context", "choices", "label"),
                 "hellaswag": ("ctx_a", "ctx_b", "endings", "label", "activity_label"),
                 "arc": ("question", "answerKey"), "cmmlu": tuple(tasks_zh.HEADERS["cmmlu"]),
                 "ceval": (*tasks_zh.HEADERS["ceval"], "answer"), "piqa": ("goal", "sol1", "sol2", "label"),
                 "winogrande": ("sentence", "option1", "option2", "answer"),
                 "classification": ("text", "label"), "generation": ("prompt", "answer"), "gsm8k": ("question", "answer"),
                 "cloze": ("text",),
                 "perplexity": ("text",)}

YAML_KEYS = ("name", "data", "type", "prompt", "labels", "target_delimiter", "fewshot_data", "description",
             "stop", "max_new_tokens")


@dataclass
class Example:
    """One evaluation example, as strings; the scorer encodes them.

    contexts: one context shared by all continuations, or one per continuation (WinoGrande).
    continuations: scored text after the context, the target delimiter included (choice-based
        types and cloze; empty for generation).
    choice_lengths: len(choice) in characters, the acc_norm divisor (lm-eval's convention).
    label: index of the gold continuation (choice-based types), else None.
    answers: reference answers (generation); the gold word (cloze).
    demo: this example solved, as a few-shot demonstration (context + delimiter + gold).
    line: 1-based line (row) of the task file, for messages and result listings.
    question, choices: the question and its answer options as plain text (no prompt wording, no
        delimiter), what `gptforge.eval.chat` renders as a chat turn; "" and [] when not set.
    """

    contexts: list[str]
    continuations: list[str]
    choice_lengths: list[int]
    label: int | None
    answers: list[str]
    demo: str
    line: int
    question: str = ""
    choices: list[str] = field(default_factory=list)


@dataclass
class Task:
    """A loaded task: its examples, its few-shot pool and how to score it."""

    name: str
    type: str
    format: str
    path: Path
    sha256: str
    examples: list[Example]
    fewshot_pool: list[Example] | None = None
    """Few-shot examples from a separate file (`fewshot_data`, MMLU's dev file); None: the other rows."""
    labels: list[str] = field(default_factory=list)
    """Classification: the class names, in the order of each example's continuations."""
    description: str = ""
    fewshot_sampler: str = "random"
    """"random" (seeded draw) or "first_n" (the pool's first k rows in order, MMLU's dev file as lm-eval)."""
    fewshot_delimiter: str = "\n\n"
    stop: list[str] = field(default_factory=lambda: ["\n\n"])
    max_new_tokens: int = 32

    @property
    def chance(self) -> float:
        """Accuracy of a uniform random guess (the CORE baseline): mean 1/n_choices; 0 for generation/cloze."""
        if self.type in ("multiple_choice", "classification"):
            return sum(1.0 / len(e.continuations) for e in self.examples) / max(1, len(self.examples))
        return 0.0




def _err(path: Path, line: int | None, msg: str) -> InputError:
    where = f"{path}" + (f", line {line}" if line is not None else "")
    return InputError(f"{where}: {msg}")


def _decode_lines(path: Path) -> list[tuple[int, str]]:
    """(line number, text) of each non-blank line; non-UTF-8 bytes are an error naming the line."""
    out = []
    for i, raw in enumerate(path.read_bytes().split(b"\n"), start=1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as e:
            raise _err(path, i, f"not UTF-8 text (byte {e.start} of the line); re-encode the file as UTF-8") from None
        if text.strip():
            out.append((i, text))
    return out


def read_rows(path: Path) -> list[tuple[int, Any]]:
    """(line, row) of a .jsonl (one JSON object per line) or .csv (lists of cells) file."""
    lines = _decode_lines(path)
    if path.suffix.lower() == ".csv":
        text = "\n".join(t for _, t in lines)
        nums = [n for n, _ in lines]
        reader = csv.reader(io.StringIO(text))
        rows: list[tuple[int, Any]] = []
        for cells in reader:
            rows.append((nums[min(reader.line_num, len(nums)) - 1], cells))
        return rows
    rows = []
    for n, t in lines:
        try:
            row = json.loads(t)
        except json.JSONDecodeError as e:
            raise _err(path, n, f"not valid JSON ({e.msg.removesuffix(' at')} at column {e.colno}); a task file has one JSON object "
                                "per line") from None
        if not isinstance(row, dict):
            raise _err(path, n, f"expected a JSON object, got {type(row).__name__}")
        rows.append((n, row))
    return rows


def detect_format(row: Any) -> str | None:
    """The format of one row (see the module table), or None when it matches none."""
    if isinstance(row, list):
        return "mmlu"
    keys = set(row)
    if "ctx_a" in keys or "endings" in keys:
        return "hellaswag"
    if isinstance(row.get("question"), dict) or "answerKey" in keys:
        return "arc"
    if isinstance(row.get("question"), str) and "answer" in keys and "choices" not in keys:
        return "gsm8k"
    if "option1" in keys or "option2" in keys:
        return "winogrande"
    if "sol1" in keys or "goal" in keys:
        return "piqa"
    if "choices" in keys or "context" in keys:
        return "mc"
    if "prompt" in keys or "answer" in keys or "answers" in keys:
        return "generation"
    if "text" in keys and "label" in keys:
        return "classification"
    if "text" in keys:
        return "cloze"
    return None


def _get(path: Path, line: int, row: dict, key: str, kind: type | tuple = str):
    if key not in row:
        raise _err(path, line, f"missing field {key!r}")
    v = row[key]
    if not isinstance(v, kind) or isinstance(v, bool) and kind is not bool:
        want = kind.__name__ if isinstance(kind, type) else " or ".join(k.__name__ for k in kind)
        raise _err(path, line, f"field {key!r} should be {want}, got {type(v).__name__}")
    return v


def _choices(path: Path, line: int, key: str, choices) -> list[str]:
    if not isinstance(choices, list) or not choices:
        raise _err(path, line, f"field {key!r} must be a non-empty list of strings")
    for c in choices:
        if not isinstance(c, str):
            raise _err(path, line, f"field {key!r}: every choice must be a string, got {type(c).__name__}")
    return choices


def _label_index(path: Path, line: int, key: str, label, choices: list[str]) -> int:
    """A gold label given as an index (int or digit string) or as the choice's text."""
    if isinstance(label, bool):
        raise _err(path, line, f"field {key!r} must be an index or a choice, got {label!r}")
    if isinstance(label, str) and label.strip().lstrip("-").isdigit() and label not in choices:
        label = int(label)
    if isinstance(label, int):
        if not 0 <= label < len(choices):
            raise _err(path, line, f"field {key!r} = {label} is outside the {len(choices)} choices (0-{len(choices) - 1})")
        return label
    if isinstance(label, str) and label in choices:
        return choices.index(label)
    raise _err(path, line, f"field {key!r} = {label!r} is not one of the choices")


def _hellaswag_clean(text: str) -> str:
    """lm-eval's hellaswag `preprocess`: strip, ' [title]' -> '. ', drop [tags], '  ' -> ' '."""
    text = text.strip().replace(" [title]", ". ")
    text = re.sub(r"\[.*?\]", "", text)
    return text.replace("  ", " ")


def _mc(contexts: list[str], choices: list[str], label: int, delim: str, line: int,
        shared_continuation: str | None = None, question: str = "", options: list[str] | None = None) -> Example:
    """A multiple-choice Example; `question` and `options` (default `choices`) are its plain text."""
    options = list(choices if options is None else options)
    if shared_continuation is not None:  # WinoGrande: the options are in the contexts
        conts = [delim + shared_continuation] * len(contexts)
        return Example(contexts, conts, [len(shared_continuation)] * len(contexts), label, [],
                       contexts[label] + conts[label], line, question, options)
    conts = [delim + c for c in choices]
    return Example(contexts, conts, [len(c) for c in choices], label, [], contexts[0] + conts[label], line,
                   question or contexts[0], options)


def _format_prompt(path: Path, line: int, template: str, row: dict) -> str:
    try:
        return template.format(**row)
    except KeyError as e:
        raise _err(path, line, f"the prompt template names field {e.args[0]!r}, which this row lacks") from None
    except (IndexError, ValueError) as e:
        raise _err(path, line, f"the prompt template {template!r} cannot be filled ({e})") from None


@dataclass
class _Row:
    """One task-file row being turned into an Example, with what every format's reader needs."""

    path: Path
    line: int
    row: Any
    delim: str
    prompt: str | None
    labels: list[str]
    verbal: list[str]

    def get(self, key: str, types=str):
        return _get(self.path, self.line, self.row, key, types)

    def err(self, message: str) -> InputError:
        return _err(self.path, self.line, message)

    def label(self, choices: list[str]) -> int:
        return _label_index(self.path, self.line, "label", self.get("label", (int, str)), choices)

    def context(self, default: str) -> str:
        return _format_prompt(self.path, self.line, self.prompt, self.row) if self.prompt else default


def _mmlu_example(r: _Row) -> Example:
    if len(r.row) != 6:
        raise r.err(f"an MMLU row has 6 columns (question, A, B, C, D, answer), got {len(r.row)}")
    q, *choices, ans = r.row
    if ans.strip() not in "ABCD" or not ans.strip():
        raise r.err(f"column 6 (answer) = {ans!r}; expected A, B, C or D")
    ctx = (q.strip() + "\n" + "".join(f"{k}. {c}\n" for k, c in zip("ABCD", choices, strict=True)) + "Answer:")
    return _mc([ctx], list("ABCD"), "ABCD".index(ans.strip()), r.delim, r.line, question=q.strip(), options=choices)


def _mc_example(r: _Row) -> Example:
    ctx = r.get("context")
    choices = _choices(r.path, r.line, "choices", r.get("choices", list))
    return _mc([r.context(ctx)], choices, r.label(choices), r.delim, r.line, question=ctx)


def _hellaswag_example(r: _Row) -> Example:
    for k in ("ctx_a", "ctx_b", "activity_label"):
        r.get(k)
    endings = _choices(r.path, r.line, "endings", r.get("endings", list))
    label = r.label(endings)
    row = r.row
    ctx = _hellaswag_clean(row["activity_label"] + ": " + row["ctx_a"] + " " + row["ctx_b"].capitalize())
    return _mc([ctx], [_hellaswag_clean(e) for e in endings], label, r.delim, r.line, question=ctx)


def _arc_example(r: _Row) -> Example:
    q = r.get("question", dict)
    stem = q.get("stem")
    if not isinstance(stem, str):
        raise r.err("missing field 'question.stem'")
    items = q.get("choices")
    if not isinstance(items, list) or not items:
        raise r.err("field 'question.choices' must be a non-empty list of {text, label}")
    for i, c in enumerate(items):
        if not isinstance(c, dict) or not isinstance(c.get("text"), str) or "label" not in c:
            raise r.err(f"field 'question.choices[{i}]' needs a string 'text' and a 'label'")
    keys = [str(c["label"]) for c in items]
    ans = str(r.get("answerKey", (str, int)))
    if ans not in keys:
        raise r.err(f"field 'answerKey' = {ans!r} is not one of the choice labels {keys}")
    return _mc([f"Question: {stem}\nAnswer:"], [c["text"] for c in items], keys.index(ans), r.delim, r.line, question=stem)


def _piqa_example(r: _Row) -> Example:
    goal = r.get("goal")
    choices = [r.get("sol1"), r.get("sol2")]
    return _mc([f"Question: {goal}\nAnswer:"], choices, r.label(choices), r.delim, r.line, question=goal)


def _winogrande_example(r: _Row) -> Example:
    sentence = r.get("sentence")
    options = [r.get("option1"), r.get("option2")]
    ans = str(r.get("answer", (str, int)))
    if ans not in ("1", "2"):
        raise r.err(f"field 'answer' = {ans!r}; expected \"1\" or \"2\"")
    if sentence.count("_") != 1:
        raise r.err("field 'sentence' must hold exactly one '_' (the blank)")
    cut = sentence.index("_")
    contexts = [sentence[:cut] + o for o in options]
    return _mc(contexts, options, int(ans) - 1, r.delim, r.line, shared_continuation=sentence[cut + 1:].strip(),
               question=sentence)


def _classification_example(r: _Row) -> Example:
    text = r.get("text")
    label = r.get("label", (str, int))
    if str(label) not in r.labels:
        raise r.err(f"field 'label' = {label!r} is not one of the task's labels {r.labels}")
    ctx = r.context(text)
    conts = [r.delim + v for v in r.verbal]
    gold = r.labels.index(str(label))
    return Example([ctx], conts, [len(v) for v in r.verbal], gold, [], ctx + conts[gold], r.line, ctx, list(r.verbal))


def _generation_example(r: _Row) -> Example:
    p = r.get("prompt")
    if "answer" not in r.row and "answers" not in r.row:
        raise r.err("a generation row needs 'answer' (the reference answer, a string or a list of strings)")
    key = "answer" if "answer" in r.row else "answers"
    ans = r.get(key, (str, list))
    answers = [ans] if isinstance(ans, str) else _choices(r.path, r.line, key, ans)
    if not any(a.strip() for a in answers):
        raise r.err(f"field {key!r} is empty: a generation row needs its reference answer")
    ctx = r.context(p)
    return Example([ctx], [], [], None, answers, ctx + r.delim + answers[0], r.line, ctx)


def _gsm8k_example(r: _Row) -> Example:
    """GSM8K (Cobbe et al. 2021): lm-eval's `Question: {question}\nAnswer:`, the full worked
    solution as the demonstration, its `#### N` final answer as the reference."""
    q, ans = r.get("question"), r.get("answer")
    if "####" not in ans:
        raise r.err("field 'answer' has no '#### N' final answer (GSM8K's format); for a bare answer use "
                    "{\"prompt\", \"answer\"} rows")
    ctx = r.context(f"Question: {q}\nAnswer:")
    return Example([ctx], [], [], None, [ans], ctx + r.delim + ans, r.line, q)


def _perplexity_example(r: _Row) -> Example:
    text = r.get("text")
    if not text:
        raise r.err("field 'text' is empty")
    return Example([], [], [], None, [text], text, r.line)


def _cloze_example(r: _Row) -> Example:
    text = r.get("text").rstrip()
    if " " not in text:
        raise r.err("field 'text' needs at least two words (the last one is predicted)")
    ctx, word = text.rsplit(" ", 1)
    # LAMBADA in lm-eval: the target carries its own space, the delimiter is empty.
    return Example([ctx], [" " + word], [len(word)], 0, [word], text, r.line)


_EXAMPLE_READERS = {"mmlu": _mmlu_example, "mc": _mc_example, "hellaswag": _hellaswag_example, "arc": _arc_example,
                    "piqa": _piqa_example, "winogrande": _winogrande_example,
                    "classification": _classification_example, "generation": _generation_example, "gsm8k": _gsm8k_example,
                    "perplexity": _perplexity_example, "cloze": _cloze_example}


def rows_to_examples(path: Path, rows: list[tuple[int, Any]], fmt: str, opts: dict) -> list[Example]:
    """Examples of `rows`, all in format `fmt`; `opts` are the YAML settings (see the module doc).

    Raises:
        InputError: a row in another format, a missing or mistyped field, a label outside the
            choices, an empty choice list; the message names the file, line and field.
    """
    delim = opts.get("target_delimiter", " ")
    prompt = opts.get("prompt")
    labels: list[str] = opts.get("_labels", [])
    verbal: list[str] = opts.get("_verbalizers", [])
    out = []
    for line, row in rows:
        got = detect_format(row)
        if fmt == "perplexity" and got == "cloze":
            got = "perplexity"
        if got != fmt:
            if got is None:
                raise _err(path, line, f"row matches no task format; expected the fields {list(FORMAT_FIELDS[fmt])} "
                                       f"of the {fmt!r} format of the first row")
            raise _err(path, line, f"mixed formats: this row is {got!r} but the first row is {fmt!r}; "
                                   "one task file holds one format")
        reader = _EXAMPLE_READERS.get(fmt)
        if reader is None:  # CMMLU / C-Eval rows are read from their csv header (`_read_examples`)
            raise _err(path, line, f"the {fmt!r} format is read from a csv file with its header row; "
                                   "write the task as csv")
        out.append(reader(_Row(path, line, row, delim, prompt, labels, verbal)))
    return out


def _labels_of(path: Path, rows, opts: dict) -> tuple[list[str], list[str]]:
    spec = opts.get("labels")
    if spec is None:
        found = sorted({str(r["label"]) for _, r in rows if isinstance(r, dict) and "label" in r})
        return found, found
    if isinstance(spec, list):
        return [str(x) for x in spec], [str(x) for x in spec]
    if isinstance(spec, dict) and spec:
        return [str(k) for k in spec], [str(v) for v in spec.values()]
    raise _err(path, None, "'labels' must be a list of labels or a mapping label -> verbalizer")


def _missing_task_file(path: Path) -> None:
    """Raise MissingInputError for a task path that is not a file: a folder, or nothing."""
    if path.is_dir():
        raise MissingInputError(f"task file {path} is a folder, not a file: name the .jsonl, .csv or .yaml task "
                                "files in it")
    raise MissingInputError(f"task file {path} does not exist")


def _read_examples(path: Path, opts: dict, want_type: str | None) -> tuple[str, list[Example]]:
    if not path.is_file():
        _missing_task_file(path)
    rows = read_rows(path)
    if not rows:
        raise _err(path, None, "the task file has no rows")
    fmt = tasks_zh.header_format(rows[0][1]) if isinstance(rows[0][1], list) else None
    if fmt is not None:  # CMMLU / C-Eval: a header names the columns
        rows = tasks_zh.header_rows(path, rows, fmt)
        if not rows:
            raise _err(path, None, "the task file has a header but no rows")
        if want_type is not None and want_type != "multiple_choice":
            raise _err(path, None, f"type: {want_type} but the rows are in the {fmt!r} format (multiple_choice)")
        delim = opts.get("target_delimiter", " ")
        q_key = "Question" if fmt == "cmmlu" else "question"
        return fmt, [_mc([ctx], list("ABCD"), gold, delim, line, question=row[q_key].strip(),
                         options=[row[k] for k in "ABCD"])
                     for line, row in rows for ctx, gold in [tasks_zh.question_and_answer(path, line, row, fmt)]]
    fmt = detect_format(rows[0][1])
    if fmt is None:
        raise _err(path, rows[0][0], f"row matches no task format; fields found {sorted(rows[0][1])} "
                                     "(see `gptforge evaluate --help` for the formats)")
    if want_type in ("classification", "perplexity") and fmt == "cloze":
        fmt = want_type
    if want_type is not None and FORMAT_TYPE[fmt] != want_type:
        raise _err(path, rows[0][0], f"type: {want_type} but the rows are in the {fmt!r} format "
                                     f"({FORMAT_TYPE[fmt]})")
    if fmt == "classification" and "_labels" not in opts:
        opts["_labels"], opts["_verbalizers"] = _labels_of(path, rows, opts)
    return fmt, rows_to_examples(path, rows, fmt, opts)


def load_task(path: str | Path) -> Task:
    """Load a task file (.jsonl, .json lines, .csv) or a YAML task definition.

    Raises:
        MissingInputError: the file (or the data file it names) does not exist.
        InputError: a malformed file (see `rows_to_examples`), an unknown YAML key or type.
    """
    path = Path(path)
    if not path.is_file():
        _missing_task_file(path)
    opts: dict = {}
    data = path
    if path.suffix.lower() in (".yaml", ".yml"):
        import yaml

        try:
            opts = yaml.safe_load(path.read_text(encoding="utf-8")) or {}
        except (yaml.YAMLError, UnicodeDecodeError) as e:
            raise _err(path, None, f"not a readable YAML task definition ({e})") from None
        if not isinstance(opts, dict):
            raise _err(path, None, "a task definition is a YAML mapping (name, data, type, ...)")
        unknown = [k for k in opts if k not in YAML_KEYS]
        if unknown:
            import difflib

            close = difflib.get_close_matches(unknown[0], YAML_KEYS, n=1)
            hint = f" (did you mean {close[0]!r}?)" if close else ""
            raise _err(path, None, f"unknown key {unknown[0]!r}{hint}; known keys: {', '.join(YAML_KEYS)}")
        if "data" not in opts:
            raise _err(path, None, "missing key 'data' (the task's rows, a path relative to this file)")
        if opts.get("type") is not None and opts["type"] not in TASK_TYPES:
            raise _err(path, None, f"type {opts['type']!r} is not one of {', '.join(TASK_TYPES)}")
        data = (path.parent / str(opts["data"])).resolve()
    fmt, examples = _read_examples(data, opts, opts.get("type"))
    name = str(opts.get("name") or path.stem)
    desc = opts.get("description", "")
    pool = None
    sampler = "random"
    fewshot = opts.get("fewshot_data")
    if fewshot is not None:
        _, pool = _read_examples((path.parent / str(fewshot)).resolve(), opts, FORMAT_TYPE[fmt])
    if fmt == "mmlu":
        subject = re.sub(r"_(test|dev|val|validation|train)$", "", data.stem)
        if not desc:
            desc = f"The following are multiple choice questions (with answers) about {subject.replace('_', ' ')}.\n\n"
        # MMLU's published layout: data/test/X_test.csv with its 5 dev questions in data/dev/X_dev.csv.
        dev = data.parent.parent / "dev" / f"{subject}_dev.csv"
        if pool is None and dev.is_file() and dev.resolve() != data.resolve():
            _, pool = _read_examples(dev, opts, "multiple_choice")
            sampler = "first_n"
    elif fmt in ("cmmlu", "ceval"):
        desc = desc or tasks_zh.description(data, fmt)
        dev = tasks_zh.dev_file(data, fmt)
        if pool is None and dev.is_file() and dev.resolve() != data.resolve():
            _, pool = _read_examples(dev, opts, "multiple_choice")
            sampler = "first_n"
    task = Task(name=name, type=FORMAT_TYPE[fmt], format=fmt, path=path, sha256=file_sha256(data), examples=examples,
                fewshot_pool=pool, labels=opts.get("_labels", []), description=str(desc), fewshot_sampler=sampler)
    if fmt == "gsm8k":  # lm-eval's gsm8k: until "Question:", 256 new tokens
        task.stop, task.max_new_tokens = ["Question:"], 256
    if "stop" in opts:
        stop = opts["stop"]
        task.stop = [stop] if isinstance(stop, str) else [str(s) for s in stop]
    if "max_new_tokens" in opts:
        task.max_new_tokens = int(opts["max_new_tokens"])
    return task

"""Final answers in generated text: extraction, normalisation and comparison.

One module for every scorer that checks a generated answer against a reference: `gptforge evaluate
--chat` on generation tasks and the verifiable rewards of `gptforge rl` extract and compare the same
way, so a model's held-out score and its training reward agree.

Where the answer is, in order of precedence (the first marker found wins, its last occurrence):
1. after `####` (GSM8K's reference format, Cobbe et al. 2021, and what models trained on it emit);
2. after `答案：` / `答案:` / `答案是` (Chinese), or `Answer:` / `The answer is` (English, any case);
3. otherwise the last number in the text (nanochat's and lm-eval's "flexible extract" fallback).
A marker's answer is the rest of its line, up to the first blank or sentence end for a number.

Normalisation (`normalize_answer`): Unicode NFKC (full-width digits and colons become ASCII), case
folded, surrounding whitespace, `$`, `**`, trailing sentence punctuation (`.`, `。`, `!`) and a
LaTeX `\\boxed{...}` removed; a number loses its thousands separators (`1,234` -> `1234`), a leading
`+`, and trailing zeros after the point (`3.50` -> `3.5`, `4.0` -> `4`), so `72`, `72.0` and `$72`
compare equal.
"""

from __future__ import annotations

import re
import unicodedata
from decimal import Decimal, InvalidOperation

_NUMBER = r"[-+]?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?"
_NUMBER_RE = re.compile(_NUMBER)
_MARKERS = (
    re.compile(r"####"),
    re.compile(r"答案\s*(?:是|为|:)"),
    re.compile(r"(?:\bthe\s+)?(?:final\s+)?answer\s*(?:is\s*:?|:)", re.IGNORECASE),
)
_BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


def extract_answer(text: str) -> str | None:
    """The final answer stated in `text`, normalised (`normalize_answer`), or None when there is
    none (no marker with anything after it, and no number anywhere).

    Args:
        text: a model's completion (or a reference solution such as GSM8K's `... #### 72`).

    Returns: e.g. "72" for "... so she has 72 apples. #### 72", "3.5" for "答案：3.50元".
    """
    text = unicodedata.normalize("NFKC", text)
    boxed = _BOXED.findall(text)
    if boxed:
        return normalize_answer(boxed[-1]) or None
    for marker in _MARKERS:
        found = list(marker.finditer(text))
        if not found:
            continue
        rest = text[found[-1].end():].strip().split("\n", 1)[0].strip()
        if not rest:
            continue
        number = _NUMBER_RE.match(rest.lstrip("$ "))
        if number is not None:
            return normalize_answer(number.group(0))
        answer = normalize_answer(rest)
        if answer:
            return answer
    numbers = _NUMBER_RE.findall(text)
    return normalize_answer(numbers[-1]) if numbers else None


def normalize_answer(answer: str) -> str:
    """`answer` in the canonical form that `answers_match` compares (see the module docstring)."""
    s = unicodedata.normalize("NFKC", answer).strip()
    boxed = _BOXED.fullmatch(s)
    if boxed:
        s = boxed.group(1).strip()
    s = s.strip("*").strip().strip("$").strip()
    s = s.rstrip(".。!！").strip()
    number = canonical_number(s)
    return number if number is not None else s.casefold()


def canonical_number(s: str) -> str | None:
    """`s` as a canonical decimal string when all of it is one number (thousands separators,
    a leading `+` and trailing fractional zeros dropped; `-0` is `0`), else None."""
    if not re.fullmatch(_NUMBER, s):
        return None
    try:
        value = Decimal(s.replace(",", "").lstrip("+"))
    except InvalidOperation:  # pragma: no cover - the pattern admits only valid decimals
        return None
    if value == 0:
        return "0"
    text = format(value.normalize(), "f")
    return text


def answers_match(predicted: str | None, reference: str) -> bool:
    """Whether a predicted answer (from `extract_answer`, None when nothing was found) equals the
    reference answer after both are normalised. A reference in GSM8K's form (`... #### 72`) is
    reduced to its final answer first."""
    if predicted is None:
        return False
    gold = reference_answer(reference)
    return gold is not None and normalize_answer(predicted) == gold


def reference_answer(reference: str) -> str | None:
    """The normalised answer of a reference: the part after GSM8K's `####` when present, else the
    whole string normalised (a bare `72`, `答案：72`, or a word such as `Paris`). None when empty."""
    text = unicodedata.normalize("NFKC", str(reference))
    if "####" in text:
        return extract_answer(text)
    answer = normalize_answer(text)
    if "\n" in text or any(m.search(text) for m in _MARKERS[1:]):
        return extract_answer(text) or answer or None
    return answer or None


def reply_answer(text: str) -> str | None:
    """The answer a chat reply gives: `extract_answer(text)` when it finds one (a marker or a
    number), else the whole reply normalised when it is one line (a bare word answer such as
    "Paris" or "red"), else None. `gptforge evaluate --chat` checks generated replies with it."""
    found = extract_answer(text)
    if found is not None:
        return found
    line = text.strip()
    return (normalize_answer(line) or None) if line and "\n" not in line else None

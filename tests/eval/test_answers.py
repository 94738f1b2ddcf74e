"""Answer extraction and comparison (gptforge.eval.answers): one table of cases, English and Chinese."""

import pytest

from gptforge.eval.answers import answers_match, canonical_number, extract_answer, normalize_answer, reference_answer

EXTRACT_CASES = [
    # GSM8K's marker wins over numbers after it and before it.
    ("Natalia sold 48/2 = 24 clips in May.\n#### 72", "72"),
    ("#### 1,234\nThat is all, 5 more words", "1234"),
    ("First 3 then #### 7 and later #### 8", "8"),
    ("#### -12", "-12"),
    ("#### $18.00", "18"),
    # English markers, any case.
    ("So the answer is 42.", "42"),
    ("The final answer is: 3.50", "3.5"),
    ("Answer: Paris.", "paris"),
    ("ANSWER: 1,000,000 dollars", "1000000"),
    ("I think x = 5. Answer: +5", "5"),
    # Chinese markers, full-width colon and digits.
    ("小明有 3 个苹果，又买了 4 个。答案：7", "7"),
    ("答案：3.50元", "3.5"),
    ("所以答案是 12 个", "12"),
    ("答案为１２０", "120"),
    ("答案: 北京。", "北京"),
    # \boxed{} (LaTeX solutions) takes precedence.
    ("so \\boxed{17} is it, not 18", "17"),
    # The last number when nothing is marked.
    ("She had 5 apples and ate 2, leaving 3.", "3"),
    ("大约有 3 个苹果，共 15 元", "15"),
    ("72.0", "72"),
    ("-0.0", "0"),
    # Nothing to find.
    ("no digits here at all", None),
    ("Answer:", None),
    ("", None),
]


@pytest.mark.parametrize("text, expected", EXTRACT_CASES)
def test_extract_answer(text, expected):
    assert extract_answer(text) == expected


@pytest.mark.parametrize("predicted, reference, ok", [
    ("72", "#### 72", True),
    ("72.0", "72", True),
    ("1234", "1,234", True),
    ("$1,234", "1234", True),
    ("73", "#### 72", False),
    ("Paris", "paris", True),
    ("Paris", "London", False),
    (None, "72", False),
    ("7", "答案：7", True),
    ("7", "小明算了一下。\n答案：7", True),
    ("0.5", "1/2", False),  # fractions are compared as written, not evaluated
])
def test_answers_match(predicted, reference, ok):
    assert answers_match(predicted, reference) is ok


def test_normalize_and_canonical_number():
    assert normalize_answer("  **42**  ") == "42"
    assert normalize_answer("\\boxed{ 3.10 }") == "3.1"
    assert normalize_answer("Yes!") == "yes"
    assert canonical_number("1,234.500") == "1234.5"
    assert canonical_number("100") == "100"  # not 1E+2
    assert canonical_number("12,34") is None  # not a thousands grouping
    assert canonical_number("abc") is None
    assert reference_answer("   ") is None

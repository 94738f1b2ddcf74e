"""Document quality filters with the published default thresholds (each one overridable).

Every filter is a small dataclass whose fields are its thresholds, with a `name` and a
`__call__(doc) -> doc | reason`: it returns the document (possibly with lines removed) to keep
it, or a short drop-reason string. Extra per-filter counts (e.g. lines removed) go in `counts`.

Sources:
- Gopher: Rae et al. 2021, "Scaling Language Models: Methods, Analysis & Insights from Training
  Gopher", Appendix A.1.1 (quality filters) and Table A1 (repetition thresholds).
- C4: Raffel et al. 2020, "Exploring the Limits of Transfer Learning with a Unified Text-to-Text
  Transformer", section 2.2 (line and page rules).
- FineWeb: Penedo et al. 2024, "The FineWeb Datasets", section 3.5 "Additional (custom)
  heuristic filters".

Word counts use `text_stats.words`, which counts each Chinese/Japanese character as a word, so
these filters do not drop all CJK text; rules that only make sense for space-separated languages
(mean word length, and whitespace-word stop words) are skipped for CJK-dominant documents.

Each filter's `language` field ("en" by default) names the table of `gptforge.data.languages`
whose sentence ends, terminal punctuation and stop-word unit it uses; a recipe gives each
document the thresholds of its own language (`RuleFilter.__call__`).
"""

from __future__ import annotations

import dataclasses
import re
from collections import Counter
from dataclasses import dataclass, field, replace

from gptforge.data.languages import (
    count_sentences,
    count_stop_words,
    load_language,
    options_in_force,
    table_language,
)
from gptforge.data.readers import Document
from gptforge.data.text_stats import is_cjk, tokens, words

BULLETS = ("•", "●", "○", "◦", "▪", "▫", "‣", "⁃", "-", "*", "–", "—", "·")
ELLIPSES = ("...", "…")
TERMINAL_PUNCT = (".", "!", "?", '"', "'", "”", "’", "。", "！", "？", "」", "』")


class RuleFilter:
    """A `DocumentStep` whose `check(text)` names the first rule a document breaks (the reason it
    is dropped for) or gives None (kept as it is), with each document's language's thresholds.

    A filter's `language` (a table of `gptforge.data.languages`) is the language of the
    thresholds it holds. A document labelled with another language that has a table
    (`Document.language`, set by the langid step) is judged by a sibling filter of that language
    (`for_language`): that language's table, then `recipe_options` (the options the recipe gave,
    which apply to every language; without them, the fields that differ from this filter's own
    table). Counts go to this filter's `counts`, plus "removed LANG" per document dropped.
    """
    # each subclass's dataclass fields, for mypy
    name: str
    language: str
    counts: Counter
    line_examples: dict
    recipe_options: dict | None = None

    def check(self, text: str) -> str | None:
        raise NotImplementedError(f"{type(self).__name__}.check")

    def decide(self, doc: Document) -> Document | str:
        """The document kept (possibly changed), or the drop reason, by this filter's own thresholds."""
        return self.check(doc.text) or doc

    def _explicit_options(self) -> dict:
        if self.recipe_options is not None:
            return dict(self.recipe_options)
        base = type(self)(**options_in_force(self.name, {}, self.language))
        return {f.name: getattr(self, f.name) for f in dataclasses.fields(self)  # type: ignore[arg-type]  # a dataclass
                if f.init and f.name not in ("name", "counts", "line_examples", "language")
                and getattr(self, f.name) != getattr(base, f.name)}

    def for_language(self, language: str) -> RuleFilter:
        """The filter judging documents of table `language` (this one for its own language)."""
        if language == self.language:
            return self
        siblings = self.__dict__.setdefault("_siblings", {})
        if language not in siblings:
            opts = self._explicit_options()
            sib = type(self)(**options_in_force(self.name, opts, language))
            sib.recipe_options = opts
            siblings[language] = sib
        return siblings[language]

    def __call__(self, doc: Document) -> Document | str:
        lang = table_language(doc.language, self.language)
        f = self.for_language(lang)
        out = f.decide(doc)
        if f is not self:
            self.counts.update(f.counts)
            f.counts.clear()
            theirs = getattr(f, "line_examples", None)
            if theirs:
                for reason, lines in theirs.items():
                    mine = self.line_examples.setdefault(reason, [])
                    mine.extend(lines[:max(0, 3 - len(mine))])
                theirs.clear()
        if isinstance(out, str):
            self.counts[f"removed {lang}"] += 1
        return out


# --------------------------------------------------------------------------------------------
# Hard-wrapped text: judge paragraphs, not lines
# --------------------------------------------------------------------------------------------

#: a text is hard-wrapped when the 90th percentile of its line lengths lies in this range ...
WRAP_WIDTH_RANGE = (40, 120)
#: ... at least this share of its non-empty lines fills 60% or more of that width ...
WRAP_FULL_LINE_SHARE = 0.5
#: ... and at least this share of the lines inside paragraphs (all but each one's last) end
#: without terminal punctuation (they break mid-sentence). Needs this many non-empty lines.
WRAP_OPEN_LINE_SHARE = 0.5
WRAP_MIN_LINES = 8


def hard_wrapped(text: str) -> bool:
    """Whether `text` is prose broken into lines at a fixed width (books, e-mails, RFCs).

    C4's and FineWeb's line rules were written for web text, where a line is a paragraph;
    applied to a book wrapped at 70 columns they remove every line but the last of each
    paragraph. Wrapped: enough non-empty lines (`WRAP_MIN_LINES`), a 90th-percentile line
    length inside `WRAP_WIDTH_RANGE`, most lines near that width (`WRAP_FULL_LINE_SHARE`), and
    most lines inside a paragraph ending mid-sentence (`WRAP_OPEN_LINE_SHARE`). A web page's
    menu lines are short and uneven, and its paragraphs are single lines, so it is not wrapped.
    """
    lines = [ln.rstrip() for ln in text.split("\n")]
    lengths = sorted(len(ln) for ln in lines if ln.strip())
    if len(lengths) < WRAP_MIN_LINES:
        return False
    width = lengths[int(0.9 * (len(lengths) - 1))]
    if not WRAP_WIDTH_RANGE[0] <= width <= WRAP_WIDTH_RANGE[1]:
        return False
    if sum(n >= 0.6 * width for n in lengths) / len(lengths) < WRAP_FULL_LINE_SHARE:
        return False
    inner = [ln for ln, nxt in zip(lines, lines[1:], strict=False) if ln.strip() and nxt.strip()]
    if not inner:
        return False
    open_lines = sum(not ln.strip().endswith(TERMINAL_PUNCT) for ln in inner)
    return open_lines / len(inner) >= WRAP_OPEN_LINE_SHARE


def text_units(text: str) -> list[list[str]]:
    """The units line-level rules judge: paragraphs of a hard-wrapped text, else single lines.

    Each unit is a list of the text's own non-empty lines (a paragraph: consecutive non-empty
    lines). Judge `" ".join(unit)`; keep the unit's lines to keep the text's line breaks.
    """
    lines = text.split("\n")
    if not hard_wrapped(text):
        return [[ln] for ln in lines if ln.strip()]
    units: list[list[str]] = []
    cur: list[str] = []
    for ln in lines:
        if ln.strip():
            cur.append(ln)
        elif cur:
            units.append(cur)
            cur = []
    if cur:
        units.append(cur)
    return units


def _joined_units(text: str) -> list[str]:
    return [" ".join(ln.strip() for ln in u) for u in text_units(text)]


# --------------------------------------------------------------------------------------------
# Gopher quality
# --------------------------------------------------------------------------------------------


@dataclass
class GopherQuality(RuleFilter):
    """Gopher's quality rules (Rae et al. 2021, Appendix A.1.1).

    A document is dropped when it has fewer than `min_words` (50) or more than `max_words`
    (100,000) words; a mean word length outside [3, 10] characters; a hash-or-ellipsis to word
    ratio above 0.1; more than 90% of lines starting with a bullet; more than 30% of lines
    ending with an ellipsis; fewer than 80% of words holding an alphabetic character; or fewer
    than 2 of the stop words "the, be, to, of, and, that, have, with". With a `language` whose
    words are characters (zh, ja) the stop words are counted as characters
    (`languages.count_stop_words`); with a whitespace-word language the stop-word rule is
    skipped for CJK-dominant text, as before.
    """

    min_words: int = 50
    max_words: int = 100_000
    min_mean_word_length: float = 3.0
    max_mean_word_length: float = 10.0
    max_symbol_word_ratio: float = 0.1
    max_bullet_lines_ratio: float = 0.9
    max_ellipsis_lines_ratio: float = 0.3
    min_alpha_words_ratio: float = 0.8
    min_stop_words: int = 2
    stop_words: tuple[str, ...] = ("the", "be", "to", "of", "and", "that", "have", "with")
    language: str = "en"
    name: str = "gopher_quality"
    counts: Counter = field(default_factory=Counter, repr=False)

    def check(self, text: str) -> str | None:
        """The first rule `text` breaks, or None."""
        toks = tokens(text)
        n = len(toks)
        if n < self.min_words:
            return "too_few_words"
        if n > self.max_words:
            return "too_many_words"
        cjk = is_cjk(text)
        ws = words(text)
        if not cjk and ws:
            mean = sum(map(len, ws)) / len(ws)
            if mean < self.min_mean_word_length:
                return "mean_word_length_low"
            if mean > self.max_mean_word_length:
                return "mean_word_length_high"
        symbols = text.count("#") + sum(text.count(e) for e in ELLIPSES)
        if symbols / n > self.max_symbol_word_ratio:
            return "symbol_word_ratio"
        lines = _joined_units(text)  # paragraphs of hard-wrapped text
        if lines:
            if sum(ln.lstrip().startswith(BULLETS) for ln in lines) / len(lines) > self.max_bullet_lines_ratio:
                return "bullet_lines"
            if sum(ln.rstrip().endswith(ELLIPSES) for ln in lines) / len(lines) > self.max_ellipsis_lines_ratio:
                return "ellipsis_lines"
        if sum(any(c.isalpha() for c in t) for t in toks) / n < self.min_alpha_words_ratio:
            return "alpha_words_ratio"
        if self.min_stop_words and load_language(self.language).words == "character":
            params = load_language(self.language)
            if self.stop_words != params.stop_words:
                params = dataclasses.replace(params, stop_words=tuple(self.stop_words))
            if count_stop_words(text, params, at_most=self.min_stop_words) < self.min_stop_words:
                return "stop_words"
        elif not cjk and self.min_stop_words:
            stop = set(self.stop_words)
            found = 0
            for w in ws:
                if w.lower() in stop:
                    found += 1
                    if found >= self.min_stop_words:
                        break
            else:
                return "stop_words"
        return None


def duplicates(elements: list[str]) -> tuple[int, int]:
    """(number of elements equal to an earlier one, characters in those elements)."""
    seen: set[str] = set()
    count = chars = 0
    for e in elements:
        if e in seen:
            count += 1
            chars += len(e)
        else:
            seen.add(e)
    return count, chars


# --------------------------------------------------------------------------------------------
# C4
# --------------------------------------------------------------------------------------------

_C4_POLICY = ("terms of use", "privacy policy", "cookie policy", "uses cookies", "use of cookies", "use cookies")
_CITATION = re.compile(r"\[\d*\]|\[edit\]|\[citation needed\]", re.IGNORECASE)


@dataclass
class C4Quality(RuleFilter):
    """C4's line and page rules (Raffel et al. 2020, section 2.2).

    Lines (paragraphs, in hard-wrapped text: `text_units`) are removed when they do not end in
    terminal punctuation, have fewer than 3 words,
    contain "javascript", or mention cookie/terms-of-use policies; Wikipedia-style citation
    markers ("[1]", "[edit]") are removed from lines. The page is dropped when it contains
    "lorem ipsum" or a curly bracket (code), a word longer than 1000 characters, or when fewer
    than 5 sentences remain. Terminal punctuation and sentence ends are `language`'s
    (`languages.count_sentences`: in Chinese and Japanese 。！？ end a sentence with no space after).
    """

    min_words_per_line: int = 3
    min_sentences: int = 5
    max_word_length: int = 1000
    filter_javascript: bool = True
    filter_policy: bool = True
    filter_lorem_ipsum: bool = True
    filter_curly_bracket: bool = True
    remove_citations: bool = True
    language: str = "en"
    name: str = "c4"
    counts: Counter = field(default_factory=Counter, repr=False)
    #: a few removed lines per rule, for the report (collected by `pipeline.apply_steps`).
    line_examples: dict = field(default_factory=dict, repr=False)

    def record_line(self, reason: str, line: str) -> None:
        ex = self.line_examples.setdefault(reason, [])
        if len(ex) < 3:
            ex.append(line)

    def decide(self, doc: Document) -> Document | str:
        text = doc.text
        lower = text.lower()
        if self.filter_lorem_ipsum and "lorem ipsum" in lower:
            return "lorem_ipsum"
        if self.filter_curly_bracket and "{" in text:
            return "curly_bracket"
        params = load_language(self.language)
        terminal = params.terminal_punctuation
        kept = []
        units = text_units(text)
        wrapped = any(len(u) > 1 for u in units)
        for unit in units:
            if self.remove_citations:
                unit = [_CITATION.sub("", ln) for ln in unit]
            unit = [ln.strip() for ln in unit if ln.strip()]
            if not unit:
                continue
            stripped = " ".join(unit)  # a paragraph of wrapped text is judged as one line
            low = stripped.lower()
            ws = stripped.split()
            if any(len(w) > self.max_word_length for w in ws):
                return "long_word"
            reason = None
            if not stripped.endswith(terminal) or stripped.endswith(ELLIPSES):
                reason = "line_no_terminal_punct"
            elif len(words(stripped)) < self.min_words_per_line:
                reason = "line_few_words"
            elif self.filter_javascript and "javascript" in low:
                reason = "line_javascript"
            elif self.filter_policy and any(p in low for p in _C4_POLICY):
                reason = "line_policy"
            if reason:
                self.counts[reason] += 1
                self.record_line(reason, stripped)
            else:
                kept.append("\n".join(unit))
        new_text = ("\n\n" if wrapped else "\n").join(kept)
        if count_sentences(new_text, params) < self.min_sentences:
            return "few_sentences"
        return replace(doc, text=new_text)


# --------------------------------------------------------------------------------------------
# FineWeb
# --------------------------------------------------------------------------------------------


@dataclass
class FineWebQuality(RuleFilter):
    """FineWeb's custom filters (Penedo et al. 2024, section 3.5).

    Drop when at most 12% of the lines end with punctuation, when at least 10% of the
    characters are in lines that duplicate earlier lines, or when at least 67% of the lines
    are shorter than 30 characters. Terminal punctuation is `language`'s.
    """

    min_punct_line_ratio: float = 0.12
    max_dup_line_char_ratio: float = 0.1
    short_line_length: int = 30
    max_short_line_ratio: float = 0.67
    language: str = "en"
    name: str = "fineweb"
    counts: Counter = field(default_factory=Counter, repr=False)

    def check(self, text: str) -> str | None:
        lines = _joined_units(text)  # paragraphs of hard-wrapped text, else lines
        if not lines:
            return "empty"
        terminal = load_language(self.language).terminal_punctuation
        if sum(ln.endswith(terminal) for ln in lines) / len(lines) <= self.min_punct_line_ratio:
            return "punct_line_ratio"
        _, dup_chars = duplicates(lines)
        if dup_chars / max(1, sum(map(len, lines))) >= self.max_dup_line_char_ratio:
            return "dup_line_char_ratio"
        if sum(len(ln) < self.short_line_length for ln in lines) / len(lines) >= self.max_short_line_ratio:
            return "short_line_ratio"
        return None


# --------------------------------------------------------------------------------------------
# Length and blocklist
# --------------------------------------------------------------------------------------------


@dataclass
class LengthFilter:
    """Drop documents outside [min_chars, max_chars] characters (max_chars 0: no upper bound)."""

    min_chars: int = 1
    max_chars: int = 0
    name: str = "length"
    counts: Counter = field(default_factory=Counter, repr=False)

    def __call__(self, doc: Document) -> Document | str:
        n = len(doc.text)
        if n < self.min_chars:
            return "too_short"
        if self.max_chars and n > self.max_chars:
            return "too_long"
        return doc


_URL_HOST = re.compile(r"\bhttps?://([^/\s:?#]+)", re.IGNORECASE)


@dataclass
class Blocklist:
    """Drop (or flag) documents containing a blocked word or linking to a blocked domain.

    Blocklist file format (UTF-8, one entry per line, `#` starts a comment):
    ``word`` blocks a whole word (case-insensitive, word boundaries); ``domain:example.com``
    blocks URLs on that host and its subdomains. Empty by default.

    Args:
        words / domains: entries given directly (recipe YAML).
        path: a blocklist file as above.
        action: "drop" removes the document; "flag" keeps it and sets meta["blocklist"] to the
            first match.
    """

    words: list[str] = field(default_factory=list)
    domains: list[str] = field(default_factory=list)
    path: str | None = None
    action: str = "drop"
    name: str = "blocklist"
    counts: Counter = field(default_factory=Counter, repr=False)

    def __post_init__(self) -> None:
        if self.action not in ("drop", "flag"):
            raise ValueError(f"blocklist action must be 'drop' or 'flag', got {self.action!r}")
        ws, ds = list(self.words), list(self.domains)
        if self.path:
            with open(self.path, encoding="utf-8") as f:
                for raw in f:
                    entry = raw.split("#", 1)[0].strip()
                    if entry.startswith("domain:"):
                        ds.append(entry[len("domain:"):].strip())
                    elif entry:
                        ws.append(entry)
        self._domains = {d.lower().lstrip(".") for d in ds if d}
        self._word_re = (re.compile(r"\b(?:" + "|".join(re.escape(w) for w in sorted(set(ws))) + r")\b", re.IGNORECASE)
                         if ws else None)

    def match(self, text: str) -> str | None:
        """The first blocked word or domain in `text`, or None."""
        if self._word_re is not None:
            m = self._word_re.search(text)
            if m:
                return m.group(0).lower()
        if self._domains:
            for host in _URL_HOST.findall(text):
                parts = host.lower().split(".")
                for i in range(len(parts) - 1):
                    if ".".join(parts[i:]) in self._domains:
                        return "domain:" + ".".join(parts[i:])
        return None

    def __call__(self, doc: Document) -> Document | str:
        hit = self.match(doc.text)
        if hit is None:
            return doc
        if self.action == "drop":
            return "blocked"
        self.counts["flagged"] += 1
        return replace(doc, metadata={**doc.metadata, "blocklist": hit})

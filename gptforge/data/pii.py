"""PII redaction: e-mail addresses, IP addresses, phone numbers and payment-card numbers.

Each match is replaced by a typed placeholder ("<EMAIL>", "<IP_ADDRESS>", "<PHONE>",
"<CREDIT_CARD>") and counted per kind. Candidates are found by regular expressions and then
validated where a validator exists: IP addresses with the standard library's `ipaddress`,
card numbers with the Luhn checksum (ISO/IEC 7812-1, annex B), so that arbitrary long numbers
are not mistaken for cards. The patterns are deliberately conservative (precision over recall):
redacting ordinary numbers would damage more text than the rare missed phone number.
"""

from __future__ import annotations

import ipaddress
import re
from collections import Counter
from dataclasses import dataclass, field, replace

from gptforge.data.readers import Document

EMAIL = re.compile(r"(?<![\w.+-])[A-Za-z0-9][A-Za-z0-9._%+-]{0,63}@(?:[A-Za-z0-9](?:[A-Za-z0-9-]{0,61}[A-Za-z0-9])?\.)+[A-Za-z]{2,24}\b")
CARD = re.compile(r"(?<![\d-])(?:\d[ -]?){12,18}\d(?![\d-])")
IPV6 = re.compile(r"(?<![\w:])(?:[0-9A-Fa-f]{0,4}:){2,7}(?:[0-9A-Fa-f]{1,4}|(?:\d{1,3}\.){3}\d{1,3})?(?![\w:])")
IPV4 = re.compile(r"(?<![\d.])(?:\d{1,3}\.){3}\d{1,3}(?![\d.]|\.\d)")
# International prefix or area code, then groups separated by space, dot or dash; 9-15 digits.
PHONE = re.compile(r"(?<![\w+])(?:\+\d{1,3}[ .-]?)?(?:\(\d{1,4}\)[ .-]?)?\d{2,4}(?:[ .-]\d{2,4}){1,4}(?![\w])")


_DIGIT = re.compile(r"\d")
_TRIGGER = re.compile(r"[\d@]")
#: a whole line holding a digit or "@" (anchored at line starts, so each line is scanned once).
_TRIGGER_LINE = re.compile(r"^[^\n\d@]*[\d@][^\n]*", re.MULTILINE)
_NON_DIGIT = re.compile(r"\D")


def luhn_ok(digits: str) -> bool:
    """True when the digit string passes the Luhn checksum (ISO/IEC 7812-1)."""
    total = 0
    for i, ch in enumerate(reversed(digits)):
        d = ord(ch) - 48
        if i % 2:
            d *= 2
            if d > 9:
                d -= 9
        total += d
    return total % 10 == 0


@dataclass
class PIIRedactor:
    """Replace PII with typed placeholders; `counts` holds replacements per kind.

    Args:
        kinds: which of "email", "ip_address", "phone", "credit_card" to redact.
    """

    kinds: tuple[str, ...] = ("email", "ip_address", "phone", "credit_card")
    name: str = "pii"
    counts: Counter = field(default_factory=Counter, repr=False)

    def __post_init__(self) -> None:
        unknown = set(self.kinds) - {"email", "ip_address", "phone", "credit_card"}
        if unknown:
            raise ValueError(f"unknown PII kind(s) {sorted(unknown)}; known: email, ip_address, phone, credit_card")

    def redact(self, text: str) -> str:
        """`text` with every PII match replaced by its placeholder.

        No pattern crosses a line break, and every look-around treats a line break like the
        text's ends, so only lines holding a digit or "@" are searched (one C-level scan finds
        them): most prose lines hold neither.
        """
        if not _TRIGGER.search(text):
            return text
        pieces: list[str] = []
        pos = 0
        for m in _TRIGGER_LINE.finditer(text):
            line = m.group(0)
            new = self._redact_line(line)
            if new is not line:
                pieces.append(text[pos:m.start()])
                pieces.append(new)
                pos = m.end()
        if not pieces:
            return text
        pieces.append(text[pos:])
        return "".join(pieces)

    def _redact_line(self, text: str) -> str:
        kinds = self.kinds
        if "email" in kinds and "@" in text:
            text = self._sub(EMAIL, "email", "<EMAIL>", text)
        if not _DIGIT.search(text):
            return text
        if "credit_card" in kinds:
            text = self._sub(CARD, "credit_card", "<CREDIT_CARD>", text, _valid_card)
        if "ip_address" in kinds:
            if ":" in text:
                text = self._sub(IPV6, "ip_address", "<IP_ADDRESS>", text, _valid_ipv6)
            if "." in text:
                text = self._sub(IPV4, "ip_address", "<IP_ADDRESS>", text, _valid_ip)
        if "phone" in kinds:
            text = self._sub(PHONE, "phone", "<PHONE>", text, _valid_phone)
        return text

    def _sub(self, pattern: re.Pattern, kind: str, placeholder: str, text: str, valid=None) -> str:
        changed = False

        def repl(m: re.Match) -> str:
            s = m.group(0)
            if valid is not None and not valid(s):
                return s
            nonlocal changed
            changed = True
            self.counts[kind] += 1
            return placeholder

        out = pattern.sub(repl, text)
        return out if changed else text  # the same object: callers test `is` for "unchanged"

    def __call__(self, doc: Document) -> Document:
        text = self.redact(doc.text)
        return doc if text is doc.text else replace(doc, text=text)


def _valid_card(s: str) -> bool:
    digits = _NON_DIGIT.sub("", s)
    return len(digits) >= 13 and luhn_ok(digits)


def _valid_phone(s: str) -> bool:
    return 9 <= sum(c.isdigit() for c in s) <= 15


def _valid_ip(s: str) -> bool:
    try:
        ipaddress.ip_address(s)
    except ValueError:
        return False
    return True


def _valid_ipv6(s: str) -> bool:
    # Slices in code ("x[::2]") and loopback "::1" parse as IPv6 but identify nobody: require
    # three or more non-empty groups and a non-loopback address.
    if sum(1 for g in s.split(":") if g) < 3:
        return False
    try:
        addr = ipaddress.ip_address(s)
    except ValueError:
        return False
    return isinstance(addr, ipaddress.IPv6Address) and not addr.is_loopback

"""PII redaction: e-mail addresses, IP addresses, phone numbers, resident ID numbers and cards.

Each match is replaced by a typed placeholder ("<EMAIL>", "<IP_ADDRESS>", "<PHONE>",
"<ID_NUMBER>", "<CREDIT_CARD>") and counted per kind. Candidates are found by regular
expressions and then validated where a validator exists: IP addresses with the standard
library's `ipaddress`, card numbers with the Luhn checksum (ISO/IEC 7812-1, annex B), mainland
Chinese resident ID numbers with their ISO 7064 MOD 11-2 check character (GB 11643-1999) or, for
the old 15-digit form, a valid province code and birth date, so that arbitrary long numbers
are not mistaken for PII. The patterns are deliberately conservative (precision over recall):
redacting ordinary numbers would damage more text than the rare missed phone number.

Chinese text: mainland mobile numbers (11 digits from 1[3-9], optional +86 / 0086, spaces or
dashes in the 3-4-4 grouping) and landlines with an area code (010-62345678, (021)12345678,
0755-1234567, 0755-8888 6666) are phones, with an extension after them (转 8021, ext. 12) taken
along, as are international numbers without separators (+14155550132); ID numbers may be written
in their 6-8-4 groups; internationalised e-mail addresses (张三@例子.中国, user@例子.cn) are
e-mail;
full-width digits, Latin letters and @ . - _ + ( ) are read as their
ASCII forms (the placeholder replaces the full-width text); a CJK character next to an address
or number is a boundary, as a space is. The order is e-mail, ID number, Chinese and E.164 phones, card,
IP address, other phones: a valid ID or mobile number never becomes "<CREDIT_CARD>".
"""

from __future__ import annotations

import datetime
import ipaddress
import re
from collections import Counter
from dataclasses import dataclass, field, replace

from gptforge.data.readers import Document
from gptforge.data.text_stats import CJK_CLASS

KINDS = ("email", "ip_address", "phone", "id_number", "credit_card")
PLACEHOLDERS = {"email": "<EMAIL>", "ip_address": "<IP_ADDRESS>", "phone": "<PHONE>", "id_number": "<ID_NUMBER>",
                "credit_card": "<CREDIT_CARD>"}
#: Han, kana (text_stats.CJK_CLASS) and Hangul syllables: word characters to `re`, yet a boundary
#: for PII, since these scripts put no space between a word and an address or number.
_CJK = CJK_CLASS + "\uac00-\ud7af"
#: one character that continues a Latin word or number: a word character that is not CJK.
_W = f"[^\\W{_CJK}]"

EMAIL = re.compile(f"(?<!{_W})(?<![.+-])[A-Za-z0-9][A-Za-z0-9._%+-]{{0,63}}@"
                   f"(?:[A-Za-z0-9](?:[A-Za-z0-9-]{{0,61}}[A-Za-z0-9])?\\.)+[A-Za-z]{{2,24}}(?!{_W})")
#: common top-level domains written in Chinese characters (an address's end must be known: CJK
#: text runs on after it without a space).
_CJK_TLDS = "中国|中國|公司|网络|網絡|香港|台湾|台灣|新加坡|在线|网址|集团|移动|商城|信息"
#: an internationalised address (RFC 6531 local part, IDNA domain) that EMAIL, ASCII only, misses:
#: labels may hold any letters; the top-level domain is Latin or one of _CJK_TLDS. A local part in
#: CJK has no visible start in CJK text, so at most 4 such characters before the "@" are taken
#: (a Chinese name is 2-4): a few characters of context may go with the address, never the reverse.
EMAIL_IDN = re.compile(f"(?:(?<!{_W})(?<![.+-])[A-Za-z0-9][A-Za-z0-9._%+-]{{0,63}}|[^\\W\\d_]{{1,4}})@"
                       f"(?:[^\\W_](?:[\\w-]{{0,61}}[^\\W_])?\\.)+(?:[A-Za-z]{{2,24}}(?!{_W})|(?:{_CJK_TLDS}))")
#: a telephone extension after a number: 转 / 轉 / 分机 / 分機 (Chinese), ext or x, then 1-6 digits.
_EXTENSION = "(?:[ \\t]*(?:转|轉|分机|分機|ext\\.?|x)[ \\t]*\\d{1,6})?"
_EXTENSION_TAIL = re.compile("[ \t]*(?:转|轉|分机|分機|ext\\.?|x)[ \t]*\\d{1,6}$")
CARD = re.compile(r"(?<![\d-])(?:\d[ -]?){12,18}\d(?![\d-])")
IPV6 = re.compile(r"(?<![\w:])(?:[0-9A-Fa-f]{0,4}:){2,7}(?:[0-9A-Fa-f]{1,4}|(?:\d{1,3}\.){3}\d{1,3})?(?![\w:])")
IPV4 = re.compile(r"(?<![\d.])(?:\d{1,3}\.){3}\d{1,3}(?![\d.]|\.\d)")
# International prefix or area code, then groups separated by space, dot or dash; 9-15 digits.
PHONE = re.compile(r"(?<![\w+])(?:\+\d{1,3}[ .-]?)?(?:\(\d{1,4}\)[ .-]?)?\d{2,4}(?:[ .-]\d{2,4}){1,4}"
                   + _EXTENSION + r"(?![\w])")
#: a count or amount in Chinese: digits followed by one of these are never a phone or ID number.
_CN_UNIT = "年月日号號元万萬亿億个個次人件岁歲%％"
#: mainland mobile: 1[3-9]X XXXX XXXX with optional +86 / 0086 and one kind of separator.
CN_MOBILE = re.compile(f"(?<!{_W})(?<![+\\d-])(?:(?:\\+|00)86[ -]?)?1[3-9]\\d(?P<sep>[ -]?)\\d{{4}}(?P=sep)\\d{{4}}"
                       f"(?![\\d-]|{_W}|[{_CN_UNIT}])")
#: mainland landline: area code 0XX or 0XXX (with a dash or space, or in parentheses), then a
#: local number of 7-8 digits not starting with 0 (its last 4 may be set apart by a space or
#: dash), then an optional extension.
CN_LANDLINE = re.compile(f"(?<!{_W})(?<![+\\d-])(?:\\(0\\d{{2,3}}\\) ?|0\\d{{2,3}}[ -])[1-9]\\d{{2,3}}[ -]?\\d{{4}}"
                         f"{_EXTENSION}(?![\\d-]|{_W}|[{_CN_UNIT}])")
#: an international number written without separators (E.164: "+", then 9-15 digits); a signed
#: decimal ("+35236450.6") is not one.
E164 = re.compile(f"(?<!{_W})(?<![+\\d])\\+[1-9]\\d{{8,14}}(?![\\d-]|{_W}|\\.\\d)")
#: resident ID: 18 characters (17 digits and a check digit or X) or the old 15-digit form.
CN_ID = re.compile(f"(?<!{_W})(?<![\\d-])(?:\\d{{17}}[\\dXx]|\\d{{15}}|\\d{{6}}(?P<sep>[ -])\\d{{8}}(?P=sep)\\d{{3}}[\\dXx]"
                   f"|\\d{{6}}(?P<sep15>[ -])\\d{{6}}(?P=sep15)\\d{{3}})(?![\\d-]|{_W}|[{_CN_UNIT}])")
"""Also written in its groups (region, birth date, sequence and check: 110101 19900307 1234)."""

_DIGIT = re.compile(r"\d")
_TRIGGER = re.compile(r"[\d@\uff10-\uff19\uff20]")
#: a whole line holding a digit or "@" (anchored at line starts, so each line is scanned once).
_TRIGGER_LINE = re.compile(r"^[^\n\d@\uff10-\uff19\uff20]*[\d@\uff10-\uff19\uff20][^\n]*", re.MULTILINE)
_NON_DIGIT = re.compile(r"\D")
#: full-width digits, Latin letters and @ . - _ + ( ) and the ideographic space, as ASCII: one
#: character for one, so a match's span in the translation is its span in the original.
_FULL_WIDTH = {**{0xFF10 + i: 0x30 + i for i in range(10)}, **{0xFF21 + i: 0x41 + i for i in range(26)},
               **{0xFF41 + i: 0x61 + i for i in range(26)},
               **{ord(f): ord(h) for f, h in zip("＠．－＿＋（）\u3000", "@.-_+() ", strict=True)}}
_HAS_FULL_WIDTH = re.compile("[\uff10-\uff19\uff21-\uff3a\uff41-\uff5a＠．－＿＋（）\u3000]")
#: first two digits of a resident ID: the province-level division (GB/T 2260).
_PROVINCES = frozenset({11, 12, 13, 14, 15, 21, 22, 23, 31, 32, 33, 34, 35, 36, 37, 41, 42, 43, 44, 45, 46,
                        50, 51, 52, 53, 54, 61, 62, 63, 64, 65, 71, 81, 82, 83})
_ID_WEIGHTS = tuple(pow(2, 17 - i, 11) for i in range(17))  # ISO 7064 MOD 11-2: 2^(17-i) mod 11


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


def id_check_character(first17: str) -> str:
    """The ISO 7064 MOD 11-2 check character ("0"-"9" or "X") of 17 ASCII digits (GB 11643-1999)."""
    total = sum((ord(c) - 48) * w for c, w in zip(first17, _ID_WEIGHTS, strict=False))
    return "10X98765432"[total % 11]


def _valid_date(year: int, month: int, day: int) -> bool:
    try:
        datetime.date(year, month, day)
    except ValueError:
        return False
    return True


def resident_id_ok(s: str) -> bool:
    """True for a mainland Chinese resident ID number: 18 characters with a valid province code,
    birth date (1800 onwards) and MOD 11-2 check character, or 15 digits (the pre-1999 form, no
    check digit) with a valid province code and a 19YYMMDD birth date."""
    if not s[:2].isdigit() or int(s[:2]) not in _PROVINCES:
        return False
    if len(s) == 18:
        y, m, d = int(s[6:10]), int(s[10:12]), int(s[12:14])
        return y >= 1800 and _valid_date(y, m, d) and id_check_character(s[:17]) == s[17].upper()
    if len(s) == 15:
        return _valid_date(1900 + int(s[6:8]), int(s[8:10]), int(s[10:12]))
    return False


def _grouped_id_ok(s: str) -> bool:
    return resident_id_ok(s.replace(" ", "").replace("-", ""))


def _landline_ok(s: str) -> bool:
    # 3-digit area codes are 010 and 02X (local numbers of 8 digits); the others are 03XX-09XX
    # (local numbers of 7 or 8 digits). An extension is not part of the local number.
    s = _EXTENSION_TAIL.sub("", s)
    area = _AREA.match(s).group(1)
    local = len(_NON_DIGIT.sub("", s)) - len(area)
    if len(area) == 3:
        return (area == "010" or area[1] == "2") and local == 8
    return area[1] in "3456789" and local in (7, 8)


_AREA = re.compile(r"\(?(0\d{2,3})")


@dataclass
class PIIRedactor:
    """Replace PII with typed placeholders; `counts` holds replacements per kind.

    Args:
        kinds: which of "email", "ip_address", "phone", "id_number", "credit_card" to redact.

    Raises:
        ValueError: an unknown kind.
    """

    kinds: tuple[str, ...] = KINDS
    name: str = "pii"
    counts: Counter = field(default_factory=Counter, repr=False)

    def __post_init__(self) -> None:
        unknown = set(self.kinds) - set(KINDS)
        if unknown:
            raise ValueError(f"unknown PII kind(s) {sorted(unknown)}; known: {', '.join(KINDS)}")
        # Every check runs, in this order, even for a kind that is off: its matches are then left as
        # they are but still hidden from the later checks (a mobile number stays a mobile
        # number, never a card number, when phones are not redacted).
        self._checks = [("email", EMAIL, None, "@"), ("email", EMAIL_IDN, None, "@"),
                  ("id_number", CN_ID, _grouped_id_ok, None),
                  ("phone", CN_MOBILE, None, None), ("phone", CN_LANDLINE, _landline_ok, None),
                  ("phone", E164, None, "+"),
                  ("credit_card", CARD, _valid_card, None), ("ip_address", IPV6, _valid_ipv6, ":"),
                  ("ip_address", IPV4, _valid_ip, "."), ("phone", PHONE, _valid_phone, None)]
        self._on = frozenset(self.kinds)

    def redact(self, text: str) -> str:
        """`text` with every PII match replaced by its placeholder.

        No pattern crosses a line break, and every look-around treats a line break like the
        text's ends, so only lines holding a digit or "@" (ASCII or full-width) are searched
        (one C-level scan finds them): most prose lines hold neither.
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
        """Each check in order finds its matches in `probe` (the line with full-width forms as
        ASCII); a match is masked there with NULs of its length, so later checks neither see it
        nor shift, and the placeholders replace the same spans of the original line."""
        probe = text.translate(_FULL_WIDTH) if _HAS_FULL_WIDTH.search(text) else text
        spans: list[tuple[int, int, str]] = []
        has_digit = _DIGIT.search(probe) is not None
        for kind, pattern, valid, needs in self._checks:
            if needs is not None and needs not in probe or kind != "email" and not has_digit:
                continue

            def mask(m: re.Match, kind=kind, valid=valid) -> str:
                s = m.group(0)
                if valid is not None and not valid(s):
                    return s
                if kind in self._on:
                    spans.append((m.start(), m.end(), kind))
                return "\0" * len(s)

            probe = pattern.sub(mask, probe)
        if not spans:
            return text  # the same object: callers test `is` for "unchanged"
        out: list[str] = []
        pos = 0
        for start, end, kind in sorted(spans):
            self.counts[kind] += 1
            out.append(text[pos:start])
            out.append(PLACEHOLDERS[kind])
            pos = end
        out.append(text[pos:])
        return "".join(out)

    def __call__(self, doc: Document) -> Document:
        text = self.redact(doc.text)
        return doc if text is doc.text else replace(doc, text=text)


def _valid_card(s: str) -> bool:
    digits = _NON_DIGIT.sub("", s)
    return len(digits) >= 13 and luhn_ok(digits)


def _valid_phone(s: str) -> bool:
    return 9 <= sum(c.isdigit() for c in _EXTENSION_TAIL.sub("", s)) <= 15


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

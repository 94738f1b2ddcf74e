"""PII redaction: e-mail addresses, IP addresses, phone numbers, resident ID numbers and cards.

Each match is replaced by a typed placeholder ("<EMAIL>", "<IP_ADDRESS>", "<PHONE>",
"<ID_NUMBER>", "<CREDIT_CARD>") and counted per kind. Candidates are found by regular
expressions and then validated where a validator exists: IP addresses with the standard
library's `ipaddress` (not after "version"/"v"), card numbers with the Luhn checksum (ISO/IEC
7812-1, annex B) and a major network's issuer prefix and length, mainland
Chinese resident ID numbers with their ISO 7064 MOD 11-2 check character (GB 11643-1999) or, for
the old 15-digit form, a valid province code and birth date, so that arbitrary long numbers
are not mistaken for PII. The patterns are deliberately conservative (precision over recall):
redacting ordinary numbers would damage more text than the rare missed phone number. So other
grouped numbers are phones only with phone evidence (a +country code, a parenthesised area code,
the North American 3-3-4 shape, or a phone word shortly before them on the line), a card number
needs its printed grouping (4-4-4-4, Amex 4-6-5) or a card word before it on the line, and a
number right after an order, invoice or serial number label is never a phone.

Chinese text: mainland mobile numbers (11 digits from 1[3-9], optional +86 / 0086, spaces or
dashes in the 3-4-4 grouping) and landlines with an area code (010-62345678, (021)12345678,
0755-1234567, 0755-8888 6666) are phones, with an extension after them (转 8021, ext. 12, -123) taken
along, as are international numbers without separators (+14155550132); ID numbers may be written
in their 6-8-4 groups; internationalised e-mail addresses (张三@例子.中国, user@例子.cn, иван@пример.рф) are
e-mail; a number directly or after a space followed by a Chinese unit (元, 年, 人 ...) is none;
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
#: labels may hold any letters; the top-level domain is Latin, one of _CJK_TLDS, or in another
#: script that spaces its words (Cyrillic .рф, Greek .ελ, Arabic ...), which then ends at a word
#: boundary. A local part in a spaced script starts at a word boundary; one in CJK has no visible
#: start in CJK text, so at most 4 such characters before the "@" are taken (a Chinese name is
#: 2-4): a few characters of context may go with the address, never the reverse.
EMAIL_IDN = re.compile(f"(?:(?<!{_W})(?<![.+-])(?:[A-Za-z0-9][A-Za-z0-9._%+-]{{0,63}}"
                       f"|[^\\W\\d_A-Za-z{_CJK}](?:[^\\W{_CJK}]|[.%+-]){{0,63}})|[^\\W\\d_]{{1,4}})@"
                       f"(?:[^\\W_](?:[\\w-]{{0,61}}[^\\W_])?\\.)+(?:[A-Za-z]{{2,24}}(?!{_W})|(?:{_CJK_TLDS})"
                       f"|[^\\W\\d_A-Za-z{_CJK}]{{2,24}}(?!\\w))")
#: a telephone extension after a number: 转 / 轉 / 分机 / 分機 (Chinese), ext or x, then 1-6 digits.
_EXTENSION = "(?:[ \\t]*(?:转|轉|分机|分機|ext\\.?|x)[ \\t]*\\d{1,6})?"
_EXTENSION_TAIL = re.compile("[ \t]*(?:转|轉|分机|分機|ext\\.?|x)[ \t]*\\d{1,6}$")
#: a card number: 13-19 digits, in groups split by spaces or dashes.
CARD = re.compile(r"(?<![\d-])(?:\d[ -]?){12,18}\d(?![\d-])")
#: words that announce a card number written without separators (checked in the 40 characters
#: before it on its line).
_CARD_KEYWORD = re.compile(r"(?<![A-Za-z])(?:card|visa|master\s?card|amex|american express|discover|jcb|"
                           r"unionpay|diners|maestro|credit|debit)(?![a-z])|卡|银联|銀聯", re.IGNORECASE)
#: words that announce a telephone number (checked in the 24 characters before it on its line).
_PHONE_KEYWORD = re.compile(r"(?<![A-Za-z])(?:tel|telephone|phone|call|fax|mobile|cell|contact)(?![a-z])|"
                            r"电话|電話|手机|手機|联系|聯繫|致电|致電|传真|傳真|热线|熱線|座机|座機", re.IGNORECASE)
#: labels of other numbers: a number right after one (订单号 13812345678, Order #0755-1234567)
#: is that number, not a phone.
_OTHER_LABEL = re.compile(r"(?:(?<![A-Za-z])(?:order|invoice|serial|tracking)|订单|訂單|单号|單號|编号|編號|学号|學號|发票|發票|"
                          r"流水号|流水號)[^\d\n]{0,6}$", re.IGNORECASE)
#: the North American 3-3-4 shape (NANP: area code and exchange start with 2-9), one kind of separator.
_NANP = re.compile(r"(?:1[.-])?[2-9]\d\d(?P<sep>[.-])[2-9]\d\d(?P=sep)\d{4}")
#: a version number: four dotted numbers after these are no IP address.
_VERSION_BEFORE = re.compile(r"(?:(?<![A-Za-z])(?:version|ver\.?|v)|版本)[ \t:]*$", re.IGNORECASE)
IPV6 = re.compile(r"(?<![\w:])(?:[0-9A-Fa-f]{0,4}:){2,7}(?:[0-9A-Fa-f]{1,4}|(?:\d{1,3}\.){3}\d{1,3})?(?![\w:])")
IPV4 = re.compile(r"(?<![\d.])(?:\d{1,3}\.){3}\d{1,3}(?![\d.]|\.\d)")
#: any other phone candidate: international prefix or area code, then groups (the first of 2-4
#: digits, the others up to 8) separated by space, dot or dash; 9-15 digits. Kept only with phone
#: evidence (see _valid_phone).
PHONE = re.compile(r"(?<![\w+])(?:\+\d{1,3}[ .-]?)?(?:\(\d{1,4}\)[ .-]?)?\d{2,4}(?:[ .-]\d{2,8}){1,4}"
                   + _EXTENSION + r"(?!\w)")
#: a count or amount in Chinese: digits followed by one of these (directly or after a space) are
#: never a phone or ID number.
_CN_UNIT = "年月日号號元万萬亿億个個次人件岁歲%％"
_NOT_AFTER = f"(?![\\d-]|{_W}|[ \\t]?[{_CN_UNIT}])"
#: mainland mobile: 1[3-9]X XXXX XXXX with optional +86 / 0086 and one kind of separator.
CN_MOBILE = re.compile(f"(?<!{_W})(?<![+\\d-])(?:(?:\\+|00)86[ -]?)?1[3-9]\\d(?P<sep>[ -]?)\\d{{4}}(?P=sep)\\d{{4}}"
                       + _NOT_AFTER)
#: mainland landline: area code 0XX or 0XXX (with a dash or space, or in parentheses), then a
#: local number of 7-8 digits not starting with 0 (its last 4 may be set apart by a space or
#: dash), then an optional extension (转 123, ext. 12, or after a dash: 010-62345678-123).
CN_LANDLINE = re.compile(f"(?<!{_W})(?<![+\\d-])(?:\\(0\\d{{2,3}}\\) ?|0\\d{{2,3}}[ -])(?P<local>[1-9]\\d{{2,3}}[ -]?\\d{{4}})"
                         f"(?:-\\d{{1,4}}|{_EXTENSION})" + _NOT_AFTER)
#: an international number written without separators (E.164: "+", then 9-15 digits); a signed
#: decimal ("+35236450.6") is not one.
E164 = re.compile(f"(?<!{_W})(?<![+\\d])\\+[1-9]\\d{{8,14}}(?![\\d-]|{_W}|\\.\\d)")
#: resident ID: 18 characters (17 digits and a check digit or X) or the old 15-digit form.
CN_ID = re.compile(f"(?<!{_W})(?<![\\d-])(?:\\d{{17}}[\\dXx]|\\d{{15}}|\\d{{6}}(?P<sep>[ -])\\d{{8}}(?P=sep)\\d{{3}}[\\dXx]"
                   f"|\\d{{6}}(?P<sep15>[ -])\\d{{6}}(?P=sep15)\\d{{3}})" + _NOT_AFTER)
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


def _grouped_id_ok(m: re.Match) -> bool:
    return resident_id_ok(m.group(0).replace(" ", "").replace("-", ""))


def _landline_ok(m: re.Match) -> bool:
    # 3-digit area codes are 010 and 02X (local numbers of 8 digits); the others are 03XX-09XX
    # (local numbers of 7 or 8 digits). An extension is not part of the local number.
    area = _AREA.match(m.group(0)).group(1)
    local = len(_NON_DIGIT.sub("", m.group("local")))
    if len(area) == 3:
        ok = (area == "010" or area[1] == "2") and local == 8
    else:
        ok = area[1] in "3456789" and local in (7, 8)
    return ok and _not_labelled(m)


def _not_labelled(m: re.Match) -> bool:
    """False when an order, invoice or serial number label (_OTHER_LABEL) comes right before `m`."""
    return _OTHER_LABEL.search(m.string, max(0, m.start() - 16), m.start()) is None


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
                  ("phone", CN_MOBILE, _not_labelled, None), ("phone", CN_LANDLINE, _landline_ok, None),
                  ("phone", E164, _not_labelled, "+"),
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
                if valid is not None and not valid(m):
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


#: (first digits, lengths) of the major card networks: issuer identification number (IIN) ranges
#: as the networks publish them (the IIN is the start of the ISO/IEC 7812-1 card number).
_NETWORKS: tuple[tuple[tuple[int, int], int, frozenset[int]], ...] = tuple(
    ((lo, hi), len(str(lo)), frozenset(lengths)) for lo, hi, lengths in (
        (4, 4, (13, 16, 19)),                                         # Visa
        (51, 55, (16,)), (2221, 2720, (16,)),                         # Mastercard
        (34, 34, (15,)), (37, 37, (15,)),                             # American Express
        (6011, 6011, (16, 17, 18, 19)), (644, 649, (16, 17, 18, 19)),  # Discover
        (65, 65, (16, 17, 18, 19)),
        (3528, 3589, (16, 17, 18, 19)),                               # JCB
        (62, 62, (16, 17, 18, 19)),                                   # UnionPay
        (36, 36, (14, 15, 16, 17, 18, 19)), (300, 305, (14, 15, 16, 17, 18, 19)),  # Diners Club
        (3095, 3095, (14, 15, 16, 17, 18, 19)), (38, 39, (14, 15, 16, 17, 18, 19)),
        (5018, 5018, range(13, 20)), (5020, 5020, range(13, 20)),     # Maestro
        (5038, 5038, range(13, 20)), (5893, 5893, range(13, 20)), (6304, 6304, range(13, 20)),
        (6759, 6759, range(13, 20)), (6761, 6763, range(13, 20)),
    ))
#: groupings that mark a card number by themselves: 4-4-4-4 and the American Express 4-6-5.
_CARD_GROUPS = re.compile(r"\d{4}(?P<sep>[ -])\d{4}(?P=sep)\d{4}(?P=sep)\d{4}|\d{4}(?P<sep15>[ -])\d{6}(?P=sep15)\d{5}")


def card_network_ok(digits: str) -> bool:
    """True when an ASCII digit string has the issuer prefix (IIN) and a length of Visa,
    Mastercard (51-55, 2221-2720), American Express, Discover, JCB, UnionPay, Diners Club or
    Maestro, as the networks publish their ranges (ISO/IEC 7812-1 numbering)."""
    return any(len(digits) in lengths and lo <= int(digits[:width]) <= hi
               for (lo, hi), width, lengths in _NETWORKS)


def _valid_card(m: re.Match) -> bool:
    # Luhn passes one random number in ten, so a card also needs a network's prefix and length,
    # and either its printed grouping or a card word before it on the line.
    s = m.group(0)
    digits = _NON_DIGIT.sub("", s)
    if not (luhn_ok(digits) and card_network_ok(digits)):
        return False
    return _CARD_GROUPS.fullmatch(s) is not None or _keyword_before(_CARD_KEYWORD, m, 40)


def _keyword_before(keyword: re.Pattern, m: re.Match, window: int) -> bool:
    """True when `keyword` occurs in the `window` characters before match `m` (on its line)."""
    return keyword.search(m.string, max(0, m.start() - window), m.start()) is not None


def _valid_phone(m: re.Match) -> bool:
    # Grouped numbers are also dates, amounts, order and invoice numbers: a phone needs evidence,
    # a +country code, a parenthesised area code, the North American shape or a phone word.
    s = m.group(0)
    number = _EXTENSION_TAIL.sub("", s)
    if not 9 <= len(_NON_DIGIT.sub("", number)) <= 15:
        return False
    if not _not_labelled(m):
        return False
    return (s[0] == "+" or "(" in s or _NANP.fullmatch(number) is not None
            or _keyword_before(_PHONE_KEYWORD, m, 24))


def _valid_ip(m: re.Match) -> bool:
    if _VERSION_BEFORE.search(m.string, max(0, m.start() - 12), m.start()):
        return False  # "version 1.2.3.4", "v1.2.3.4"
    try:
        ipaddress.ip_address(m.group(0))
    except ValueError:
        return False
    return True


def _valid_ipv6(m: re.Match) -> bool:
    # Slices in code ("x[::2]") and loopback "::1" parse as IPv6 but identify nobody: require
    # three or more non-empty groups and a non-loopback address.
    s = m.group(0)
    if sum(1 for g in s.split(":") if g) < 3:
        return False
    try:
        addr = ipaddress.ip_address(s)
    except ValueError:
        return False
    return isinstance(addr, ipaddress.IPv6Address) and not addr.is_loopback

"""PII redaction: typed placeholders, validators (Luhn, ipaddress), no damage to ordinary numbers."""

from __future__ import annotations

import pytest

from gptforge.data.pii import PIIRedactor, luhn_ok
from gptforge.data.readers import Document


@pytest.mark.parametrize("text, expected, kind", [
    ("Contact john.doe+x@example.co.uk today.", "Contact <EMAIL> today.", "email"),
    ("from alice@mail.example.org>", "from <EMAIL>>", "email"),
    ("server at 192.168.1.10 now", "server at <IP_ADDRESS> now", "ip_address"),
    ("v6 2001:db8::8a2e:370:7334 ok", "v6 <IP_ADDRESS> ok", "ip_address"),
    ("call +1 415-555-0132 now", "call <PHONE> now", "phone"),
    ("tel (020) 7946 0958.", "tel <PHONE>.", "phone"),
    ("card 4111 1111 1111 1111 ok", "card <CREDIT_CARD> ok", "credit_card"),
    ("amex 378282246310005.", "amex <CREDIT_CARD>.", "credit_card"),
])
def test_redacts(text, expected, kind):
    r = PIIRedactor()
    assert r.redact(text) == expected
    assert dict(r.counts) == {kind: 1}


@pytest.mark.parametrize("text", [
    "not an ip 10.0.0.256 and version 1.2.3",
    "card-like 4111 1111 1111 1112 fails Luhn",
    "time 12:30:45, slice x[::2], loopback ::1, a::b",
    "year 2024, count 123456, pi 3.14159, date 2024-05-06, isbn 978-3-16-148410-0, short 555-0100",
    "an @decorator and user@localhost",
])
def test_leaves_ordinary_text(text):
    r = PIIRedactor()
    assert r.redact(text) == text
    assert not r.counts


def test_luhn_and_kinds_option():
    assert luhn_ok("4111111111111111") and not luhn_ok("4111111111111112")
    r = PIIRedactor(kinds=("email",))
    assert r.redact("a@b.example.com 192.168.0.1") == "<EMAIL> 192.168.0.1"
    with pytest.raises(ValueError, match="unknown PII kind"):
        PIIRedactor(kinds=("ssn",))
    doc = Document("no pii here", "1")
    assert PIIRedactor()(doc) is doc

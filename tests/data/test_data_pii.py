"""PII redaction: typed placeholders, validators (Luhn, ipaddress), no damage to ordinary numbers."""

from __future__ import annotations

import pytest

from gptforge.data.pii import PIIRedactor, id_check_character, luhn_ok, resident_id_ok
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
    "signed numbers +35236450.6, +12345678 and +123456789012.5",
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


# ---- Chinese text -----------------------------------------------------------------------------
# Every number below is made up: the ID numbers were built with their check character.


@pytest.mark.parametrize("text, expected, kind", [
    ("手机13812345678，请回电。", "手机<PHONE>，请回电。", "phone"),
    ("请拨打+86 138-1234-5678联系", "请拨打<PHONE>联系", "phone"),
    ("电话 0086 13912345678 或", "电话 <PHONE> 或", "phone"),
    ("手机：158 1234 5678。", "手机：<PHONE>。", "phone"),
    ("call 13812345678 now", "call <PHONE> now", "phone"),
    ("or call +14155550132.", "or call <PHONE>.", "phone"),
    ("总机010-62345678转", "总机<PHONE>转", "phone"),
    ("上海(021)12345678", "上海<PHONE>", "phone"),
    ("深圳0755-1234567。", "深圳<PHONE>。", "phone"),
    ("身份证号11010519491231002X，", "身份证号<ID_NUMBER>，", "id_number"),
    ("旧证110105491231002已作废", "旧证<ID_NUMBER>已作废", "id_number"),
    ("邮箱zhang@example.com联系我", "邮箱<EMAIL>联系我", "email"),
    ("手机１３８１２３４５６７８。", "手机<PHONE>。", "phone"),
    ("电话：（０１０）６２３４５６７８", "电话：<PHONE>", "phone"),
    ("邮箱ｚｈａｎｇ＠ｅｘａｍｐｌｅ．ｃｏｍ。", "邮箱<EMAIL>。", "email"),
    ("服务器192.168.1.10端口", "服务器<IP_ADDRESS>端口", "ip_address"),
    ("请拨打010-62345678转123联系", "请拨打<PHONE>联系", "phone"),          # the extension goes too
    ("电话 (010) 6234 5678 转 8021。", "电话 <PHONE>。", "phone"),
    ("座机：0755-8888 6666", "座机：<PHONE>", "phone"),
    ("Call 415-555-0132 ext. 12 now", "Call <PHONE> now", "phone"),
    ("身份证号 110105 19491231 002X 已登记", "身份证号 <ID_NUMBER> 已登记", "id_number"),  # in its groups
    ("编号110105-19491231-002X。", "编号<ID_NUMBER>。", "id_number"),
    ("邮箱 张三@例子.中国 联系", "邮箱 <EMAIL> 联系", "email"),              # internationalised
    ("或写信给user@例子.cn。", "或写信给<EMAIL>。", "email"),
    ("邮箱：wang@邮件.公司，", "邮箱：<EMAIL>，", "email"),
])
def test_redacts_chinese(text, expected, kind):
    r = PIIRedactor()
    assert r.redact(text) == expected
    assert dict(r.counts) == {kind: 1}


@pytest.mark.parametrize("text", [
    "1998年1月1日成立，2024年营收1234万元，同比增长15%。",
    "根据第12345号文件，共有3600人参加，编号20240101。",
    "订单号12345678901没有对应的手机号段。",          # 11 digits from 12: no mobile range
    "13812345678元的预算。",                           # an amount, not a phone
    "号码11010519491231002Y和11010519491231003X无效。",  # bad check characters
    "旧证990105491231002的省份代码不存在。",            # province 99
    "旧证110105491331002的日期不存在。",                # month 13
    "电话012-3456789不是区号。",                        # 012 is no area code
    "共110105 19491231 002Y件",                         # grouped, bad check character
    "关注@张三 的微博，或 @李四。",                        # a mention has no domain
])
def test_leaves_ordinary_chinese_numbers(text):
    r = PIIRedactor()
    assert r.redact(text) == text
    assert not r.counts


def test_id_and_mobile_checks_run_before_the_card_check():
    # Both strings pass Luhn by chance: the card check alone would call them cards.
    assert luhn_ok("110105194912310150") and luhn_ok("8613812345678")
    r = PIIRedactor()
    assert r.redact("证件110105194912310150，电话+86 138-1234-5678") == "证件<ID_NUMBER>，电话<PHONE>"
    assert dict(r.counts) == {"id_number": 1, "phone": 1}
    # With phones and IDs off they stay as written; they still never become cards.
    r = PIIRedactor(kinds=("credit_card",))
    text = "证件110105194912310150，电话+86 138-1234-5678，卡4111 1111 1111 1111"
    assert r.redact(text) == "证件110105194912310150，电话+86 138-1234-5678，卡<CREDIT_CARD>"


def test_id_check_character_and_validator():
    assert id_check_character("11010519491231002") == "X"
    assert resident_id_ok("11010519491231002X") and resident_id_ok("11010519491231002x")
    assert not resident_id_ok("11010519491231002Y")
    assert not resident_id_ok("11010519490231002X")  # 31 February fails before the check character
    assert resident_id_ok("110105491231002") and not resident_id_ok("110105490230002")


def test_chinese_guides_have_no_false_positives(zh_guides):
    r = PIIRedactor()
    for text in zh_guides:
        assert r.redact(text) == text
    assert not r.counts

"""Normalization: BOM, line ends, NFC; empty documents dropped and counted."""

from __future__ import annotations

import unicodedata

from gptforge.data.normalize import NormalizeStats, normalize_documents, normalize_text
from gptforge.data.readers import Document


def test_bom_line_ends_and_nfc():
    decomposed = "cafe\u0301"  # e + combining acute accent
    assert unicodedata.normalize("NFC", decomposed) != decomposed
    out = normalize_text("\ufeffline one\r\nline two\rline three\n" + decomposed)
    assert out == "line one\nline two\nline three\ncaf\u00e9"
    # A BOM that is not at the start is text (zero-width no-break space) and stays.
    assert normalize_text("a\ufeffb") == "a\ufeffb"
    # NFC keeps compatibility characters that NFKC would rewrite.
    assert normalize_text("ﬁ ² Ａ") == "ﬁ ² Ａ"
    assert normalize_text("ﬁ ² Ａ", form="NFKC") == "fi 2 A"


def test_empty_documents_dropped_and_counted():
    docs = [Document(t, str(i)) for i, t in enumerate(["a\r\n", "", " \r\n\t", "\ufeff", "b"])]
    stats = NormalizeStats()
    out = list(normalize_documents(docs, stats))
    assert [d.text for d in out] == ["a\n", "b"]
    assert [d.id for d in out] == ["0", "4"]
    assert stats.documents_in == 5 and stats.documents_out == 2
    assert stats.dropped == {"empty": 3}
    assert stats.characters_out == 3

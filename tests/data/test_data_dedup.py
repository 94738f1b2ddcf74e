"""Exact and MinHash near-duplicate removal: real duplicates go, different editions stay,
detection rates agree with datasketch and with the LSH formula."""

from __future__ import annotations

import random
from pathlib import Path

import numpy as np
import pytest

from gptforge.data.dedup import (
    NO_KEY,
    UnionFind,
    band_hashes,
    candidate_probability,
    cluster_sizes,
    dedup_words,
    duplicate_mask,
    exact_hash,
    minhash_signatures,
    shingles,
)
from gptforge.data.normalize import normalize_text
from gptforge.data.text_stats import words

SHARED = Path(__file__).resolve().parents[3] / "shared" / "data"


def test_union_find_keeps_smallest():
    uf = UnionFind(6)
    uf.union(4, 2)
    uf.union(5, 4)
    uf.union(1, 3)
    assert uf.roots().tolist() == [0, 1, 2, 1, 2, 2]
    drop, roots = duplicate_mask(exact=np.array([7, 3, 7, 9, 3, 7], dtype=np.uint64))
    assert drop.tolist() == [False, False, True, False, True, True]
    assert roots.tolist() == [0, 1, 0, 3, 1, 0]
    assert cluster_sizes(roots) == {2: 1, 3: 1}


def test_exact_and_near_on_generated_variants(stdlib_texts):
    docs = [t for t in stdlib_texts if len(words(t)) > 300][:10]
    rng = random.Random(0)
    variants = []
    for d in docs[:5]:
        ws = d.split(" ")
        i = rng.randrange(len(ws))
        ws[i] = ws[i] + "x"  # one word changed: Jaccard ~0.99
        variants.append(" ".join(ws))
    corpus = docs + [docs[0], docs[3]] + variants  # 2 exact copies, 5 near copies
    sig = minhash_signatures(corpus)
    ex = np.array([exact_hash(t) for t in corpus], dtype=np.uint64)
    drop_exact, _ = duplicate_mask(exact=ex)
    assert np.flatnonzero(drop_exact).tolist() == [10, 11]
    drop, roots = duplicate_mask(exact=ex, bands=band_hashes(sig))
    assert np.flatnonzero(drop).tolist() == list(range(10, 17))  # originals (smaller index) kept
    assert roots[10:].tolist() == [0, 3, 0, 1, 2, 3, 4]


def _variant(ws, q, rng, vocab):
    return [rng.choice(vocab) if rng.random() < q else w for w in ws]


def test_detection_rates_match_datasketch_and_theory(stdlib_texts):
    datasketch = pytest.importorskip("datasketch")
    vocab = sorted({w for t in stdlib_texts for w in words(t)})
    source = [w for t in stdlib_texts for w in words(t)]
    rng = random.Random(1)
    per_level = 60
    for q in (0.02, 0.04, 0.06, 0.12):
        pairs = []
        for _ in range(per_level):
            start = rng.randrange(len(source) - 250)
            ws = source[start:start + 250]
            pairs.append((" ".join(ws), " ".join(_variant(ws, q, rng, vocab))))
        flat = [t for p in pairs for t in p]
        bands = band_hashes(minhash_signatures(flat))
        ours = np.array([(bands[2 * k] == bands[2 * k + 1]).any() for k in range(per_level)])
        jac = []
        lsh_hits = []
        for a, b in pairs:
            sa, sb = set(shingles(a)), set(shingles(b))
            jac.append(len(sa & sb) / len(sa | sb))
            ma, mb = datasketch.MinHash(num_perm=112, seed=3), datasketch.MinHash(num_perm=112, seed=3)
            ma.update_batch([s.encode() for s in sa])
            mb.update_batch([s.encode() for s in sb])
            lsh = datasketch.MinHashLSH(num_perm=112, params=(14, 8))
            lsh.insert("a", ma)
            lsh_hits.append(bool(lsh.query(mb)))
        expected = float(candidate_probability(np.array(jac)).mean())
        # 60 Bernoulli trials: standard error <= 0.065; allow ~3 of them.
        assert abs(ours.mean() - expected) < 0.2, (q, ours.mean(), expected)
        assert abs(ours.mean() - np.mean(lsh_hits)) < 0.25, (q, ours.mean(), np.mean(lsh_hits))


@pytest.mark.skipif(not (SHARED / "openshakespeare").is_dir(), reason="shared/data/openshakespeare absent")
def test_openshakespeare_milton_copies_go_folio_editions_stay():
    files = sorted((SHARED / "openshakespeare").rglob("*.txt"))
    texts = [normalize_text(p.read_bytes().decode("utf-8", "replace")) for p in files]
    ex = np.array([exact_hash(t) for t in texts], dtype=np.uint64)
    drop, roots = duplicate_mask(exact=ex, bands=band_hashes(minhash_signatures(texts)))
    dropped = {files[i].name for i in np.flatnonzero(drop)}
    byte_copies = {}
    for p in files:
        byte_copies.setdefault(p.read_bytes(), []).append(p.name)
    expected = {name for names in byte_copies.values() for name in sorted(names, key=lambda n: files.index(
        next(f for f in files if f.name == n)))[1:]}
    assert expected and expected <= dropped  # every byte-identical copy but one goes
    assert not any(f.parent.name == "shakespeare" for f in files if f.name in dropped)  # editions stay
    for name in ("lear_gut.txt", "lear_gut_f.txt"):
        assert name not in dropped


def test_fineweb_simplification_before_shingling():
    assert dedup_words("Hello, World!  It's 3.14 or 1,000 -- café ÉTÉ_x") == \
        ["hello", "world", "it", "s", "0", "or", "0", "cafe", "ete", "x"]
    assert dedup_words("Hello, World! 3.14", simplify=False) == ["hello", "world", "3", "14"]
    assert dedup_words("我们测试中文。") == list("我们测试中文")  # one word per character
    a = "Version 1.2 of the library, released on 2023-01-05, fixed twelve bugs in the parser module."
    b = "version 7.9 of the library released on 1999-12-31 -- fixed twelve bugs in the parser module"
    assert shingles(a) == shingles(b)
    assert shingles(a, simplify=False) != shingles(b, simplify=False)


def test_ascii_fast_path_splits_like_the_unicode_pattern(stdlib_texts):
    from gptforge.data.dedup import _NUMBER, _simplify_patterns

    word, _ = _simplify_patterns()
    ascii_texts = [t for t in stdlib_texts if t.isascii()][:10]
    assert ascii_texts
    for t in ascii_texts:
        assert dedup_words(t) == word.findall(_NUMBER.sub("0", t.lower()))
    assert dedup_words("नमस्ते दुनिया") == ["नमसत", "दनिया"]  # Mn (virama, e, u signs) dropped as FineWeb does; Mc (i, aa signs) stay inside words


def test_nonspacing_table_deletes_what_the_mark_pattern_deletes():
    from gptforge.data.dedup import _nonspacing_table, _simplify_patterns

    _, marks = _simplify_patterns()
    every = "".join(chr(c) for c in range(1, 0x110000) if not 0xD800 <= c <= 0xDFFF)
    assert every.translate(_nonspacing_table()) == marks.sub("", every)
    assert len(every) - len(marks.sub("", every)) > 1900  # the Mn of Unicode 15: about 1,950


def test_short_documents_are_not_near_duplicate_candidates():
    texts = ["only four words here", "only four words here", "Only four, words here!"]
    sig = minhash_signatures(texts)
    keys = band_hashes(sig)
    assert (keys == NO_KEY).all()
    drop, _ = duplicate_mask(bands=keys)
    assert not drop.any()  # datatrove/FineWeb: no signature under n words
    drop_exact, _ = duplicate_mask(exact=np.array([exact_hash(t) for t in texts], dtype=np.uint64), bands=keys)
    assert drop_exact.tolist() == [False, True, False]  # exact dedup still sees them
    drop, _ = duplicate_mask(bands=band_hashes(minhash_signatures(texts, skip_short=False)))
    assert drop.tolist() == [False, True, True]  # the old rule: one shingle of all the words
    five = minhash_signatures(["one two three four five", "One, two; three four five."])
    assert (five[0] == five[1]).all() and not (band_hashes(five) == NO_KEY).any()


def test_separator_classes_cover_every_plane():
    import unicodedata

    from gptforge.data.dedup import _char_class

    skipped = [c for c in list(range(0x20000, 0xE0000)) + list(range(0xE1000, 0x110000))
               if unicodedata.category(chr(c)) in ("Cc", "Mn") or unicodedata.category(chr(c))[0] in "PS"]
    assert skipped == []
    assert "\\-" in _char_class(lambda cat: cat == "Pd")

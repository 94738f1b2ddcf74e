"""What `gptforge prepare` keeps per step and per language, its speed per core, and tokens per language.

Runs prepare once per recipe on one input (a folder or file) with `--languages`, then prints from
report.json and meta.json:
- per step: documents in and out, and the removals per language (the steps' "removed LANG"
  counts, and the langid step's "LANG dropped");
- curation MB per CPU second (input UTF-8 bytes over the CPU seconds the curate shards took in
  their processes: MB/s per core, fair on a shared machine) and the 1-minute load average;
- bytes and characters per token per language on the val split (prepare_config.val_languages).

Input: any text, e.g. the Chinese of Debian's manpages-zh and debian-reference-zh-cn packages
(`apt-get download`, `dpkg-deb -x`, roff/HTML markup stripped, one file per page; licences GFDL-1.2+
and GPL-2+: measure, never commit), or English prose.

Usage: python bench/language_prepare.py INPUT --languages zh [--recipes default web] [--workers 2]
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from machine import cpu_description  # noqa: E402

from gptforge.data.prepare import PrepareConfig, prepare  # noqa: E402


def step_rows(report: dict) -> list[str]:
    """One line per step: documents in -> out, and the removals per language."""
    rows = []
    for s in report["steps"]:
        per_lang = {k: v for k, v in s["counts"].items() if k.startswith("removed ") or k.endswith(" dropped")}
        langs = ", ".join(f"{k}: {v:,}" for k, v in sorted(per_lang.items()))
        rows.append(f"| {s['name']} | {s['documents_in']:,} | {s['documents_out']:,} | {langs} |")
    return rows


def run(inputs: str, recipe: str, languages: list[str], workers: int, val_fraction: float) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        out = Path(tmp) / "out"
        res = prepare(PrepareConfig(inputs=[inputs], out=str(out), recipe=recipe, languages=languages,
                                    workers=workers, val_fraction=val_fraction), show_progress=False)
        report = json.loads((out / "report.json").read_text(encoding="utf-8"))
    load = os.getloadavg()[0]
    cur = report["throughput"]["curate"]
    mb = report["inputs"]["input_bytes"] / 1e6
    cpu = cur.get("shard_cpu_seconds") or float("nan")
    print(f"\n### recipe {recipe}, --languages {' '.join(languages)}: {mb:.2f} MB input, "
          f"{res.meta['vocab_size']} vocabulary, load {load:.1f}")
    print("| step | documents in | documents out | removed per language |\n|---|---:|---:|---|")
    print("\n".join(step_rows(report)))
    print(f"curate: {cpu:.1f} CPU s in the shards, {mb / cpu:.2f} MB/s per core; wall {cur.get('seconds', 0):.1f} s")
    print("| val language | documents | characters | bytes | tokens | bytes/token | characters/token |\n"
          "|---|---:|---:|---:|---:|---:|---:|")
    for lang, c in res.meta["prepare_config"]["val_languages"].items():
        print(f"| {lang} | {c['documents']:,} | {c['characters']:,} | {c['bytes']:,} | {c['tokens']:,} | "
              f"{c['bytes_per_token']} | {c['characters_per_token']} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("input")
    ap.add_argument("--languages", nargs="+", required=True)
    ap.add_argument("--recipes", nargs="+", default=["default", "web"])
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--val-fraction", type=float, default=0.05)
    args = ap.parse_args()
    print(cpu_description())
    for recipe in args.recipes:
        run(args.input, recipe, args.languages, args.workers, args.val_fraction)


if __name__ == "__main__":
    main()

"""`gptforge prepare INPUT... --out DIR`: raw text -> tokenizer -> token shards."""

from __future__ import annotations

import argparse
import logging
import sys

from gptforge.data.shards import DEFAULT_MAX_SHARD_BYTES


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="gptforge prepare",
        description=(
            "Read raw text, normalize it (BOM, line ends, Unicode NFC), split documents into "
            "train/val/test, train a byte-level BPE tokenizer (or load one) and write token shards "
            "(meta.json, tokenizer.json, {train,val,test}_NNN.bin) for `gptforge pretrain`."),
        epilog=(
            "Inputs: files, folders (walked recursively) and glob patterns of .txt/.md (one document per "
            "file, or per --doc-separator piece), .jsonl/.json (one document per line or array item), .csv, "
            ".parquet and .arrow (one per row; Hugging Face save_to_disk folders too), .tar archives of such "
            "files, each plain or compressed as .gz/.zst/.bz2/.xz; hf:NAME[:CONFIG] streams a Hugging Face "
            "dataset (needs the datasets package). Binary or damaged files are skipped with a warning and "
            "counted. A killed run resumes when the same command is run again. report.json and report.html "
            "in the output say what each recipe step removed and why. "
            "Example: gptforge prepare corpus/ extra/*.jsonl.zst --out data/mycorpus --vocab-size 16000 --recipe web"),
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    p.add_argument("inputs", nargs="*", metavar="INPUT", help="files, folders or glob patterns to read")
    p.add_argument("--out", metavar="DIR", help="shard folder to write (must not exist or be empty, unless --overwrite)")
    p.add_argument("--recipe", default="default", metavar="NAME|FILE",
                   help="curation recipe: a built-in (none, default, web, code) or a YAML file; see --show-recipe")
    p.add_argument("--show-recipe", metavar="NAME|FILE", help="print a recipe as YAML and exit")
    p.add_argument("--languages", metavar="L1,L2", default=None,
                   help="keep only documents in these languages (ISO 639 codes, e.g. en,zh), detected with the "
                        "bundled fastText lid.176 model; sets (or adds) the recipe's langid step")
    p.add_argument("--language-score", type=float, default=None, metavar="X",
                   help="minimum language-ID probability with --languages (recipe's value, else 0.65)")
    p.add_argument("--doc-separator", default=None, metavar="S",
                   help='split .txt files into documents at this string (e.g. "<|endoftext|>")')
    p.add_argument("--limit", type=int, default=0, metavar="N", help="read only the first N documents (0: all), for trials")
    p.add_argument("--strict", action="store_true",
                   help="stop at the first bad file, record or line instead of skipping and counting it")
    p.add_argument("--shard-bytes", type=int, default=0, metavar="B",
                   help="input bytes per work shard (the unit of parallel work and of resume after a crash; "
                        "0: the corpus size / 64, between 1 MiB and 64 MiB)")
    p.add_argument("--keep-work", action="store_true", help="keep the work folder (.OUT.work) after success")
    p.add_argument("--vocab-size", type=int, default=0, metavar="N",
                   help="vocabulary size of the trained tokenizer, including the 256 byte tokens and <|endoftext|> "
                        "(a small corpus may stop short of it); 0 (the default): 4*sqrt(characters) rounded to a "
                        "power of two, between 512 and 32768 (1 MB of text: 4096); a warning when a size given "
                        "is more than 4x off that; ignored with --tokenizer")
    p.add_argument("--tokenizer", metavar="FILE", default=None,
                   help="use this Hugging Face tokenizer.json (it must have <|endoftext|>) instead of training one")
    p.add_argument("--text-field", default="auto", metavar="F",
                   help="JSON field / Parquet, CSV or Arrow column holding the document text; auto: the first of "
                        "text, story, content, raw_content that a record has")
    p.add_argument("--val-fraction", type=float, default=0.01, metavar="X",
                   help="fraction of documents in the validation split (at least one document when the corpus has 2+)")
    p.add_argument("--test-fraction", type=float, default=0.0, metavar="X",
                   help="fraction of documents in the test split (at least one document when > 0 and the corpus has 3+)")
    p.add_argument("--seed", type=int, default=1337, metavar="N",
                   help="seed of the document-id hash that decides each document's split")
    p.add_argument("--workers", type=int, default=0, metavar="N",
                   help="tokenizer worker processes (0: one per available core); the output does not depend on it")
    p.add_argument("--max-shard-bytes", type=int, default=DEFAULT_MAX_SHARD_BYTES, metavar="B",
                   help="start a new .bin file once one holds this many bytes (files end at document boundaries)")
    p.add_argument("--tokenizer-train-bytes", type=int, default=1_000_000_000, metavar="B",
                   help="train the tokenizer on at most this many characters of train-split text, in reading order (0: all)")
    p.add_argument("--min-frequency", type=int, default=2, metavar="N",
                   help="a byte pair must occur this many times to become a merge in the trained tokenizer")
    p.add_argument("--overwrite", action="store_true",
                   help="replace an existing shard folder at --out (only once the new one is complete)")
    p.add_argument("--no-progress", action="store_true", help="do not draw progress bars")
    return p


def main(argv: list[str]) -> int:
    """Run `gptforge prepare`; returns the exit code (0 ok, 1 bad input, 2 usage error)."""
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.show_recipe:
        from gptforge.data.pipeline import show_recipe

        try:
            print(show_recipe(args.show_recipe), end="")
        except (FileNotFoundError, ValueError) as e:
            print(f"gptforge prepare: error: {e}", file=sys.stderr)
            return 1
        return 0
    if not args.inputs or not args.out:
        parser.error("INPUT and --out are required (or --show-recipe NAME)")
    from rich.console import Console
    from rich.logging import RichHandler
    from rich.table import Table

    from gptforge.data.prepare import PrepareConfig, prepare, summary_rows

    err = Console(stderr=True)
    logger = logging.getLogger("gptforge.data")
    if not logger.handlers:
        logger.addHandler(RichHandler(console=err, show_time=False, show_path=False))
        logger.setLevel(logging.INFO)
    cfg = PrepareConfig(
        inputs=args.inputs, out=args.out, vocab_size=args.vocab_size, tokenizer=args.tokenizer,
        text_field=args.text_field, val_fraction=args.val_fraction, test_fraction=args.test_fraction,
        seed=args.seed, workers=args.workers, max_shard_bytes=args.max_shard_bytes,
        tokenizer_train_bytes=args.tokenizer_train_bytes, min_frequency=args.min_frequency,
        overwrite=args.overwrite, recipe=args.recipe, doc_separator=args.doc_separator, limit=args.limit,
        strict=args.strict, shard_bytes=args.shard_bytes, keep_work=args.keep_work,
        languages=[x.strip() for x in args.languages.split(",") if x.strip()] if args.languages else None,
        language_score=args.language_score)
    try:
        result = prepare(cfg, show_progress=not args.no_progress)
    except (FileNotFoundError, FileExistsError, ValueError, ImportError) as e:
        print(f"gptforge prepare: error: {e}", file=sys.stderr)
        return 1
    table = Table(title=f"prepared {result.out_dir}", show_header=False)
    table.add_column(style="bold")
    table.add_column()
    for label, value in summary_rows(result):
        table.add_row(label, value)
    Console().print(table)
    print(f"report: {result.out_dir / 'report.html'}")
    return 0

"""`gptforge prepare INPUT... --out DIR`: raw text -> tokenizer -> token shards."""

from __future__ import annotations

import dataclasses
import logging
from dataclasses import dataclass, field
from typing import Optional

from gptforge.data.prepare import PrepareConfig
from gptforge.errors import OptionError
from gptforge.options import command_parser, parse_command

# One description: `gptforge --help` lists SUMMARY (read from this file unimported); DESCRIPTION begins with it.
SUMMARY = ("Read raw text (txt/md/jsonl/json/csv/parquet/arrow/tar, plain or compressed; hf:NAME), curate "
           "it, train or load a tokenizer, write token shards.")

DESCRIPTION = SUMMARY + """

In order: read the inputs, normalize the text (BOM, line ends, Unicode NFC), curate it (a recipe of
filters, PII redaction and deduplication), split documents into train/val/test, train a byte-level
BPE tokenizer (or load one) and write token shards (meta.json, tokenizer.json,
{train,val,test}_NNN.bin) for `gptforge pretrain`.

Inputs: files, folders (walked recursively) and glob patterns of .txt/.md (one document per file,
or per --doc-separator piece), .jsonl/.json (one document per line or array item), .csv, .parquet
and .arrow (one per row; Hugging Face save_to_disk folders too), .tar archives of such files, each
plain or compressed as .gz/.zst/.bz2/.xz; hf:NAME[:CONFIG] streams a Hugging Face dataset (needs
the datasets package). Binary or damaged files are skipped with a warning and counted. A killed
run resumes when the same command is run again. report.json and report.html in the output say
what each recipe step removed and why.
Example: gptforge prepare corpus/ extra/*.jsonl.zst --out data/mycorpus --vocab-size 16000 --recipe web"""


@dataclass
class PrepareOptions(PrepareConfig):
    inputs: list[str] = field(default_factory=list)
    """Files, folders (walked recursively) and glob patterns to read."""
    out: Optional[str] = None
    """Shard folder to write (must not exist or be empty, unless --overwrite)."""
    show_recipe: Optional[str] = None
    """Print a recipe (a built-in name or a YAML file) as YAML, with --languages applied and the Gopher/C4/FineWeb
    parameters in force per language, and exit."""
    quiet: bool = field(default=False, metadata={"aliases": ("--no-progress",)})
    """No progress bars (on a terminal) or progress lines (otherwise) on stderr."""
    source: Optional[list[str]] = None
    """Named sources instead of INPUT: NAME=PATH (PATH as an INPUT), repeated or several after one
    --source; one tokenizer over all, shards per source under OUT/NAME/ with their own splits and
    report, OUT/meta.json listing them (`gptforge pretrain --data OUT` trains on the mixture)."""
    source_recipe: Optional[list[str]] = None
    """With --source: NAME=RECIPE, the curation recipe of one source (others take --recipe)."""
    verify: Optional[str] = None
    """Check a shard folder (or a --source folder) in full and exit: every .bin file's SHA-256
    against meta.json and every id below the vocabulary size."""
    tokenizer_weights: Optional[str] = None
    """With --source: NAME=W,... share of the tokenizer's training text per source (default: in
    proportion to each source's train text; a source gives at most all of its text)."""


def build_parser():
    return command_parser("gptforge prepare", DESCRIPTION, PrepareOptions, positional=("inputs",))


def main(argv: list[str]) -> int:
    """Run `gptforge prepare`; returns the exit code (0 ok; gptforge.errors: 1 bad input, 2 bad options)."""
    opts, _ = parse_command(build_parser(), _merge_repeated(argv, ("--source", "--source-recipe")))
    if opts.show_recipe:
        from gptforge.data.pipeline import show_recipe

        print(show_recipe(opts.show_recipe, opts.languages, opts.quality_options()), end="")
        return 0
    if opts.verify:
        if opts.inputs or opts.source or opts.out:  # --verify reads a finished folder; nothing else runs
            raise OptionError(f"--verify {opts.verify} checks a finished shard folder and takes no input files, "
                              "--source or --out; run it on its own")
        from gptforge.data.shard_verify import verify_shards

        got = verify_shards(opts.verify)
        print(f"{opts.verify}: ok, {got['files']} files, {got['bytes']:,} bytes, every id below the vocabulary size"
              + (", checksums match meta.json" if got["checksums"] else " (meta.json records no checksums)"))
        return 0
    if opts.source and opts.inputs:
        raise OptionError("give either INPUT files or --source NAME=PATH, not both")
    if not (opts.inputs or opts.source) or not opts.out:
        raise OptionError("INPUT (or --source NAME=PATH) and --out are required (or --show-recipe NAME)")
    from rich.console import Console
    from rich.logging import RichHandler

    from gptforge.data.prepare import prepare, print_summary

    err = Console(stderr=True)
    logger = logging.getLogger("gptforge.data")
    if not logger.handlers:
        logger.addHandler(RichHandler(console=err, show_time=False, show_path=False))
        logger.setLevel(logging.INFO)
    values = {f.name: getattr(opts, f.name) for f in dataclasses.fields(PrepareConfig)}
    if values["languages"]:  # `--languages en,zh` and `--languages en zh` both work
        values["languages"] = [x.strip() for v in values["languages"] for x in v.split(",") if x.strip()]
    if opts.source:
        return _prepare_sources(opts, values)
    result = prepare(PrepareConfig(**values), show_progress=not opts.quiet)
    print_summary(result, f"prepared {result.out_dir}")
    print(f"report: {result.out_dir / 'report.html'}")
    return 0


def _merge_repeated(argv: list[str], flags: tuple[str, ...]) -> list[str]:
    """`--source a=x --source b=y` -> `--source a=x b=y` (a list option takes all its values once)."""
    rest: list[str] = []
    values: dict[str, list[str]] = {f: [] for f in flags}
    i = 0
    while i < len(argv):
        if argv[i] in flags:
            j = i + 1
            while j < len(argv) and not argv[j].startswith("--"):
                j += 1
            values[argv[i]] += argv[i + 1:j]
            i = j
        else:
            rest.append(argv[i])
            i += 1
    return rest + [x for f, v in values.items() if v for x in (f, *v)]


def _prepare_sources(opts, values: dict) -> int:
    """--source: gptforge.data.prepare_sources.prepare_sources, then one summary line per source."""
    from rich.console import Console

    from gptforge.data.prepare import print_summary
    from gptforge.data.prepare_sources import parse_named, prepare_sources
    from gptforge.train.sources.mixture import parse_data_weights

    try:
        sources = {n: [p] for n, p in parse_named(opts.source, "--source").items()}
        recipes = parse_named(opts.source_recipe or [], "--source-recipe")
    except ValueError as e:
        raise OptionError(str(e)) from None
    weights = parse_data_weights(opts.tokenizer_weights) if opts.tokenizer_weights else None
    values = {**values, "inputs": [p for v in sources.values() for p in v]}
    result = prepare_sources(PrepareConfig(**values), sources, recipes, weights,
                             show_progress=not opts.quiet)
    console = Console()
    for name, r in result.sources.items():
        print_summary(r, f"source {name}: {r.out_dir}")
    for s in result.meta["sources"]:
        counts = ", ".join(f"{k} {v['tokens']:,} tokens / {v['documents']:,} docs" for k, v in s["splits"].items()
                           if v.get("tokens"))
        console.print(f"{s['name']}: {counts}; report: {result.out_dir / s['path'] / 'report.html'}", highlight=False)
    console.print(f"prepared {result.out_dir} (tokenizer shared by {len(result.meta['sources'])} sources)")
    return 0

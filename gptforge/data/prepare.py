"""`prepare`: raw text -> curated documents -> train/val/test split -> tokenizer -> shards -> report.

A short driver over the phases of `gptforge.data.phases`, each a module with its inputs and
outputs named, around one `WorkFolder` (`.OUT.work` beside the output) that owns every
intermediate file, done marker and atomic write, so that a killed run resumes:

1. read and curate (`phases.curate`): read, normalize and run the recipe's steps over each
   input shard in worker processes; corpus steps (boilerplate, dedup) over all shards' keys;
2. split (`phases.split`): each surviving document's split from a hash of its split key (a hash
   of its text, never of where it lies) and the seed,
   with the small-corpus rules (a split by position inside one big document);
3. tokenizer (`phases.tokenizer`): the given one, or a byte-level BPE trained on train text
   (the sample cut per shard in the workers, read back in shard order);
4. encode (`phases.encode`): each shard's documents tokenized per split in the workers (a big
   shard in byte windows, the same tokens);
5. write (`phases.write`): the token arrays appended in shard order, so the output is
   byte-identical whatever the number of workers; `report.json` and `report.html` beside them.

The per-shard work runs in an executor (`phases.pool.Executor`): local worker processes
(`WorkerPool`), or Ray tasks on a cluster (`phases.ray_executor.RayExecutor`, `--executor ray`),
with the same tasks over the same shards and the same output bytes; only this driver decides
the corpus steps, the splits and the tokenizer, and writes the output.

Memory is bounded by one shard per worker (a few tens of MB with the default shard size) plus
the BPE trainer's word counts and the dedup step's 16 bytes per document. A single document
larger than that is held whole as text a few times (read, normalized, curated), but tokenized,
counted for the BPE trainer and MinHashed in whitespace-cut pieces of
`phases.encode.TOKENIZE_PIECE_CHARS` (the same tokens and signatures): peak RSS per process
stays below `MEMORY_BASE_MB` MB + `MEMORY_BYTES_PER_CHAR` bytes per character of the largest
document (measured on 50 MB one-line files, recipe default, on a loaded machine: 488 MB in the
benchmark, 660-1,080 MB in the test beside other work (the peak moves with the tokenizer's
worker threads), against a bound of 1,450 MB; it was about 150-200 bytes per character before).
"""

from __future__ import annotations

import hashlib
import json
import logging
import shutil
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gptforge.data.normalize import NormalizeStats
from gptforge.data.phases.curate import auto_shard_bytes, plan_shards, run_curate
from gptforge.data.phases.encode import encode_documents, language_rates, run_encode
from gptforge.data.phases.pool import WorkerPool, default_workers
from gptforge.data.phases.split import (
    FEW_DOCUMENTS_ADVICE,
    EmptyCorpusError,
    SplitRule,
    assign_split,
    cut_pieces,
    run_split,
    split_score,
)
from gptforge.data.phases.tokenizer import check_vocab_size, run_tokenizer
from gptforge.data.phases.work import WorkFolder, fingerprint_of
from gptforge.data.phases.write import ReportInputs, run_write
from gptforge.data.pipeline import (
    Recipe,
    StepStats,
    build_recipe,
    load_recipe,
    warn_heavy_steps,
    with_languages,
    with_quality,
)
from gptforge.data.readers import ReadStats, expand_inputs
from gptforge.data.shards import DEFAULT_MAX_SHARD_BYTES, SPLITS, check_output_dir
from gptforge.data.tokenizer import MAX_VOCAB_SIZE, MIN_VOCAB_SIZE, Tokenizer
from gptforge.errors import OptionError
from gptforge.ranges import bounded, out_of_range

log = logging.getLogger("gptforge.data")

#: values of --executor: what runs the per-shard phases.
EXECUTORS = ("local", "ray")
#: the documented memory bound (see the module docstring), checked by a test on a 50 MB document.
MEMORY_BASE_MB = 250
MEMORY_BYTES_PER_CHAR = 24

__all__ = ["MEMORY_BASE_MB", "MEMORY_BYTES_PER_CHAR", "EmptyCorpusError", "PrepareConfig", "PrepareResult",
           "assign_split", "check_vocab_size", "cut_pieces", "encode_documents", "prepare",
           "split_score", "summary_rows", "with_languages", "work_fingerprint"]


@dataclass
class PrepareConfig:
    """Options of `gptforge prepare` (see `gptforge prepare --help` for each)."""

    inputs: list[str]
    """Files, folders (walked recursively) and glob patterns to read."""
    out: str
    """Shard folder to write (must not exist or be empty, unless --overwrite)."""
    vocab_size: int = 0
    """Vocabulary size of the trained tokenizer, including the 256 byte tokens and <|endoftext|> (a
    small corpus may stop short of it); 0 (the default): 4*sqrt(UTF-8 bytes) rounded to a power of
    two, between 512 and 32768 (1 MB of text: 4096), with room for the characters covering 99.9% of
    non-ASCII text (at most 2x; tokenizer.vocab_size_rule), with a warning when a size given is
    more than 4x off that; ignored with --tokenizer."""
    tokenizer: str | None = None
    """Use this Hugging Face tokenizer.json (it must have <|endoftext|>) instead of training one."""
    text_field: str = "auto"
    """JSON field / Parquet, CSV or Arrow column holding the document text; auto: the first of text,
    story, content, raw_content that a record has."""
    val_fraction: float = bounded(0.01, low=0, high=1, high_open=True)
    """Fraction of documents in the validation split (at least one document when the corpus has 2+;
    a single document is split by position)."""
    test_fraction: float = bounded(0.0, low=0, high=1, high_open=True)
    """Fraction of documents in the test split (at least one document when > 0 and the corpus has 3+)."""
    seed: int = 1337
    """Seed of the document-id hash that decides each document's split."""
    workers: int = bounded(0, low=0)
    """Worker processes of the per-shard phases (0: one per available core); the output does not
    depend on it. With --executor ray: the CPUs of the Ray instance started for the run (a cluster
    of its own has its own CPUs)."""
    executor: str = "local"
    """What runs the per-shard phases (curate, tokenizer sample, tokenize): local (worker processes
    on this machine) or ray (Ray tasks on a cluster; pip install 'gptforge[ray]'); the output is
    byte-identical. With ray, the inputs, --out (and its work folder .OUT.work beside it) and the
    working directory must be on storage every node mounts at the same path (docs/scale-out.md)."""
    ray_address: str | None = None
    """The Ray cluster of --executor ray (HOST:PORT of its head, or auto); default: RAY_ADDRESS, else
    a Ray instance started on this machine for the run."""
    max_shard_bytes: int = bounded(DEFAULT_MAX_SHARD_BYTES, low=0, low_open=True)
    """Start a new .bin file once one holds this many bytes (files end at document boundaries)."""
    tokenizer_train_bytes: int = bounded(1_000_000_000, low=0)
    """Train the tokenizer on at most this many UTF-8 bytes of train-split text, in reading order (0: all);
    a Chinese character is 3 bytes."""
    min_frequency: int = bounded(2, low=0)
    """A byte pair must occur this many times to become a merge in the trained tokenizer."""
    overwrite: bool = False
    """Replace an existing shard folder at --out (only once the new one is complete)."""
    recipe: str = "default"
    """Curation recipe: a built-in (none, default, web, code) or a YAML file; see --show-recipe."""
    doc_separator: str | None = None
    """Split .txt files into documents at this string (e.g. "<|endoftext|>")."""
    limit: int = bounded(0, low=0)
    """Read only the first N documents (0: all), for trials."""
    strict: bool = False
    """Stop at the first bad file, record or line instead of skipping and counting it."""
    shard_bytes: int = bounded(0, low=0)
    """Input bytes per work shard (the unit of parallel work and of resume after a crash; 0: the corpus
    size / 64, between 1 MiB and 64 MiB)."""
    keep_work: bool = False
    """Keep the work folder (.OUT.work) after success."""
    languages: list[str] | None = None
    """Keep only documents in these languages (ISO 639 codes, e.g. en zh, or en,zh), detected with the
    bundled fastText lid.176 model; sets (or adds) the recipe's langid step."""
    language_score: float | None = bounded(None, low=0, high=1)
    """Minimum language-ID probability with --languages (the recipe's value, else 0.65)."""
    encoding: str | None = None
    """Encoding of text, JSON and CSV files that have no byte-order mark (default UTF-8; UTF-16/32
    files with a BOM are always decoded), e.g. utf-16-le, latin-1, cp1252."""
    quality_reference: str | None = None
    """Files or a folder of documents like the ones wanted: train a quality classifier on them against a
    seeded sample of the curated input, score every document after the recipe (dedup included) and keep
    the best (--quality-keep); adds the recipe's `quality` step (needs scikit-learn: gptforge[curate])."""
    quality_model: str | None = None
    """A quality classifier trained by an earlier prepare (OUT/quality/model.npz) instead of --quality-reference."""
    quality_keep: float | None = bounded(None, low=0, high=1, low_open=True)
    """With the quality step: keep this fraction of the scored documents, in (0, 1] (default 0.5); per
    source with --source."""
    quality_threshold: float | None = bounded(None, low=0, high=1)
    """With the quality step: keep the documents scoring at least this (P(reference), in [0, 1]) instead of a
    fraction; a rerun that changes only the cut reuses the scores of the output it replaces."""

    def quality_options(self) -> dict[str, Any]:
        """The --quality-* options as the recipe's `quality` step takes them (None: not given)."""
        return {"reference": self.quality_reference, "model": self.quality_model, "keep": self.quality_keep,
                "threshold": self.quality_threshold}

    def split_rule(self) -> SplitRule:
        return SplitRule(self.seed, self.val_fraction, self.test_fraction)

    def validate(self) -> None:
        """Raise OptionError (a ValueError) naming the first invalid option."""
        if not self.inputs:
            raise OptionError("no input given: name at least one file, folder or glob")
        bad = out_of_range(self)  # each single-field range: its `bounded` declaration
        if bad is not None:
            raise OptionError(f"--{bad[0].replace('_', '-')} must be {bad[2]}, got {bad[1]}")
        if self.val_fraction + self.test_fraction >= 1.0:
            raise OptionError(f"--val-fraction + --test-fraction = {self.val_fraction + self.test_fraction} "
                             f"leaves nothing to train on; keep the sum below 1")
        if self.executor not in EXECUTORS:
            raise OptionError(f"--executor {self.executor!r}: choose one of {', '.join(EXECUTORS)}")
        if self.ray_address and self.executor != "ray":
            raise OptionError("--ray-address is for --executor ray; add --executor ray or leave it out")
        if self.quality_keep is not None and self.quality_threshold is not None:
            raise OptionError("--quality-keep and --quality-threshold: give one of them")
        for option, path in (("--quality-reference", self.quality_reference), ("--quality-model", self.quality_model)):
            if path is not None and not Path(path).exists():
                raise FileNotFoundError(f"{option} {path}: no such file or folder")
        if self.quality_model is not None:  # a file of another kind is refused now, not after curation
            from gptforge.data.quality import QualityModel

            QualityModel.load(self.quality_model)
        if self.doc_separator is not None and self.doc_separator == "":
            raise OptionError('--doc-separator "": an empty separator cuts nothing; give the string that ends each '
                             'document (e.g. "<|endoftext|>"), or leave the option out to read each file as one '
                             "document")
        if self.encoding:
            import codecs

            try:
                codecs.lookup(self.encoding)
            except LookupError:
                raise OptionError(f"--encoding {self.encoding!r}: not an encoding Python knows "
                                 f"(e.g. utf-8, utf-16-le, latin-1, cp1252)") from None
        if self.tokenizer is None and self.vocab_size != 0 and self.vocab_size < MIN_VOCAB_SIZE:
            raise OptionError(f"--vocab-size must be at least {MIN_VOCAB_SIZE} (256 bytes + <|endoftext|>), or 0 to "
                             f"choose it from the corpus size; got {self.vocab_size}")
        if self.tokenizer is None and self.vocab_size > MAX_VOCAB_SIZE:
            raise OptionError(f"--vocab-size must be at most {MAX_VOCAB_SIZE:,} (token ids are stored as uint32); got "
                             f"{self.vocab_size}")

    def meta_dict(self) -> dict[str, Any]:
        """The options that decide the output's content (not out, workers, ...), for meta.json."""
        d = asdict(self)
        for key in ("out", "workers", "overwrite", "keep_work", "executor", "ray_address"):
            d.pop(key)
        for key in ("quality_reference", "quality_model", "quality_keep", "quality_threshold"):
            d.pop(key)  # recorded in the recipe's quality step (recipe_steps), where they act
        return d


@dataclass
class PrepareResult:
    """What `prepare` wrote and counted."""

    out_dir: Path
    meta: dict[str, Any]
    read: ReadStats
    normalize: NormalizeStats
    seconds: float
    moved_to_split: dict[str, str] = field(default_factory=dict)  # split key -> split (small-corpus rules)
    steps: list[StepStats] = field(default_factory=list)
    report: dict[str, Any] = field(default_factory=dict)
    already_done: bool = False  # the output was complete for these inputs and options: nothing ran


def work_fingerprint(cfg: PrepareConfig, files: list[Path], curate_options: dict[str, Any]) -> dict[str, Any]:
    """The work folder's fingerprint: the input files and every option that changes any output.

    Covers the curation options (`curate_options`: recipe, text field, shard size, ...), and all of
    `PrepareConfig.meta_dict` (vocab size, min frequency, tokenizer training bytes, seed, split
    fractions, shard file size, ...), with a given --tokenizer file by its SHA-256 (its path says
    nothing about its content). Options that never change the output (workers, keep_work) are
    left out, so a rerun with another worker count resumes. A work folder with another
    fingerprint is deleted and the run starts over (`phases.work.WorkFolder.open`; the log line names
    what differs, `phases.work.fingerprint_difference`).
    """
    options = dict(curate_options)
    for key, value in cfg.meta_dict().items():
        if key not in ("inputs", "tokenizer"):
            options.setdefault(key, value)
    if cfg.tokenizer:
        options["tokenizer_sha256"] = hashlib.sha256(Path(cfg.tokenizer).read_bytes()).hexdigest()
    return fingerprint_of(files, options)


def prepare(cfg: PrepareConfig, show_progress: bool = True,
            few_documents_advice: str = FEW_DOCUMENTS_ADVICE) -> PrepareResult:
    """Run the whole prepare pipeline (see module docstring) and write the shard folder.

    `few_documents_advice`: the fix the warning names when the corpus has too few documents for
    a split by document (FEW_DOCUMENTS_ADVICE: `gptforge prepare`'s options); a workflow that
    prepares its own corpus (the quickstart) passes one that names its own options.

    Raises:
        FileNotFoundError: an input path, recipe or --tokenizer file does not exist.
        FileExistsError: the output folder exists and is not empty, without `overwrite`.
        InputError: an input or --tokenizer lies at or under the output folder.
        EmptyCorpusError: no document left (the message names the step that removed the last).
        BadInputError: bad input under `strict`.
        ValueError: an invalid option or recipe.
    """
    from gptforge.atomic import check_not_inside
    from gptforge.runtime.lock import FolderLock

    t0 = time.perf_counter()
    cfg.validate()
    out_dir = Path(cfg.out)
    check_not_inside(out_dir, [*cfg.inputs, *([cfg.tokenizer] if cfg.tokenizer else [])])
    with FolderLock(out_dir, command="gptforge prepare"):
        return _prepare_locked(cfg, out_dir, show_progress, t0, few_documents_advice)


def _remove_leftovers(out_dir: Path) -> None:
    """Temporary output folders (`.OUT.tmp-*`) and old copies (`.OUT.old-*`) of dead runs.

    Only called under the output's lock, so none of them belongs to a live writer.
    """
    for pattern in (f".{out_dir.name}.tmp-*", f".{out_dir.name}.old-*"):
        for p in out_dir.parent.glob(pattern):
            shutil.rmtree(p, ignore_errors=True)


def _completed_output(out_dir: Path, fingerprint_sha: str) -> dict[str, Any] | None:
    """meta.json of `out_dir` when it is a complete output of this very run (same fingerprint)."""
    from gptforge.data.shards import load_meta

    if not (out_dir / "meta.json").is_file():
        return None
    try:
        meta = load_meta(out_dir)
    except (OSError, ValueError):
        return None
    if meta.get("prepare_config", {}).get("work_fingerprint_sha256") != fingerprint_sha:
        return None
    return meta


def option_differences(recorded: dict[str, Any], cfg: PrepareConfig, vocab_chosen: int | None = None) -> list[str]:
    """Options of `cfg` that differ from a finished output's meta.json `prepare_config`, as
    '--vocab-size 8192 (this call: 4096)'; keys the record lacks (an older gptforge's) are skipped.
    `vocab_chosen`: the output's vocabulary size, said beside a recorded --vocab-size 0 (auto)."""
    now = json.loads(json.dumps(cfg.meta_dict()))  # tuples as lists, as meta.json holds them

    def shown(k: str) -> str:
        auto = f" (auto: {vocab_chosen})" if k == "vocab_size" and recorded[k] == 0 and vocab_chosen else ""
        return json.dumps(recorded[k]) + auto
    out = [f"--{k.replace('_', '-')} {shown(k)} (this call: {json.dumps(v)})"
           for k, v in now.items() if k in recorded and recorded[k] != v]
    if "recipe_steps" in recorded:  # the --quality-* options act as (and are recorded in) the quality step
        def quality(steps: dict) -> dict:
            return next((s["quality"] or {} for s in steps.get("steps", []) if isinstance(s, dict) and "quality" in s), {})
        was = quality(recorded["recipe_steps"])
        try:
            this = quality(with_quality(load_recipe(cfg.recipe), cfg.quality_options()))
        except (OSError, ValueError):
            this = was
        out += [f"--quality-{k} {json.dumps(was.get(k))} (this call: {json.dumps(this.get(k))})"
                for k in ("reference", "model", "keep", "threshold") if was.get(k) != this.get(k)]
    return out


def check_rerun_output(out_dir: Path, cfg: PrepareConfig) -> None:
    """Refuse a non-empty `out_dir` (without `overwrite`), saying, when it holds a complete
    prepare output, which recorded options differ from this call, or that they are the same
    (then the inputs or the recipe's content changed since).

    Raises:
        FileExistsError: `out_dir` exists, is not empty and `cfg.overwrite` is False.
    """
    from gptforge.data.shards import load_meta

    if cfg.overwrite or not (out_dir / "meta.json").is_file():
        return check_output_dir(out_dir, cfg.overwrite)
    try:
        done = load_meta(out_dir)
    except (OSError, ValueError):
        return check_output_dir(out_dir, cfg.overwrite)
    recorded = done.get("prepare_config") or {}
    diff = option_differences(recorded, cfg, done.get("vocab_size"))
    what = (f"made with other options: {'; '.join(diff)}" if diff else
            "made with the same options as this call, but its inputs (files, sizes or dates) or its recipe's "
            "content differ")
    raise FileExistsError(f"output folder {out_dir} holds a complete prepare output {what}; "
                          f"choose another --out or pass --overwrite to replace it")


@dataclass
class _Plan:
    """One output's inputs, recipe, work shards and work folder, before any phase ran."""

    cfg: PrepareConfig
    out_dir: Path
    files: list[Path]
    recipe_dict: dict[str, Any]
    recipe: Recipe
    shards: list[list[Any]]
    work: WorkFolder
    reused: bool
    fingerprint_sha: str
    curation_key: str = ""
    """What the curated documents depend on (inputs and every option but the quality step's)."""


def plan_output(cfg: PrepareConfig, out_dir: Path, t0: float) -> _Plan | PrepareResult:
    """Read the inputs' list and the recipe, cut the work shards and open the work folder; a
    PrepareResult (already_done) when `out_dir` is complete for these inputs and options.

    Raises:
        FileNotFoundError / FileExistsError / ValueError: as `prepare`.
    """
    files = expand_inputs(cfg.inputs)
    recipe_dict = with_quality(with_languages(load_recipe(cfg.recipe), cfg.languages, cfg.language_score),
                               cfg.quality_options())
    recipe = build_recipe(recipe_dict)
    # With --limit the first N documents in reading order are wanted: one shard reads them.
    shard_bytes = cfg.shard_bytes or auto_shard_bytes(files)
    shards = ([[str(f) for f in files]] if cfg.limit else
              plan_shards(files, shard_bytes, cfg.doc_separator, cfg.encoding))
    work = WorkFolder.for_output(out_dir)
    options = {"recipe": recipe_dict, "text_field": cfg.text_field, "doc_separator": cfg.doc_separator,
               "limit": cfg.limit, "strict": cfg.strict, "shard_bytes": shard_bytes}
    fingerprint = work_fingerprint(cfg, files, options)
    fingerprint_sha = hashlib.sha256(json.dumps(fingerprint, sort_keys=True).encode()).hexdigest()
    _remove_leftovers(out_dir)
    done_meta = None if cfg.overwrite else _completed_output(out_dir, fingerprint_sha)
    if done_meta is not None:
        # A kill after the output's rename but before the work folder's removal, or a plain rerun.
        work.remove()
        log.info(f"{out_dir} is already complete for these inputs and options: nothing to do")
        return PrepareResult(out_dir, done_meta, ReadStats(), NormalizeStats(), time.perf_counter() - t0,
                             already_done=True)
    check_rerun_output(out_dir, cfg)
    reused = work.open(fingerprint)
    unscored = {**options, "recipe": {**recipe_dict, "steps": [s for s in recipe_dict.get("steps") or []
                                                               if not (isinstance(s, dict) and "quality" in s)]}}
    curation_key = hashlib.sha256(json.dumps(work_fingerprint(cfg, files, unscored), sort_keys=True).encode()).hexdigest()
    return _Plan(cfg, out_dir, files, recipe_dict, recipe, shards, work, reused, fingerprint_sha, curation_key)


def _prepare_locked(cfg: PrepareConfig, out_dir: Path, show_progress: bool, t0: float,
                    few_documents_advice: str = FEW_DOCUMENTS_ADVICE) -> PrepareResult:
    """`prepare` once the output folder's lock is held: cleans up after itself on every exit."""
    from gptforge.progress import Phases

    tokenizer = Tokenizer.from_file(cfg.tokenizer) if cfg.tokenizer else None
    plan = plan_output(cfg, out_dir, t0)
    if isinstance(plan, PrepareResult):
        return plan
    try:
        timings: dict[str, float] = {}
        progress = Phases(enabled=show_progress, transient=False, unit="shards")
        with progress, _executor(cfg, out_dir, plan.work, plan.files) as pool:
            curated, splits = curate_and_split(plan, pool, progress, timings, few_documents_advice)
            tokenizer, tok_path = run_tokenizer(tokenizer, plan.work, curated.masks, splits, curated.mask_name,
                                                cfg.vocab_size,
                                                cfg.min_frequency, cfg.tokenizer_train_bytes, pool, timings)
            result = encode_and_write(plan, curated, splits, tokenizer, tok_path, pool, progress, timings, t0)
    except Exception:
        # A failed run's work folder cannot be resumed into success and may fill a disk; an
        # interrupted one (Ctrl-C, SIGTERM as KeyboardInterrupt/SystemExit) is kept for the rerun.
        if not cfg.keep_work:
            plan.work.remove()
        raise
    if not cfg.keep_work:
        plan.work.remove()
    return result


def curate_and_split(plan: _Plan, pool, progress, timings: dict[str, float],
                     few_documents_advice: str = FEW_DOCUMENTS_ADVICE, source: str | None = None):
    """Phases 1 and 2 of one output: (curated (phases.curate), Splits); `few_documents_advice` as
    `prepare`; `source`: the mixture source's name, for the warnings."""
    from gptforge.data.removal import warn_recipe_removal

    cfg, work = plan.cfg, plan.work
    if plan.reused:
        log.info(f"resuming from {work.root}")
    base = {"work": str(work.root), "recipe": plan.recipe_dict, "text_field": cfg.text_field,
            "doc_separator": cfg.doc_separator, "limit": cfg.limit, "strict": cfg.strict, "encoding": cfg.encoding}
    tasks = [{**base, "index": i, "files": shard} for i, shard in enumerate(plan.shards)]
    curated = run_curate(plan.recipe, tasks, work, pool, progress, timings)
    if plan.recipe.quality is not None:
        from gptforge.data.phases.quality import run_quality

        run_quality(plan.recipe.quality, work, curated, pool, progress, timings, plan.curation_key, plan.out_dir)
    if not curated.steps or curated.steps[-1].documents_out:
        # With no document left run_split raises, naming the step: no report.html is written, so
        # the warnings pointing at its examples would send the user to a file that does not exist.
        warn_heavy_steps(curated.steps)
        warn_recipe_removal(curated.steps, cfg.recipe, source)
    splits = run_split(cfg.split_rule(), work, curated.masks, plan.files, curated.read, curated.normalize,
                       curated.steps, cfg.doc_separator, few_documents_advice)
    return curated, splits


def encode_and_write(plan: _Plan, curated, splits, tokenizer: Tokenizer, tok_path: Path, pool, progress,
                     timings: dict[str, float], t0: float, extra_config: dict[str, Any] | None = None) -> PrepareResult:
    """Phases 4 and 5 of one output with its tokenizer: the shard folder, meta.json and report."""
    cfg, work = plan.cfg, plan.work
    t = time.perf_counter()
    encoded = run_encode(tokenizer, tok_path, work, curated.masks, splits, curated.mask_name, pool, progress)
    timings["tokenize"] = time.perf_counter() - t
    prepare_config = {**cfg.meta_dict(), "recipe_steps": plan.recipe_dict, "tokenizer_trained": cfg.tokenizer is None,
                      "moved_to_val_or_test": sorted(k for k, v in splits.moved.items() if v != "train"),
                      "work_fingerprint_sha256": plan.fingerprint_sha,
                      "position_split": {k: v for k, v in sorted(splits.cuts.items())},
                      "val_languages": language_rates(encoded.results), **(extra_config or {})}
    dedup = next((s for s in plan.recipe.corpus_steps if hasattr(s, "near_dedup_record")), None)
    if dedup is not None:
        prepare_config["near_dedup"] = dedup.near_dedup_record()
    report_inputs = ReportInputs(cfg, plan.recipe_dict, plan.files, plan.shards, curated, timings, plan.reused, t0)
    extra = None
    if plan.recipe.quality is not None:
        from gptforge.data.phases.quality import write_quality_outputs

        def extra(tmp_dir: Path) -> None:
            write_quality_outputs(tmp_dir, work, len(plan.shards), curated.corpus["quality"])

    meta, report = run_write(plan.out_dir, tokenizer, encoded, splits, work, cfg.max_shard_bytes, cfg.overwrite,
                             prepare_config, report_inputs, extra)
    from gptforge.data.removal import warn_small_splits

    warn_small_splits(meta, (extra_config or {}).get("mixture_source"))
    return PrepareResult(plan.out_dir, meta, curated.read, curated.normalize, time.perf_counter() - t0,
                         splits.moved, curated.steps, report)


def _executor(cfg: PrepareConfig, out_dir: Path, work: WorkFolder, files: list[Path]) -> Any:
    """The `Executor` of `cfg.executor`, not yet entered (a context manager)."""
    if cfg.executor == "ray":
        from gptforge.data.phases.ray_executor import RayExecutor

        return RayExecutor(cfg.ray_address, work.root, lock_folder=out_dir, inputs=files, local_cpus=cfg.workers)
    return WorkerPool(cfg.workers or default_workers(), lock_folder=out_dir)


def summary_rows(result: PrepareResult) -> list[tuple[str, str]]:
    """(label, value) lines of the prepare summary, for printing."""
    r, n, meta = result.read, result.normalize, result.meta
    if result.already_done:
        rows = [("status", "already complete for these inputs and options; nothing ran (report.html has the counts)")]
        rows += _output_rows(meta)
        rows.append(("time", f"{result.seconds:.1f} s"))
        return rows
    rows = [
        ("files read", f"{r.files_read:,}" + (f" ({r.files_truncated} truncated, readable part kept)" if r.files_truncated else "")),
    ]
    for reason, count in sorted(r.files_skipped.items()):
        rows.append((f"files skipped: {reason}", f"{count:,}"))
    rows.append(("documents read", f"{n.documents_in:,}"))
    if r.text_fields:  # which record field the texts came from (with auto: the first present of several)
        rows.append(("text read from field", r.fields_line(meta.get("prepare_config", {}).get("text_field", "auto"))))
    for reason, count in sorted(r.records_skipped.items()):
        rows.append((f"records skipped: {reason}", f"{count:,}"))
    for reason, count in sorted(n.dropped.items()):
        rows.append((f"documents dropped: {reason}", f"{count:,}"))
    for st in result.steps:
        for reason, count in st.dropped.most_common():
            if count:
                rows.append((f"{st.name}: {reason}", f"{count:,}"))
        for what, count in sorted(st.counts.items()):
            rows.append((f"{st.name}: {what}", f"{count:,}"))
    if r.undecodable_sequences:
        rows.append(("undecodable byte sequences replaced", f"{r.undecodable_sequences:,} in {r.documents_with_undecodable:,} documents"))
    # What was written, after every curation step (normalization's own count is before them).
    kept = sum(meta["splits"][sp]["documents"] for sp in SPLITS)
    written_chars = result.steps[-1].characters_out if result.steps else n.characters_out
    # A split by position cuts a document into train/val/test pieces: the pieces are counted apart,
    # so that "kept" never exceeds "read".
    cut = meta.get("prepare_config", {}).get("position_split") or {}
    pieces = sum(len(c) - 1 for c in cut.values())  # pieces added on top of the documents cut
    rows.append(("documents kept", f"{kept - pieces:,}"))
    if pieces:
        rows.append(("pieces written", f"{kept:,} ({len(cut)} document(s) cut by position into "
                                       f"{pieces + len(cut)} train/val/test pieces)"))
    rows.append(("characters kept", f"{written_chars:,}"))
    rows += _output_rows(meta)
    cfg = meta.get("prepare_config", {})
    for lang, c in (cfg.get("val_languages") or {}).items():
        if c["tokens"]:
            rows.append((f"val {lang}", f"{c['documents']:,} docs, {c['bytes_per_token']:.2f} bytes/token, "
                                        f"{c['characters_per_token']:.2f} characters/token"))
    from gptforge.data.removal import small_split_lines

    rows += [("WARNING", line) for line in small_split_lines(meta)]
    if cfg.get("val_fraction", 0) > 0 and not meta["splits"]["val"]["documents"]:
        rows.append(("WARNING", "no val split: too few documents (a single big file is one document; split it "
                                "with --doc-separator, or give more files); pretrain will run without validation"))
    rows.append(("time", f"{result.seconds:.1f} s"))
    return rows


def print_summary(result: PrepareResult, title: str) -> None:
    """Print `summary_rows(result)` as a table (rich) on stdout: what each step removed and why."""
    from rich.console import Console
    from rich.table import Table

    table = Table(title=title, show_header=False)
    table.add_column(style="bold")
    table.add_column()
    for label, value in summary_rows(result):
        table.add_row(label, value)
    Console().print(table)


def _output_rows(meta: dict[str, Any]) -> list[tuple[str, str]]:
    rows = [("tokenizer", f"vocab {meta['vocab_size']:,}, eos id {meta['eos_id']}, {meta['dtype']}, "
                          f"sha256 {meta['tokenizer_sha256'][:12]}")]
    for split in SPLITS:
        s = meta["splits"][split]
        if not s["documents"]:
            continue
        text_tokens = s["tokens"] - s["documents"]
        bpt = s["bytes"] / text_tokens if text_tokens else float("nan")
        rows.append((f"{split}", f"{s['documents']:,} docs, {s['tokens']:,} tokens, {s['bytes']:,} bytes, "
                     f"{bpt:.2f} bytes/token, {len(s['files'])} file(s)"))
    return rows

"""`prepare --source NAME=PATH ...`: several named sources, one tokenizer, shards per source.

A driver over the phases of `gptforge.data.prepare` (not a second pipeline): every source is
planned, curated and split in its own work folder (its recipe: `--source-recipe NAME=RECIPE`,
else --recipe), exactly as a single-source prepare does; then one byte-level BPE is trained on
the train text of all sources, each contributing its share of `tokenizer_train_bytes`
UTF-8 bytes (default: in proportion to its train text; `--tokenizer-weights NAME=W,...`: W / sum W
of them, at most all of its text), its vocabulary size (when not given) following the bytes and
characters of that text, as for one input (`phases.tokenizer.check_vocab_size`); then each source is encoded and written with that tokenizer
into DIR/NAME/ (its own splits, meta.json and report). DIR/meta.json, written last, lists the
sources with documents, tokens and bytes per split; DIR/tokenizer.json is the shared tokenizer.
`gptforge pretrain --data DIR` trains on the mixture (gptforge.train.sources.mixture).
"""

from __future__ import annotations

import itertools
import json
import re
import shutil
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, cast

from gptforge.atomic import atomic_write_text
from gptforge.data.prepare import PrepareConfig, PrepareResult, _Plan, curate_and_split, encode_and_write, plan_output

MIXTURE_FORMAT = "gptforge-mixture"
MIXTURE_VERSION = 1
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]*$")


@dataclass
class SourcesResult:
    """What `prepare_sources` wrote: the folder, its meta.json and each source's PrepareResult."""

    out_dir: Path
    meta: dict[str, Any]
    sources: dict[str, PrepareResult]


def parse_named(items: list[str], option: str) -> dict[str, str]:
    """["en=corpus/en", ...] -> {"en": "corpus/en", ...} for --source / --source-recipe.

    Raises:
        ValueError: an item without NAME=, a name that is not a folder name (letters, digits,
            `_ . -`), or a name given twice.
    """
    out: dict[str, str] = {}
    for item in items:
        name, eq, value = item.partition("=")
        if not eq or not _NAME.match(name) or not value:
            raise ValueError(f"{option} {item!r}: give NAME=VALUE with NAME of letters, digits, _ . - (e.g. en=corpus/en)")
        if name in out:
            raise ValueError(f"{option}: source {name!r} given twice")
        out[name] = value
    return out


def _byte_budgets(sizes: dict[str, int], weights: dict[str, float] | None, max_bytes: int) -> dict[str, int]:
    """UTF-8 bytes of each source's train text (`sizes`: name -> bytes) the tokenizer is trained
    on (module docstring)."""
    total = sum(sizes.values())
    budget = min(max_bytes, total) if max_bytes else total
    if weights is None:
        return {n: (c if budget == total else int(budget * c / max(total, 1))) for n, c in sizes.items()}
    s = sum(weights.values())
    return {n: min(sizes[n], int(budget * weights[n] / s)) for n in sizes}


def prepare_sources(cfg: PrepareConfig, sources: dict[str, list[str]], recipes: dict[str, str] | None = None,
                    tokenizer_weights: dict[str, float] | None = None, show_progress: bool = True) -> SourcesResult:
    """Prepare `sources` (name -> inputs, as `PrepareConfig.inputs`) into cfg.out (module docstring).

    Args:
        cfg: the options shared by every source (cfg.inputs is ignored; cfg.recipe is the
            default recipe). recipes: name -> recipe for some sources. tokenizer_weights: name
            -> weight, for every source.

    Raises:
        ValueError: no source, a recipe or tokenizer weight for an unknown source, weights
            missing a source or not > 0 in sum. FileExistsError: DIR is not empty (without
            overwrite). And what `prepare` raises, per source.
    """
    from gptforge.atomic import check_not_inside
    from gptforge.data.mixture import normalize_weights
    from gptforge.data.shards import check_output_dir
    from gptforge.data.tokenizer import Tokenizer
    from gptforge.runtime.lock import FolderLock

    if not sources:
        raise ValueError("--source: give at least one NAME=PATH")
    for name in recipes or {}:
        if name not in sources:
            raise ValueError(f"--source-recipe {name}: no --source named {name!r} (sources: {', '.join(sources)})")
    weights = normalize_weights(tokenizer_weights, list(sources)) if tokenizer_weights else None
    out_dir = Path(cfg.out)
    check_not_inside(out_dir, [p for inp in sources.values() for p in inp] + ([cfg.tokenizer] if cfg.tokenizer else []))
    t0 = time.perf_counter()
    with FolderLock(out_dir, command="gptforge prepare --source"):
        if (cfg.overwrite or (out_dir / "meta.json").exists()) and out_dir.exists():
            check_output_dir(out_dir, cfg.overwrite)
        cfgs = {n: replace(cfg, inputs=list(inp), out=str(out_dir / n), recipe=(recipes or {}).get(n, cfg.recipe),
                           overwrite=True) for n, inp in sources.items()}
        for c in cfgs.values():
            c.validate()
        if cfg.executor != "local":
            raise ValueError(f"--executor {cfg.executor}: several named sources run on the local executor only; "
                             f"prepare each source on its own with --executor {cfg.executor}, or leave the option out")
        existed = out_dir.exists()
        try:
            results = _run(cfgs, weights, cfg, out_dir, show_progress, t0, Tokenizer)
        except BaseException:
            _remove_if_empty(out_dir, existed)
            raise
        meta = _write_meta(out_dir, results, cfgs, weights)
    return SourcesResult(out_dir, meta, results)


def _remove_if_empty(out_dir: Path, existed: bool) -> None:
    """After a failed run, remove the output folder (and the empty source folders in it) when this
    run created it and nothing was written into it: an error leaves no empty DIR behind."""
    if existed or not out_dir.is_dir():
        return
    for sub in out_dir.iterdir():
        if sub.is_dir() and not any(sub.iterdir()):
            sub.rmdir()
    if not any(out_dir.iterdir()):
        out_dir.rmdir()


def _run(cfgs, weights, cfg, out_dir: Path, show_progress: bool, t0: float, Tokenizer) -> dict[str, PrepareResult]:
    """Plan, curate and split every source; one tokenizer over all; encode and write each."""
    from gptforge.data.phases.pool import WorkerPool, default_workers
    from gptforge.data.phases.tokenizer import check_vocab_size, sample_size, train_texts, utf8_len
    from gptforge.data.phases.work import WorkFolder
    from gptforge.data.tokenizer import train_bpe
    from gptforge.progress import Phases

    out_dir.mkdir(parents=True, exist_ok=True)
    # Every source's cfg has overwrite=True, so plan_output plans it (never the already-done result).
    plans = {n: cast(_Plan, plan_output(c, Path(c.out), t0)) for n, c in cfgs.items()}
    timings: dict[str, dict[str, float]] = {n: {} for n in plans}
    top_work = WorkFolder.for_output(out_dir)
    top_work.root.mkdir(parents=True, exist_ok=True)
    given = Tokenizer.from_file(cfg.tokenizer) if cfg.tokenizer else None
    progress = Phases(enabled=show_progress, transient=False, unit="shards")
    try:
        with progress, WorkerPool(cfg.workers or default_workers(), lock_folder=out_dir) as pool:
            fronts = {n: curate_and_split(p, pool, progress, timings[n], source=n) for n, p in plans.items()}
            tok_path = top_work.root / "tokenizer.json"
            if given is not None:
                tokenizer = given
            else:
                sizes = {n: sum(utf8_len(t) for t in train_texts(plans[n].work, cur.masks, sp, 0))
                         for n, (cur, sp) in fronts.items()}
                budgets = _byte_budgets(sizes, weights, cfg.tokenizer_train_bytes)

                def texts():
                    return itertools.chain.from_iterable(
                        train_texts(plans[n].work, cur.masks, sp, budgets[n]) for n, (cur, sp) in fronts.items()
                        if budgets[n] > 0)
                vocab = check_vocab_size(cfg.vocab_size, *sample_size(texts()))
                tokenizer = train_bpe(texts(), vocab, min_frequency=cfg.min_frequency)
            tokenizer.save(tok_path)
            results = {n: encode_and_write(plans[n], cur, sp, tokenizer, tok_path, pool, progress, timings[n], t0,
                                           extra_config={"mixture_source": n, "mixture_folder": str(out_dir)})
                       for n, (cur, sp) in fronts.items()}
        shutil.copyfile(tok_path, out_dir / ".tokenizer.json.tmp")
        (out_dir / ".tokenizer.json.tmp").replace(out_dir / "tokenizer.json")
    finally:
        if not cfg.keep_work:
            for p in plans.values():
                p.work.remove()
            top_work.remove()
    return results


def _write_meta(out_dir: Path, results: dict[str, PrepareResult], cfgs, weights) -> dict[str, Any]:
    """DIR/meta.json (written last: the folder is complete once it exists)."""
    first = next(iter(results.values())).meta
    meta = {"format": MIXTURE_FORMAT, "version": MIXTURE_VERSION, "tokenizer_sha256": first["tokenizer_sha256"],
            "vocab_size": first["vocab_size"], "eos_id": first["eos_id"], "dtype": first["dtype"],
            "tokenizer_weights": weights,
            "sources": [{"name": n, "path": n, "inputs": cfgs[n].inputs, "recipe": cfgs[n].recipe,
                         "splits": {s: {k: v[k] for k in ("documents", "tokens", "bytes") if k in v}
                                    for s, v in r.meta["splits"].items()}}
                        for n, r in results.items()]}
    atomic_write_text(out_dir / "meta.json", json.dumps(meta, indent=2) + "\n")
    return meta

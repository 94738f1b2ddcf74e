"""A weighted mixture of token-shard sources as one `BatchSource` (train.data_weights, train.stages).

The sources are either several single-source shard folders that share one tokenizer
(`--data A B`, each named by its folder name) or one folder prepared with several `--source`
(its meta.json lists them, each under DIR/NAME/). Every source's train split is cut into
non-overlapping windows of seq_len + 1 tokens (window k starts at token k x seq_len): one epoch
of a source is each of its windows once, in a per-epoch order of `gptforge.data.mixture`.
Every optimizer step's global batch comes from `MixtureSampler`, a function of the step alone,
so a resume (any world size) and a rollback replay the same data.

Validation: each source's val split is scored on its own fixed windows; the overall val loss is
the token-weighted mean over the sources' val splits, sum_i T_i L_i / sum_i T_i with T_i the
val tokens of source i (meta.json) and L_i its mean loss. Bits per byte of a source:
L_i / ln 2 x T_i / B_i, with B_i the UTF-8 bytes of its val split (Gao et al. 2020, sec. 5.1).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from gptforge.data.mixture import mixture_folders
from gptforge.errors import InputError, OptionError
from gptforge.train.provenance import data_provenance
from gptforge.train.sources.base import BatchesBase, SourceBase
from gptforge.train.sources.shards import ShardSource, with_document_mask

if TYPE_CHECKING:
    from gptforge.data.mixture import MixtureSampler

OVERALL_VAL = ("val_loss of a mixture: the token-weighted mean over the sources' val splits "
               "(sum of val tokens x mean loss per source / all val tokens)")
"""The one definition of a mixture's overall val loss, said in --help and the report."""


def parse_data_weights(text: str) -> dict[str, float]:
    """`en=0.7,zh=0.3` -> {"en": 0.7, "zh": 0.3} (the --data-weights shortcut).

    Raises:
        OptionError: an item without `=` or a weight that is not a number (naming it).
    """
    out: dict[str, float] = {}
    for item in filter(None, (p.strip() for p in text.split(","))):
        name, eq, value = item.partition("=")
        try:
            if not eq or not name.strip():
                raise ValueError
            out[name.strip()] = float(value)
        except ValueError:
            raise OptionError(f"--data-weights: {item!r} is not NAME=WEIGHT (e.g. en=0.7,zh=0.3)") from None
    return out


def open_source(data: str | Path | list, eval_steps: int, micro_batch_size: int, log=None):
    """A ShardSource for one plain folder, else a MixtureSource (see `mixture_folders`)."""
    folders = mixture_folders(data)
    if folders is None:
        one = data[0] if isinstance(data, (list, tuple)) else data
        return ShardSource(one, eval_steps=eval_steps, micro_batch_size=micro_batch_size, log=log)
    top = Path(data) if not isinstance(data, (list, tuple)) else None
    return MixtureSource(folders, eval_steps, micro_batch_size, log, top=top)


class MixtureBatches(BatchesBase):
    """This rank's micro-batches of each step of a mixture; `step_metrics` gives what was drawn.

    Rows: the rank's contiguous slice of the step's global batch (`MixtureBatch.rank_slice`), cut
    into gradient_accumulation_steps micro-batches of micro_batch_size windows.
    """

    def __init__(self, sampler, streams: dict, seq_len: int, micro_batch_size: int, accumulation: int,
                 dp_rank: int, dp_size: int, document_mask_eos: int | None = None):
        self.sampler, self.streams, self.seq_len = sampler, streams, seq_len
        self.micro_batch_size, self.accumulation = micro_batch_size, accumulation
        self.dp_rank, self.dp_size, self.document_mask_eos = dp_rank, dp_size, document_mask_eos
        self.global_batch_size = sampler.global_batch_size
        self.tokens_per_step = self.global_batch_size * seq_len

    def micro_batches(self, step: int):
        """The micro-batches of optimizer step `step`: (x, y) pairs (b, T) int64, or dicts with
        the document mask (see gptforge.train.sources.shards.ShardBatches)."""
        mine = self.sampler.global_batch(step).rank_slice(self.dp_rank, self.dp_size)
        w = self.seq_len + 1
        rows = np.stack([self.streams[name].read(i * self.seq_len, w) for name, i in mine])
        t = torch.from_numpy(rows.astype(np.int64))
        b = self.micro_batch_size
        pairs = [(t[m * b:(m + 1) * b, :-1].contiguous(), t[m * b:(m + 1) * b, 1:].contiguous())
                 for m in range(self.accumulation)]
        return with_document_mask(pairs, self.document_mask_eos)

    def step_metrics(self, step: int) -> dict[str, Any]:
        """metrics.jsonl fields of step `step`: `data/NAME/tokens` drawn this step (all ranks),
        `data/NAME/tokens_seen` in steps 0..step, `data/NAME/epoch`, the source's epoch (0-based)
        after the step, and `data/stage` (0-based) when train.stages is set."""
        batch = self.sampler.global_batch(step)
        out: dict[str, Any] = {}
        for name in self.sampler.names:
            out[f"data/{name}/tokens"] = batch.counts[name] * self.seq_len
            out[f"data/{name}/tokens_seen"] = batch.totals[name] * self.seq_len
            out[f"data/{name}/epoch"] = batch.epochs[name]
        if self.sampler.stages:
            out["data/stage"] = sum(step >= until for until, _ in self.sampler.stages)
        return out


class MixtureSource(SourceBase):
    """Several token-shard sources sharing one tokenizer, mixed by train.data_weights.

    Args:
        folders: source name -> shard folder (meta.json, *.bin), in a fixed order.
        eval_steps, micro_batch_size: each source's validation uses eval_steps x
            micro_batch_size windows (or fewer, when its split holds fewer; see ShardSource).
        log: where warnings go (no validation split, a source repeated beyond 4 epochs).
        top: the folder prepared with several --source, when the sources come from one.

    Attributes: source_tokens (name -> train tokens: the resolver's default weights), and after
    `evaluate`, `val_details` (name -> {"loss", "bpb"}).

    Raises:
        MissingInputError: a folder without meta.json. InputError: sources of different
            tokenizers (naming both folders and their tokenizer sha256).
    """

    def __init__(self, folders: dict[str, Path], eval_steps: int = 20, micro_batch_size: int = 8, log=None,
                 top: Path | None = None):
        self.subs = {name: ShardSource(d, eval_steps=eval_steps, micro_batch_size=micro_batch_size, log=log)
                     for name, d in folders.items()}
        first_name, first = next(iter(self.subs.items()))
        for sub in self.subs.values():
            a, b = first.meta.get("tokenizer_sha256"), sub.meta.get("tokenizer_sha256")
            if a != b or first.meta["vocab_size"] != sub.meta["vocab_size"]:
                raise InputError(f"--data: the sources were tokenized with different tokenizers: {first.data_dir} "
                                 f"(tokenizer sha256 {str(a)[:12]}) and {sub.data_dir} (tokenizer sha256 "
                                 f"{str(b)[:12]}); prepare them with one tokenizer (`gptforge prepare --source ...`, "
                                 f"or --tokenizer {first.data_dir / 'tokenizer.json'})")
        self.top, self.log = top, log
        self.vocab_size = int(first.meta["vocab_size"])
        tokens = {n: int(s.meta["splits"]["train"]["tokens"]) for n, s in self.subs.items()}
        self.source_tokens: dict[str, int] | None = tokens
        tok = (top / "tokenizer.json") if top is not None else first.data_dir / "tokenizer.json"
        self.tokenizer_file = tok if tok.exists() else first.tokenizer_file
        self.description = (f"a mixture of {len(self.subs)} sources ("
                            + ", ".join(f"{n}: {t:,} train tokens" for n, t in tokens.items()) + ")")
        self.has_val = False
        self.sampler: MixtureSampler | None = None
        self.val_details: dict[str, Any] = {}
        self.weights: dict[str, float] = {}

    def check_window(self, block_size: int) -> None:
        """Refuse a window that a source's train split cannot fill (see ShardSource.check_window)."""
        for sub in self.subs.values():
            sub.check_window(block_size)

    def batches(self, block_size: int, tc, dp_rank: int, dp_size: int) -> MixtureBatches:
        """The mixture's batches for the resolved TrainConfig `tc` (data_weights set by
        gptforge.train.resolve.resolve_mixture); logs the >4-epoch repetition warnings.

        Raises:
            InputError: a source with fewer train tokens than one window.
        """
        from gptforge.data.mixture import MixtureSampler

        if tc.data_weights is None:
            raise InputError("a mixture needs resolved train.data_weights (gptforge.train.resolve.resolve_mixture)")
        for sub in self.subs.values():  # opens each source's streams and validation windows
            sub.batches(block_size, tc, dp_rank, dp_size)
        seq_len = block_size
        sizes = {n: (s.train_stream.num_tokens - 1) // seq_len for n, s in self.subs.items()}
        g = tc.micro_batch_size * tc.gradient_accumulation_steps * dp_size
        stages = [(st["until_step"], st["data_weights"]) for st in (tc.stages or [])]
        self.sampler = MixtureSampler(sizes, tc.data_weights, g, tc.seed, stages=stages)
        self.weights = self.sampler.weights
        for line in self.sampler.repetition_warnings(tc.max_steps):
            if self.log is not None:
                self.log(line)
        self.has_val = any(s.has_val for s in self.subs.values())
        self.seq_len = seq_len
        eos = next(iter(self.subs.values())).document_mask_eos
        return MixtureBatches(self.sampler, {n: s.train_stream for n, s in self.subs.items()}, seq_len,
                              tc.micro_batch_size, tc.gradient_accumulation_steps, dp_rank, dp_size, eos)

    def evaluate(self, model, device, precision, should_stop=None) -> float | None:
        """The overall val loss (OVERALL_VAL); per-source figures in `val_details`."""
        details, num, den = {}, 0.0, 0
        for name, sub in self.subs.items():
            if not sub.has_val:
                continue
            loss = sub.evaluate(model, device, precision, should_stop)
            if loss is None:
                return None
            val = sub.meta["splits"]["val"]
            n_tok, n_bytes = int(val["tokens"]), int(val.get("bytes") or 0)
            details[name] = {"loss": loss, "bpb": loss / math.log(2) * n_tok / n_bytes if n_bytes else None}
            num, den = num + n_tok * loss, den + n_tok
        self.val_details = details
        return num / den if den else None

    def val_metrics(self) -> dict[str, float]:
        """metrics.jsonl fields of the last evaluation: `val/NAME/loss` and `val/NAME/bpb`."""
        out = {}
        for name, d in self.val_details.items():
            out[f"val/{name}/loss"] = d["loss"]
            if d["bpb"] is not None:
                out[f"val/{name}/bpb"] = d["bpb"]
        return out

    def provenance(self) -> dict[str, Any]:
        """config.yaml's `data`: the path(s), the common tokenizer and each source's provenance."""
        subs = {n: data_provenance(s.data_dir) for n, s in self.subs.items()}
        path = str(self.top.resolve()) if self.top is not None else [p["path"] for p in subs.values()]
        return {"path": path, "tokenizer_sha256": next(iter(subs.values()))["tokenizer_sha256"], "sources": subs}

    def check_resume(self, saved: dict[str, Any], checkpoint: Path) -> None:
        """Refuse other sources or another tokenizer than the run's. (Other weights or stages
        continue from the resume step: gptforge.train.resolve.resolve_mixture.)

        Raises:
            InputError: naming the difference and the checkpoint's config.yaml.
        """
        data = saved.get("data") or {}
        names = list((data.get("sources") or {}))
        where = checkpoint / "config.yaml"
        if names != list(self.subs):
            raise InputError(f"--resume: the run was trained on the sources {names} ({where}), now {list(self.subs)}; "
                             "resume with the same sources")
        for sub in self.subs.values():
            sub.check_resume(data, checkpoint)

    def close(self) -> None:
        for sub in self.subs.values():
            sub.close()

"""Token shards from `gptforge prepare` as a `BatchSource` (gptforge.train.sources.base): random
training windows and fixed validation windows, for pretraining and continued pretraining.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from gptforge.errors import InputError
from gptforge.train.provenance import data_provenance
from gptforge.train.sources.base import BatchesBase, SourceBase

if TYPE_CHECKING:
    import numpy as np

    from gptforge.data.loader import TokenStream


class ShardBatches(BatchesBase):
    """Random windows of a token stream (`gptforge.data.loader.TrainBatches`) with the figures the
    trainer logs. With `document_mask_eos` (train.document_mask), each micro-batch is a dict that
    adds the position_ids (b, T) and attn_mask (b, 1, T, T) of `gptforge.model.gpt.document_mask`."""

    def __init__(self, inner, seq_len: int, document_mask_eos: int | None = None):
        self.inner = inner
        self.seq_len = seq_len
        self.document_mask_eos = document_mask_eos
        self.global_batch_size = inner.global_batch_size
        self.tokens_per_step = inner.global_batch_size * seq_len  # rows of seq_len, padding included

    def micro_batches(self, step: int):
        return with_document_mask(self.inner.micro_batches(step), self.document_mask_eos)


def with_document_mask(pairs: list, eos_id: int | None) -> list:
    """(x, y) micro-batches as they are without an EOS id; with one (train.document_mask), dicts
    that add the position_ids (b, T) and attn_mask (b, 1, T, T) of `gptforge.model.gpt.document_mask`."""
    if eos_id is None:
        return pairs
    from gptforge.model.gpt import document_mask

    out = []
    for x, y in pairs:
        position_ids, attn_mask = document_mask(x, eos_id)
        out.append({"input_ids": x, "labels": y, "position_ids": position_ids, "attn_mask": attn_mask})
    return out


SHORT_VAL_ADVICE = ("Prepare with a larger --val-fraction (a single big file is one document: split it with "
                    "--doc-separator), or use a smaller model.block_size.")
"""What a `gptforge pretrain` user can do about a val split shorter than one window (`gptforge prepare`'s
options); a workflow that prepares the data itself passes its own (ShardSource's short_val_advice)."""

EVAL_WINDOWS_ORIGIN = "train.eval_steps x micro_batch_size"
"""Where the number of validation windows asked comes from, as a `gptforge pretrain` user sets it;
a workflow with its own options passes its own wording (ShardSource's eval_windows_origin)."""

SHORT_TRAIN_ADVICE = "use a smaller block size or more data"
"""What a `gptforge pretrain` user can do about a train split shorter than one window; a workflow
with its own options passes its own (ShardSource's short_train_advice)."""


class ShardSource(SourceBase):
    """A `gptforge prepare` shard folder: random training windows, fixed validation windows.

    Args:
        data_dir: the folder (meta.json, *.bin, tokenizer.json).
        seq_len: window length; None takes the model's block_size (pretraining).
        eval_steps, micro_batch_size: validation uses eval_steps * micro_batch_size windows.
        tokenizer_json: the model's tokenizer; the shards must have been tokenized with it.
        log: where a warning about a missing validation split goes.
        short_val_advice: the fix that warning names for a val split shorter than one window
            (SHORT_VAL_ADVICE: `gptforge prepare`'s options, for data the user prepared).
        short_train_advice: the fix the error names for a train split shorter than one window
            (`check_window`).
        eval_windows_origin: what sets the validation windows asked, in the note about a val split
            holding fewer (EVAL_WINDOWS_ORIGIN: the training config's fields).

    Raises:
        MissingInputError: no meta.json. InputError: shards of another tokenizer, or fewer
            train tokens than one window.
    """

    def __init__(self, data_dir: str | Path, seq_len: int | None = None, eval_steps: int = 20,
                 micro_batch_size: int = 8, tokenizer_json: Path | None = None, log=None,
                 short_val_advice: str = SHORT_VAL_ADVICE, eval_windows_origin: str = EVAL_WINDOWS_ORIGIN,
                 short_train_advice: str = SHORT_TRAIN_ADVICE):
        from gptforge.data.shards import load_meta
        from gptforge.data.tokenizer import Tokenizer

        self.data_dir: Path = Path(data_dir)
        self.seq_len = seq_len
        self.meta = load_meta(self.data_dir)
        if tokenizer_json is not None and self.meta.get("tokenizer_sha256"):
            if Tokenizer.from_file(tokenizer_json).sha256 != self.meta["tokenizer_sha256"]:
                raise InputError(
                    f"{self.data_dir / 'meta.json'}: the shards were tokenized with another tokenizer than the "
                    f"model's ({tokenizer_json}); prepare them with `gptforge prepare ... --tokenizer {tokenizer_json}`"
                )
        self.vocab_size = int(self.meta["vocab_size"])
        self.eval_steps, self.micro_batch_size, self.log = eval_steps, micro_batch_size, log
        self.short_val_advice, self.eval_windows_origin = short_val_advice, eval_windows_origin
        self.short_train_advice = short_train_advice
        tok = self.data_dir / "tokenizer.json"
        # With the model's own tokenizer given (fine-tuning), the run directory already holds it.
        self.tokenizer_file = tok if tok.exists() and tokenizer_json is None else None
        self.train_stream: TokenStream | None = None
        self.val_stream: TokenStream | None = None
        self.val_offsets: np.ndarray | None = None
        self.document_mask_eos: int | None = None
        self.has_val = False
        n = self.meta["splits"]["train"]["tokens"]
        self.description = f"{n:,} train tokens in {self.data_dir}" + (f", windows of {seq_len}" if seq_len else "")

    supports_pipeline = True

    def check_window(self, block_size: int) -> None:
        """Refuse a window of seq_len + 1 tokens (the source's seq_len, else `block_size`) that the
        train split cannot fill (training, and any timing of its shape, needs more train tokens
        than one window).

        Raises:
            InputError: naming the folder, its train tokens and `short_train_advice`.
        """
        seq_len = self.seq_len or block_size
        n = self.meta["splits"]["train"].get("tokens", 0)
        if n <= seq_len + 1:
            raise InputError(f"{self.data_dir}: {n} train tokens, fewer than one window of {seq_len + 1} tokens "
                             f"(block_size + 1); {self.short_train_advice}")

    def batches(self, block_size: int, tc, dp_rank: int, dp_size: int) -> ShardBatches:
        from gptforge.data.loader import TokenStream, TrainBatches, eval_windows
        from gptforge.data.shard_verify import check_at_start

        seq_len = self.seq_len or block_size
        self.check_window(seq_len)
        split = self.meta["splits"]["train"]
        check_at_start(self.data_dir, self.meta, self.log)
        self.train_stream = TokenStream([self.data_dir / f for f in split["files"]], self.meta["dtype"],
                                        self.vocab_size)
        val = self.meta["splits"].get("val")
        if tc.eval_interval > 0 and val and val.get("tokens", 0) > seq_len + 1:
            self.val_stream = TokenStream([self.data_dir / f for f in val["files"]], self.meta["dtype"],
                                          self.vocab_size)
            asked = self.eval_steps * self.micro_batch_size
            self.val_offsets = eval_windows(self.val_stream, seq_len, asked)
            if len(self.val_offsets) < asked and self.log is not None:
                self.log(f"WARNING: validation: the val split of {self.data_dir} holds {len(self.val_offsets)} windows "
                         f"of {seq_len + 1} tokens, fewer than the {asked} asked ({self.eval_windows_origin}): "
                         "each is scored once, and its val loss rests on that little text")
        self.has_val = self.val_stream is not None
        if tc.eval_interval > 0 and not self.has_val and self.log is not None:
            n_val = (val or {}).get("tokens", 0)
            self.log(f"WARNING: no validation: the val split of {self.data_dir} has {n_val:,} tokens, fewer than one "
                     f"window of block_size + 1 = {seq_len + 1}; evaluation, the best checkpoint and early stopping "
                     f"are off. {self.short_val_advice}")
        self.seq_len = seq_len
        # meta.json always records eos_id (gptforge.data.shards.load_meta checks it).
        self.document_mask_eos = int(self.meta["eos_id"]) if tc.document_mask else None
        return ShardBatches(TrainBatches(self.train_stream, seq_len, tc.micro_batch_size,
                                         tc.gradient_accumulation_steps, tc.seed, dp_rank=dp_rank, dp_size=dp_size),
                            seq_len, self.document_mask_eos)

    def evaluate(self, model, device, precision, should_stop=None) -> float | None:
        from gptforge.eval.perplexity import evaluate_windows

        if self.val_stream is None:
            return None
        return evaluate_windows(model, self.val_stream, self.val_offsets, self.seq_len, self.micro_batch_size,
                                device, precision, should_stop, document_mask_eos=self.document_mask_eos)

    def pipeline_val(self) -> tuple[TokenStream, np.ndarray] | None:
        if self.val_stream is None or self.val_offsets is None:
            return None
        return self.val_stream, self.val_offsets

    def provenance(self) -> dict[str, Any]:
        return data_provenance(self.data_dir)

    def check_resume(self, saved: dict[str, Any], checkpoint: Path) -> None:
        saved_tok = (saved.get("data") or {}).get("tokenizer_sha256")
        if saved_tok and saved_tok != self.meta.get("tokenizer_sha256"):
            raise InputError(
                f"--resume: {self.data_dir} was tokenized with a different tokenizer (sha256 "
                f"{str(self.meta.get('tokenizer_sha256'))[:12]}) than the run (sha256 {saved_tok[:12]}, "
                f"{checkpoint / 'config.yaml'}); resume with the data the run was trained on "
                f"({(saved.get('data') or {}).get('path')}), or prepare new data with --tokenizer RUN_DIR/tokenizer.json"
            )

    def close(self) -> None:
        for s in (self.train_stream, self.val_stream):
            if s is not None:
                s.close()

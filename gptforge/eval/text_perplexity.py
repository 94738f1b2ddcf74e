"""Loss, perplexity and bits per byte of a model on a text file or a shard folder's split
(`gptforge evaluate --text / --data`): the tokenizer checks, the text normalized as `gptforge
prepare` normalized the training data, per-source scores of a mixture folder, and the document
mask a run trained with. The scoring itself is `gptforge.eval.perplexity`."""

from __future__ import annotations

import json
from pathlib import Path

from gptforge.errors import InputError, MissingInputError


def _recorded_forms(doc: dict) -> dict[str, str | None]:
    """meta.json path -> the Unicode form prepare applied there (`prepared_normalization`; None:
    no recipe recorded or unreadable) for the run's training data: one shard folder, or each
    source of a mixture (config.yaml's `data.sources`; a mixture folder's own meta.json records
    no recipe, its sources' do). Folders that no longer exist are left out."""
    from gptforge.data.normalize import prepared_normalization

    data = doc.get("data") or {}
    sources = data.get("sources")
    if isinstance(sources, dict) and sources:
        folders = [s.get("path") for s in sources.values() if isinstance(s, dict)]
    else:
        folders = [data.get("path")] if isinstance(data.get("path"), str) else []
    forms: dict[str, str | None] = {}
    for folder in folders:
        meta_path = Path(folder) / "meta.json" if folder else None
        if meta_path is None or not meta_path.is_file():
            continue
        try:
            forms[str(meta_path)] = prepared_normalization(json.loads(meta_path.read_text()))
        except ValueError:  # an unreadable meta.json: fall back to the line ends
            forms[str(meta_path)] = None
    return forms


def normalize_like_prepare(text: str, doc: dict) -> tuple[str, str]:
    """(text, description): `text` normalized as `gptforge prepare` normalized the run's training
    data (`gptforge.data.normalize.normalize_text`: BOM removed, CRLF / CR -> LF, then the recipe's
    Unicode form read from the data folder's meta.json, or from each source's of a mixture: the
    first source's form when they differ, and the description says so). Without a recorded recipe
    (a Hugging Face folder, a moved data folder) only the BOM and line ends are normalized."""
    from gptforge.data.normalize import normalize_text

    recorded = {p: f for p, f in _recorded_forms(doc).items() if f is not None}
    what = "BOM removed, line ends LF"
    if not recorded:
        what += " (no prepare recipe recorded for this model: no Unicode form applied)"
        return normalize_text(text, ""), what
    forms = list(dict.fromkeys(recorded.values()))
    form, where = forms[0], ", ".join(recorded)
    if len(forms) > 1:
        shown = ", ".join(f"{f or 'none'} ({p})" for p, f in recorded.items())
        what += f", Unicode {form or 'none'}: the sources' recipes differ ({shown}), the first one's applied"
    elif form:
        what += f", Unicode {form} (the recipe's, from {where})"
    else:
        what += f" (the recipe applied no Unicode form, {where})"
    return normalize_text(text, form), what


def _data_tokens(data: str, split_name: str, max_tokens: int | None, doc: dict):
    """(tokens, n_bytes or None, source, eos_id) of a shard folder's split, refusing a folder
    tokenized with another tokenizer than the run's."""
    from gptforge.data.loader import TokenStream
    from gptforge.data.shards import load_meta

    try:
        meta = load_meta(data)
    except ValueError as e:  # not JSON / not a shard folder: the message names the file
        raise InputError(str(e)) from None
    run_tok = (doc.get("data") or {}).get("tokenizer_sha256")
    if run_tok and meta.get("tokenizer_sha256") and run_tok != meta["tokenizer_sha256"]:
        raise InputError(
            f"{data} was tokenized with another tokenizer (sha256 {meta['tokenizer_sha256'][:12]}) "
            f"than the model was trained with ({run_tok[:12]}); evaluate on data prepared with "
            "--tokenizer RUN_DIR/tokenizer.json, or use --text FILE"
        )
    split = meta["splits"].get(split_name)
    if not split or not split.get("tokens"):
        other = [k for k, v in meta["splits"].items() if k != split_name and (v or {}).get("tokens")]
        hint = (f"prepare it with that split (`gptforge prepare ... --{split_name}-fraction 0.01`)"
                if split_name in ("val", "test") else "choose another split")
        raise InputError(f"{Path(data) / 'meta.json'}: split {split_name!r} is empty; {hint}"
                         + (f", or use --split {other[0]}" if other else ""))
    stream = TokenStream([Path(data) / f for f in split["files"]], meta["dtype"])
    n = stream.num_tokens if max_tokens is None else min(max_tokens, stream.num_tokens)
    tokens = stream.read(0, n)
    stream.close()
    n_bytes = split["bytes"] if n == split["tokens"] else None
    return tokens, n_bytes, f"{data} [{split_name}]", int(meta["eos_id"])


def _text_tokens(text_file: str, encoding: str | None, max_tokens: int | None, doc: dict, tok_path, ckpt):
    """(tokens, n_bytes or None, source, eos_id, text facts) of a text file read, normalized like
    the training data and tokenized with the run's tokenizer."""
    import numpy as np

    from gptforge.data.readers import read_text_file
    from gptforge.data.tokenizer import Tokenizer

    if tok_path is None:
        raise MissingInputError(f"no tokenizer.json found for {ckpt}; evaluate with --data instead")
    path = Path(text_file)
    if not path.is_file():
        what = "is a folder, not a file (name one text file)" if path.is_dir() else "no such file"
        raise MissingInputError(f"--text {path}: {what}")
    text = read_text_file(path, encoding=encoding)  # binary files refused; a BOM decoded
    file_bytes = len(text.encode("utf-8"))
    text, normalization = normalize_like_prepare(text, doc)
    tok = Tokenizer.from_file(tok_path)
    tokens = np.array(tok.encode(text), dtype=np.int64)
    if max_tokens is not None:
        tokens = tokens[:max_tokens]
    n_bytes = len(text.encode("utf-8")) if max_tokens is None else None
    facts = {"normalization": normalization, "text_bytes": len(text.encode("utf-8")), "file_text_bytes": file_bytes}
    return tokens, n_bytes, str(path), tok.eos_id, facts


def _write(out: str | None, doc: dict) -> None:
    """Write a perplexity measurement where asked (tasks merge into results.json instead)."""
    if out:
        from gptforge.atomic import atomic_write_json

        Path(out).parent.mkdir(parents=True, exist_ok=True)
        atomic_write_json(Path(out), doc)


def evaluate_perplexity(model: str, *, data: str | None = None, text: str | None = None, split: str = "val",
                        encoding: str | None = None, stride: int | None = None, batch_size: int | None = None,
                        max_tokens: int | None = None, precision: str = "fp32", device: str = "auto",
                        best: bool = False, out: str | None = None) -> tuple[dict, str]:
    """(result dict, human-readable report) of `model` on `text` (a file) or `data` (a shard folder's
    `split`; a mixture folder is scored per source, see `evaluate_mixture_folder`).

    The arguments are `gptforge evaluate`'s options of the same name (documented there). The dict
    holds loss (nats/token), perplexity, bits_per_byte (None on a partial split), tokens,
    checkpoint and source, and for `text` the normalization applied and the UTF-8 byte counts; it
    is written to `out` when given. A run trained with train.document_mask is scored under the
    same mask.

    Raises:
        InputError: another tokenizer than the run's, an empty split, stride out of range, fewer
            than 2 tokens (naming the source).
        MissingInputError: no such text file, or no tokenizer.json for `text`.
    """
    from gptforge.eval.model_source import load_eval_model
    from gptforge.eval.perplexity import evaluate_tokens
    from gptforge.runtime.device import pick_device

    dev = pick_device(device, "--device")
    net, ckpt, doc, tok_path = load_eval_model(model, dev, best)
    if data:
        from gptforge.data.mixture import mixture_folders

        folders = mixture_folders(data)
        if folders is not None:
            return evaluate_mixture_folder(net, ckpt, doc, folders, data, split, batch_size, precision, dev, out)
        tokens, n_bytes, source, eos_id = _data_tokens(data, split, max_tokens, doc)
        facts = {}
    else:
        tokens, n_bytes, source, eos_id, facts = _text_tokens(text, encoding, max_tokens, doc, tok_path, ckpt)
    try:
        masked = bool((doc.get("train") or {}).get("document_mask"))
        result = evaluate_tokens(net, tokens, n_bytes=n_bytes, stride=stride, batch_size=batch_size or 8,
                                 device=dev, progress=True, document_mask_eos=eos_id if masked else None)
    except ValueError as e:  # stride out of range, fewer than 2 tokens
        raise InputError(f"{source}: {e}") from None
    res = dict(result.as_dict(), checkpoint=str(ckpt), source=source, **facts)
    _write(out, res)
    bpb = f"{result.bits_per_byte:.4f}" if result.bits_per_byte is not None else "n/a (partial split)"
    lines = [f"{source}: {result.tokens:,} tokens scored with {ckpt}"]
    if facts:
        lines.append(f"  text normalized as prepare normalized the training data: {facts['normalization']}; bits "
                     f"per byte over the {facts['text_bytes']:,} UTF-8 bytes after normalization "
                     f"({facts['file_text_bytes']:,} as read)")
    lines.append(f"  loss {result.loss:.4f} nats/token | perplexity {result.perplexity:.2f} | bits per byte {bpb}")
    return res, "\n".join(lines)


def evaluate_mixture_folder(model, ckpt, doc: dict, folders: dict, data: str, split: str, batch_size: int | None,
                            precision: str, device, out: str | None = None) -> tuple[dict, str]:
    """(result dict, report) of a mixture folder (several `--source`): each source's loss and bits
    per byte on the run's validation windows (train.eval_steps x micro_batch_size, as training's
    validation; `gptforge.eval.perplexity.evaluate_mixture`) and the overall token-weighted mean.
    Written to `out` when given.

    Raises:
        InputError: a source folder the mixture cannot score (the message names it).
    """
    from gptforge.eval.perplexity import evaluate_mixture

    train = doc.get("train") or {}
    n_windows = int(train.get("eval_steps") or 20) * int(train.get("micro_batch_size") or 8)
    try:
        res = evaluate_mixture(model, folders, split, n_windows, batch_size or int(train.get("micro_batch_size") or 8),
                               device, precision, bool(train.get("document_mask")))
    except ValueError as e:
        raise InputError(str(e)) from None
    result = dict(res, checkpoint=str(ckpt), source=f"{data} [{split}]")
    _write(out, result)
    lines = [f"{result['source']}: {len(res['sources'])} sources scored with {ckpt} on {n_windows} windows each "
             "(train.eval_steps x micro_batch_size, as training's validation)"]
    for name, r in res["sources"].items():
        bpb = f"{r['bits_per_byte']:.4f}" if r["bits_per_byte"] is not None else "n/a"
        note = f" (the split holds {r['windows']} windows: each scored once)" if r["windows"] < n_windows else ""
        lines.append(f"  {name}: loss {r['loss']:.4f} nats/token | bits per byte {bpb}{note}")
    if res["loss"] is not None:
        lines.append(f"  overall: loss {res['loss']:.4f} (the token-weighted mean over the sources' {split} splits)")
    return result, "\n".join(lines)

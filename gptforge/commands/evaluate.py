"""`gptforge evaluate RUN_DIR_or_CHECKPOINT (--data DIR [--split val|test] | --text FILE)`."""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

DESCRIPTION = """Loss (nats/token), perplexity and bits per byte of a trained model over a whole
split of a prepared shard folder, or over a text file. Windows of block_size tokens slide by
--stride and score only their new tokens, so every token is counted once."""


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gptforge evaluate", description=DESCRIPTION)
    p.add_argument("model", help="Run directory (uses checkpoints/latest, or best with --best) or a checkpoint folder.")
    src = p.add_mutually_exclusive_group(required=True)
    src.add_argument("--data", help="Shard folder from `gptforge prepare`; scores --split.")
    src.add_argument("--text", help="A text file, tokenized with the run's tokenizer (binary files are refused).")
    p.add_argument("--encoding", default=None,
                   help="Encoding of --text when it has no byte-order mark (default UTF-8; UTF-16/32 with a BOM "
                        "are decoded).")
    p.add_argument("--split", default="val", choices=["train", "val", "test"], help="Split of --data (default val).")
    p.add_argument("--stride", type=int, default=None, help="Window shift in tokens (default block_size/2).")
    p.add_argument("--batch-size", type=int, default=8, help="Windows per forward pass (default 8).")
    p.add_argument("--max-tokens", type=int, default=None, help="Score only the first N tokens (for a quick look).")
    p.add_argument("--best", action="store_true", help="Use checkpoints/best instead of latest.")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, mps (default auto).")
    p.add_argument("--json", action="store_true", help="Print the result as JSON.")
    return p


def main(argv: list[str]) -> int:
    args = build_parser().parse_args(argv)
    import numpy as np

    from gptforge.data.loader import TokenStream
    from gptforge.eval.perplexity import evaluate_tokens
    from gptforge.runtime.device import pick_device
    from gptforge.runtime.loading import load_for_inference

    try:
        device = pick_device(args.device)
        model, ckpt, doc, tok_path = load_for_inference(args.model, device, "best" if args.best else "latest")
        if args.data:
            from gptforge.data.shards import load_meta

            meta = load_meta(args.data)
            run_tok = (doc.get("data") or {}).get("tokenizer_sha256")
            if run_tok and meta.get("tokenizer_sha256") and run_tok != meta["tokenizer_sha256"]:
                raise ValueError(
                    f"{args.data} was tokenized with another tokenizer (sha256 {meta['tokenizer_sha256'][:12]}) "
                    f"than the model was trained with ({run_tok[:12]}); evaluate on data prepared with "
                    "--tokenizer RUN_DIR/tokenizer.json, or use --text FILE"
                )
            split = meta["splits"].get(args.split)
            if not split or not split.get("tokens"):
                raise ValueError(f"{Path(args.data) / 'meta.json'}: split {args.split!r} is empty")
            stream = TokenStream([Path(args.data) / f for f in split["files"]], meta["dtype"])
            n = stream.num_tokens if args.max_tokens is None else min(args.max_tokens, stream.num_tokens)
            tokens = stream.read(0, n)
            stream.close()
            n_bytes = split["bytes"] if n == split["tokens"] else None
            source = f"{args.data} [{args.split}]"
        else:
            if tok_path is None:
                raise FileNotFoundError(f"no tokenizer.json found for {ckpt}; evaluate with --data instead")
            from gptforge.data.readers import read_text_file
            from gptforge.data.tokenizer import Tokenizer

            path = Path(args.text)
            if not path.is_file():
                raise FileNotFoundError(f"--text {path}: no such file")
            text = read_text_file(path, encoding=args.encoding)
            tok = Tokenizer.from_file(tok_path)
            tokens = np.array(tok.encode(text), dtype=np.int64)
            if args.max_tokens is not None:
                tokens = tokens[: args.max_tokens]
            n_bytes = len(text.encode("utf-8")) if args.max_tokens is None else None
            source = str(path)
        result = evaluate_tokens(model, tokens, n_bytes=n_bytes, stride=args.stride, batch_size=args.batch_size,
                                 device=device, progress=sys.stdout.isatty())
    except (FileNotFoundError, ValueError) as e:
        print(f"gptforge evaluate: error: {e}", file=sys.stderr)
        return 1
    out = dict(result.as_dict(), checkpoint=str(ckpt), source=source)
    if args.json:
        print(json.dumps(out, indent=2))
    else:
        bpb = f"{result.bits_per_byte:.4f}" if result.bits_per_byte is not None else "n/a (partial split)"
        print(f"{source}: {result.tokens:,} tokens scored with {ckpt}\n"
              f"  loss {result.loss:.4f} nats/token | perplexity {result.perplexity:.2f} | bits per byte {bpb}")
    return 0

"""`gptforge generate RUN_DIR_or_CHECKPOINT --prompt "..."`."""

from __future__ import annotations

import argparse
import sys


def build_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="gptforge generate",
                                description="Sample continuations of a prompt with a KV cache.")
    p.add_argument("model", help="Run directory (checkpoints/latest, or best with --best) or a checkpoint folder.")
    p.add_argument("--prompt", default="", help="Text to continue (default: start from <|endoftext|>).")
    p.add_argument("--max-new-tokens", type=int, default=200, help="Tokens to generate per sample (default 200).")
    p.add_argument("--temperature", type=float, default=0.8, help="Softmax temperature; 0 is greedy (default 0.8).")
    p.add_argument("--top-k", type=int, default=None, help="Sample only among the k most likely tokens.")
    p.add_argument("--top-p", type=float, default=None, help="Nucleus sampling: smallest set with this much mass.")
    p.add_argument("--num-samples", type=int, default=1, help="Independent samples (default 1).")
    p.add_argument("--seed", type=int, default=None, help="Seed for reproducible sampling.")
    p.add_argument("--no-cache", action="store_true", help="Recompute the whole context every token (slow; for checks).")
    p.add_argument("--stop-at-eos", action="store_true", help="Stop a sample at the end-of-text token (<|endoftext|>, or the tokenizer_config's eos_token).")
    p.add_argument("--chat", action="store_true",
                   help="Treat --prompt as a user message: render it with the run's chat template (the one "
                        "`finetune` trained with) and stop at the end-of-turn token.")
    p.add_argument("--best", action="store_true", help="Use checkpoints/best instead of latest.")
    p.add_argument("--device", default="auto", help="auto, cpu, cuda, mps (default auto).")
    return p


def main(argv: list[str]) -> int:
    parser = build_parser()
    args = parser.parse_args(argv)
    if args.temperature < 0:
        parser.error(f"--temperature must be >= 0 (0 is greedy), got {args.temperature}")
    if args.top_p is not None and not 0 < args.top_p <= 1:
        parser.error(f"--top-p must be in (0, 1], got {args.top_p}")
    if args.top_k is not None and args.top_k < 1:
        parser.error(f"--top-k must be >= 1, got {args.top_k}")
    if args.max_new_tokens < 0 or args.num_samples < 1:
        parser.error("--max-new-tokens must be >= 0 and --num-samples >= 1")
    import torch

    from gptforge.data.tokenizer import Tokenizer
    from gptforge.infer.generate import generate
    from gptforge.runtime.device import pick_device
    from gptforge.runtime.loading import load_for_inference

    try:
        device = pick_device(args.device)
        model, ckpt, _doc, tok_path = load_for_inference(args.model, device, "best" if args.best else "latest")
        if tok_path is None:
            raise FileNotFoundError(f"no tokenizer.json found beside {ckpt} or its run directory")
        tok = Tokenizer.from_file(tok_path)
        if args.chat:
            from gptforge.data.instruct import (
                DEFAULT_TEMPLATE,
                ChatTokenizer,
                prompt_ids,
            )

            chat = ChatTokenizer.from_dir(tok_path)
            use_default = ((_doc.get("finetune") or {}).get("chat_template") == "default")
            ids = prompt_ids(chat, [{"role": "user", "content": args.prompt}],
                             DEFAULT_TEMPLATE if use_default else None)
            tok.eos_id = chat.eos_id  # the end-of-turn token the template closes answers with
            args.stop_at_eos = True
        else:
            ids = tok.encode(args.prompt) if args.prompt else [tok.eos_id]
        if not ids:
            ids = [tok.eos_id]
        idx = torch.tensor([ids] * args.num_samples, dtype=torch.long, device=device)
        out = generate(model, idx, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                       top_p=args.top_p, seed=args.seed, use_cache=not args.no_cache,
                       eos_id=tok.eos_id if args.stop_at_eos else None)
    except (FileNotFoundError, ValueError) as e:
        print(f"gptforge generate: error: {e}", file=sys.stderr)
        return 1
    for i, row in enumerate(out.tolist()):
        new = row[len(ids):]
        if args.stop_at_eos and tok.eos_id in new:
            new = new[: new.index(tok.eos_id)]
        if args.num_samples > 1:
            print(f"--- sample {i + 1}")
        print(tok.decode(new) if args.chat else args.prompt + tok.decode(new))
    return 0

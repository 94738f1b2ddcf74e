"""`gptforge generate RUN_DIR_or_CHECKPOINT --prompt "..."`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from gptforge.options import bounded, command_parser, parse_command

# One description: `gptforge --help` lists SUMMARY (read from this file unimported); DESCRIPTION begins with it.
SUMMARY = "Sample continuations of a prompt from a run or checkpoint with a KV cache."


@dataclass
class GenerateOptions:
    model: str
    """Run directory (checkpoints/latest, or best with --best) or a checkpoint folder."""
    prompt: str = ""
    """Text to continue (default: start from <|endoftext|>)."""
    max_new_tokens: int = bounded(200, low=0)
    """Tokens to generate per sample."""
    temperature: float = bounded(0.8, low=0)
    """Softmax temperature; 0 is greedy."""
    top_k: Optional[int] = bounded(None, low=1)
    """Sample only among the k most likely tokens."""
    top_p: Optional[float] = bounded(None, low=0, high=1, low_open=True)
    """Nucleus sampling: smallest set with this much mass."""
    num_samples: int = bounded(1, low=1)
    """Independent samples."""
    seed: Optional[int] = bounded(None, low=0, high=2**64 - 1)
    """Seed for reproducible sampling."""
    no_cache: bool = False
    """Recompute the whole context every token (slow; for checks)."""
    stop_at_eos: bool = False
    """Stop a sample at the end-of-text token (<|endoftext|>, or the tokenizer_config's eos_token): the
    default; kept for older command lines."""
    no_stop_at_eos: bool = False
    """Go on past the end-of-text token (the model then starts a new document)."""
    chat: bool = False
    """Treat --prompt as a user message: render it with the run's chat template (the one `finetune`
    trained with) and stop at the end-of-turn token."""
    compile: bool = False
    """Decode through a compiled static-shape step (a fixed-length KV cache per power-of-two
    length bucket, torch.compile with Inductor's C++ wrapper): a one-off compile (seconds to a few
    minutes on a CPU, cached on disk), then less per-token overhead; pays most on small models
    (bench/RESULTS.md, issue 29)."""
    speculative: Optional[str] = None
    """`ngram`: speculative decoding with drafts looked up in the prompt and output so far, verified
    in one forward pass (greedy output equals plain decoding's; the prompt and --max-new-tokens must
    fit in the context). Prints the draft tokens accepted to stderr."""
    num_speculative_tokens: int = bounded(4, low=1)
    """Draft tokens per sample and step with --speculative."""
    best: bool = False
    """Use checkpoints/best instead of latest."""
    device: str = "auto"
    """auto, cpu, cuda, mps."""


DESCRIPTION = SUMMARY


def build_parser():
    return command_parser("gptforge generate", DESCRIPTION,
                          GenerateOptions, positional=("model",))


def main(argv: list[str]) -> int:
    args, _ = parse_command(build_parser(), argv)
    # Numeric ranges (--temperature, --top-p, ...) are checked by parse_command (`bounded` fields).
    import torch

    from gptforge.data.tokenizer import Tokenizer
    from gptforge.infer.generate import generate
    from gptforge.infer.slots import kv_cache_excess
    from gptforge.infer.spec_generate import check_decode_options
    from gptforge.runtime.device import pick_device
    from gptforge.runtime.loading import load_for_inference

    check_decode_options(args.speculative, args.compile, args.no_cache)
    device = pick_device(args.device, "--device")
    model, ckpt, _doc, tok_path = load_for_inference(args.model, device, "best" if args.best else "latest")
    if tok_path is None:
        raise FileNotFoundError(f"no tokenizer.json found beside {ckpt} or its run directory")
    tok = Tokenizer.from_file(tok_path)
    if args.chat:
        from gptforge.data.chat import DEFAULT_TEMPLATE, ChatTokenizer, prompt_ids

        chat = ChatTokenizer.from_dir(tok_path)
        use_default = ((_doc.get("finetune") or {}).get("chat_template") == "default")
        ids = prompt_ids(chat, [{"role": "user", "content": args.prompt}],
                         DEFAULT_TEMPLATE if use_default else None)
        tok.eos_id = chat.eos_id  # the end-of-turn token the template closes answers with
        args.stop_at_eos = True
        if not (_doc or {}).get("finetune") and not chat.chat_template:  # a base model: no template of its own
            import sys

            print("gptforge generate: warning: --chat on a model not fine-tuned on chat: the prompt goes through "
                  "the default template it never saw; expect poor answers (fine-tune with `gptforge finetune` "
                  "first)", file=sys.stderr)
    else:
        ids = tok.encode(args.prompt) if args.prompt else [tok.eos_id]
        args.stop_at_eos = not args.no_stop_at_eos  # a document ends at EOS: stop there by default
    if not ids:
        ids = [tok.eos_id]
    block = model.config.block_size
    if len(ids) > block:  # said here as one line; generate() would cut it the same way with a Python warning
        import sys

        what = "the chat prompt (template included)" if args.chat else "--prompt"
        print(f"gptforge generate: warning: {what} is {len(ids)} tokens, longer than the model's context of "
              f"{block} tokens: the first {len(ids) - block} tokens are dropped and generation continues from the "
              f"last {block}", file=sys.stderr)
        ids = ids[-block:]
    excess = kv_cache_excess(model, args.num_samples, min(len(ids) + args.max_new_tokens, block))
    if excess is not None:
        from gptforge.errors import OptionError

        raise OptionError(f"--num-samples {args.num_samples}: {excess}; lower --num-samples")
    eos_id = tok.eos_id if args.stop_at_eos else None
    if args.speculative:
        import sys

        from gptforge.infer.spec_generate import speculative_generate

        rows, st = speculative_generate(model, [ids] * args.num_samples, args.max_new_tokens, args.num_speculative_tokens,
                                        tok.decode, args.temperature, args.top_k, args.top_p, args.seed, eos_id)
        print(f"gptforge generate: speculative ngram: {st.spec_accepted_tokens} of {st.spec_draft_tokens} draft "
              "tokens accepted", file=sys.stderr)
    else:
        idx = torch.tensor([ids] * args.num_samples, dtype=torch.long, device=device)
        rows = [row[len(ids):] for row in generate(
            model, idx, args.max_new_tokens, temperature=args.temperature, top_k=args.top_k, top_p=args.top_p,
            seed=args.seed, use_cache=not args.no_cache, eos_id=eos_id, compile=args.compile).tolist()]
    for i, new in enumerate(rows):
        if args.stop_at_eos and tok.eos_id in new:
            new = new[: new.index(tok.eos_id)]
        if args.num_samples > 1:
            print(f"--- sample {i + 1}")
        print(tok.decode(new) if args.chat else args.prompt + tok.decode(new))
    return 0


"""`gptforge generate --speculative ngram`: prompts continued through an `Engine` with n-gram
speculation (`gptforge.infer.speculative`), apart from it since it drives the engine, which imports
the speculator."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gptforge.infer.engine import Engine, SamplingParams


def check_decode_options(speculative: str | None, compile: bool, no_cache: bool) -> None:
    """`gptforge generate`'s decoding flags that cannot go together, refused before the model loads.

    Raises:
        OptionError: --compile with --no-cache (it compiles the cached decode step); --speculative
            with a method other than `ngram`, or with --compile or --no-cache (speculation decodes
            through the serving engine); one line naming both flags.
    """
    from gptforge.errors import OptionError

    if compile and no_cache:  # generate() refuses it too, in its Python arguments' names
        raise OptionError("--compile needs the KV cache (it compiles the cached decode step): drop --no-cache "
                          "or --compile")
    if speculative is None:
        return
    if speculative != "ngram":
        raise OptionError(f"--speculative {speculative!r}: the only method is `ngram`")
    for flag, on in (("compile", compile), ("no-cache", no_cache)):
        if on:
            raise OptionError(f"--speculative decodes through the serving engine, not with --{flag}: drop one of them")


def speculative_generate(model: Any, prompts: Sequence[Sequence[int]], max_new_tokens: int, k: int,
                         decode: Any, temperature: float = 1.0, top_k: int | None = None, top_p: float | None = None,
                         seed: int | None = None, eos_id: int | None = None) -> tuple[list[list[int]], Any]:
    """`gptforge generate --speculative ngram`: continue each prompt (lists of ids) by up to
    `max_new_tokens` tokens through an `Engine` with n-gram speculation of `k` tokens, all rows in
    one batch. Row i samples with seed + i (seed None: nondeterministic); a row stops after `eos_id`
    (included). decode: ids -> text (the engine detokenizes as it goes).

    Returns: (generated ids per prompt, the engine's EngineStats: drafts verified and accepted).

    Raises:
        InputError: a prompt + max_new_tokens longer than the model's block_size (speculation runs
            within the context; it does not slide past it), naming --max-new-tokens.
        ValueError: an empty prompt.
    """
    from gptforge.errors import InputError

    block = model.config.block_size
    longest = max((len(p) for p in prompts), default=0)
    if longest + max_new_tokens > block:
        raise InputError(f"--speculative runs within the context: the prompt's {longest} tokens + --max-new-tokens "
                         f"{max_new_tokens} exceed the model's {block}; lower --max-new-tokens")

    engine = Engine(model, decode, max_batch_size=max(1, len(prompts)), prefix_caching=False, speculative="ngram",
                    num_speculative_tokens=k)
    outs: list[list[int]] = [[] for _ in prompts]
    for i, p in enumerate(prompts):
        params = SamplingParams(max_tokens=max_new_tokens, temperature=temperature, top_k=top_k or 0,
                                top_p=1.0 if top_p is None else top_p, seed=None if seed is None else seed + i,
                                stop_token_ids=() if eos_id is None else (eos_id,))
        engine.submit(list(p), params, _collector(outs[i]))
    while engine.step():
        pass
    return outs, engine.stats


def _collector(out: list[int]):
    """An engine `on_event` callback appending each generated token id to `out`."""
    def on_event(ev) -> None:
        if ev.token_id is not None:
            out.append(ev.token_id)
    return on_event

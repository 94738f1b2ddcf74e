"""The near-tie rule of issue 45: two greedy decodings of one prompt are equal, unless at the first
token where they differ the reference's top-2 logit gap is below NEAR_TIE (float rounding of
another pass may then pick the other token); such a difference is a "flip"."""

from __future__ import annotations

NEAR_TIE = 1e-4


def greedy_flip(ref_tokens: list[int], ref_gaps: list[float], other: list[int]) -> tuple[int, bool]:
    """(tokens compared equal, flipped): compares `other` with the reference decoding `ref_tokens`,
    whose top-2 logit gaps (logit or log-prob: the same difference) per token are `ref_gaps`.

    Raises:
        AssertionError: they differ at a token whose reference gap is NEAR_TIE or more.
    """
    for i, (a, b) in enumerate(zip(ref_tokens, other, strict=False)):
        if a != b:
            assert ref_gaps[i] < NEAR_TIE, f"token {i}: {b} instead of {a}, top-2 gap {ref_gaps[i]:.2e}"
            return i, True
    assert len(ref_tokens) == len(other), (ref_tokens, other)
    return len(ref_tokens), False


def event_tokens_and_gaps(events) -> tuple[list[int], list[float]]:
    """Generated ids and top-2 log-prob gaps from engine Events (requested with logprobs >= 2)."""
    toks, gaps = [], []
    for e in events:
        if e.token_id is not None:
            toks.append(e.token_id)
            top = e.logprob.top
            gaps.append(top[0][1] - top[1][1])
    return toks, gaps

"""n-gram speculative decoding (prompt lookup): proposals with no draft model, verified in one forward.

Proposal (`NgramIndex.propose`): the last n tokens of a sequence (prompt and output so far), n from
NGRAM_MAX down to NGRAM_MIN, are looked up among its earlier tokens; at the most recent earlier
occurrence, the up to k tokens that followed it are the draft (Saxena's prompt lookup decoding;
vLLM's `ngram` method). An index of every n-gram's latest end position makes a proposal O(NGRAM_MAX)
dictionary look-ups, whatever the sequence's length. A sequence whose drafts keep failing backs
off (MAX_BACKOFF).

Verification (`Speculator.decode`): one forward pass feeds each row its newest token and its draft
d_1..d_m at positions filled.., so position i's logits are those of the next token after the
context plus d_1..d_i. The row's own sampling (greedy, temperature, top-k/p, penalties, seed) then
draws the token after each position in turn; while the drawn token equals the draft's next one the
following position's logits hold, and the first token that differs (or a stop) ends the row's step.
Each token is thus drawn from exactly the distribution plain decoding would draw it from, with the
same random stream: the output equals plain decoding's (greedy, or sampled with a seed) up to float
rounding of the wider pass. A draft token is accepted with probability p(draft), as rejection
sampling with a one-hot draft distribution accepts it (Leviathan et al. 2023, Chen et al. 2023).
The keys and values written for rejected draft positions lie past the row's length: its mask hides
them and its next tokens overwrite them.

Structured output (`gptforge.infer.grammar`): a constrained row's draft is cut at the first token
its grammar refuses (`Constraint.valid_prefix`, from the matcher's current state), and each token is
still drawn through the row's grammar mask, advanced token by token, so its output is exactly that
of plain constrained decoding; a draft token is accepted only where the masked distribution drew it.
"""

from __future__ import annotations

import weakref
from collections.abc import Sequence
from typing import Any

NGRAM_MAX = 4
"""Longest suffix looked up."""
NGRAM_MIN = 2
"""Shortest suffix looked up: a single token matches too often on free text, where a wrong draft
costs the wider pass for nothing."""
SPECULATIVE_METHODS = ("ngram",)
MAX_BACKOFF = 16
"""After m drafts in a row of which nothing was accepted, a sequence proposes nothing for the next
min(2^(m-1), MAX_BACKOFF) steps: on text that does not repeat itself, wrong drafts would otherwise
cost every step the wider pass."""


class NgramIndex:
    """The n-grams (NGRAM_MIN <= n <= NGRAM_MAX) of one growing token sequence and where each last ended.

    An n-gram ending at position j is entered only once token j+1 exists, so a look-up of the
    sequence's own suffix finds an earlier occurrence, never itself.
    """

    def __init__(self, n_min: int = NGRAM_MIN, n_max: int = NGRAM_MAX):
        self.n_min, self.n_max = n_min, n_max
        self.tokens: list[int] = []
        self.ends: dict[tuple[int, ...], int] = {}  # n-gram -> the position just after its latest entry
        self.misses = 0  # drafts in a row with nothing accepted
        self.skip = 0  # steps left without a draft (MAX_BACKOFF)

    def verified(self, accepted: int) -> None:
        """Record how many tokens of the last draft were accepted (the back-off rule)."""
        self.misses = 0 if accepted else self.misses + 1
        self.skip = min(2 ** (self.misses - 1), MAX_BACKOFF) if self.misses else 0

    def extend(self, tokens: Sequence[int]) -> None:
        """Append `tokens` to the sequence."""
        toks = self.tokens
        for t in tokens:
            j = len(toks) - 1  # the n-grams ending at j are entered now that token j+1 arrives
            for n in range(self.n_min, self.n_max + 1):
                if j - n + 1 < 0:
                    break
                self.ends[tuple(toks[j - n + 1:j + 1])] = j + 1
            toks.append(t)

    def propose(self, k: int) -> list[int]:
        """Up to k tokens that followed the latest earlier occurrence of the longest suffix found."""
        toks = self.tokens
        for n in range(min(self.n_max, len(toks)), self.n_min - 1, -1):
            e = self.ends.get(tuple(toks[-n:]))
            if e is not None:
                return toks[e:e + k]
        return []


class Speculator:
    """n-gram drafts of up to `k` tokens per row, verified in the engine's decode pass.

    Args:
        k: draft tokens per row and step (--num-speculative-tokens), >= 1.

    Raises:
        ValueError: k < 1.
    """

    def __init__(self, k: int):
        if k < 1:
            raise ValueError(f"num_speculative_tokens must be >= 1 for n-gram speculation, got {k}")
        self.k = k
        self._index: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()

    def draft(self, seq: Any, room: int) -> list[int]:
        """The draft of an engine `Request`: at most min(k, room) tokens."""
        idx = self._index.get(seq)
        if idx is None:
            idx = self._index[seq] = NgramIndex()
        have = len(idx.tokens)
        n_prompt = len(seq.prompt)
        if have < n_prompt:
            idx.extend(seq.prompt[have:])
            have = n_prompt
        idx.extend(seq.generated[have - n_prompt:])
        if idx.skip:
            idx.skip -= 1
            return []
        draft = idx.propose(min(self.k, room)) if room > 0 else []
        constraint = getattr(seq, "constraint", None)
        if draft and constraint is not None:  # a grammar-constrained row: the tokens its grammar allows
            draft = draft[:constraint.valid_prefix(draft)]
        return draft

    def decode(self, engine: Any, seqs: list[Any], event_class: Any) -> list[tuple[Any, Any]]:
        """One decode step of `engine` (a `gptforge.infer.engine.Engine`) for `seqs`: each row's
        newest token and its draft in one forward pass, then its tokens drawn in turn (see the module
        docstring). Rows whose slot has no room for the pass's width run in a plain one-token pass.
        event_class: the engine's `Event` (passed in: the engine imports this module).
        Returns (sequence, Event) pairs, one per drawn token, in order."""
        max_len = engine.max_model_len
        drafts = []
        for s in seqs:  # room: tokens still allowed after this step's first, and slot positions left
            room = min(s.params.max_tokens - len(s.generated) - 1, max_len - s.length)
            drafts.append(self.draft(s, room))
        T = 1 + max(len(d) for d in drafts)
        wide = [b for b, s in enumerate(seqs) if s.length - 1 + T <= max_len]
        narrow = [b for b in range(len(seqs)) if b not in set(wide)]
        out: list[tuple[Any, Any]] = []
        stats = engine.stats
        for rows, width in ((wide, T), (narrow, 1)):
            if not rows:
                continue
            group = [seqs[b] for b in rows]
            ds = [drafts[b][:width - 1] for b in rows]
            ids = [[s.generated[-1]] + d + [0] * (width - 1 - len(d)) for s, d in zip(group, ds, strict=True)]
            logits = engine._forward(group, ids, [s.length - 1 for s in group]).float()  # (B, width, V)
            for b, (s, d) in enumerate(zip(group, ds, strict=True)):
                stats.spec_draft_tokens += len(d)
                accepted = 0
                for i in range(len(d) + 1):
                    out.append((s, engine._sample(s, logits[b, i], event_class())))
                    if s.finished or i == len(d) or s.generated[-1] != d[i]:
                        break
                    accepted += 1
                stats.spec_accepted_tokens += accepted
                if d:
                    self._index[s].verified(accepted)
            stats.decode_passes += 1
        return out


def make_speculator(method: str | None, k: int) -> Speculator | None:
    """The engine's speculator for `--speculative METHOD --num-speculative-tokens K` (None: off).

    Raises:
        ValueError: an unknown method (naming the known ones), or k < 1 with a method.
    """
    if method is None:
        return None
    if method not in SPECULATIVE_METHODS:
        raise ValueError(f"speculative method {method!r} is unknown: use one of {', '.join(SPECULATIVE_METHODS)}")
    return Speculator(k)

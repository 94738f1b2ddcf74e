"""Which log-probabilities an answer reports, and where each token's text starts.

One rule for streamed and whole answers, completions and chat alike: a generated token's entry is
reported once its text is part of the answer's text, so the tokens of a stop string that cut the
answer (and the end-of-text token, whose text is never shown) are not reported, and no offset
passes the text. Offsets come from an incremental decode (`StreamDetokenizer`): a token holding
the first bytes of a character and the token completing it share the character's offset.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from gptforge.infer.engine import Event, TokenLogprob
from gptforge.infer.stream import StreamDetokenizer

Entry = tuple[int, "TokenLogprob | None", int]
"""(token id, its log-probability or None, character offset of its text in the choice's text)."""


def prompt_entries(decode: Callable[[list[int]], str], ids: Sequence[int],
                   logprobs: Sequence[TokenLogprob | None]) -> list[Entry]:
    """Entries of echoed prompt tokens `ids` (logprobs[0] is None: the first token has no
    prediction), with offsets from the start of the prompt's text."""
    detok = StreamDetokenizer(decode)
    out: list[Entry] = []
    offset = 0
    for token_id, lp in zip(ids, logprobs, strict=False):
        out.append((token_id, lp, offset))
        offset += len(detok.push(token_id))
    return out


class AnsweredLogprobs:
    """The generated tokens' entries of one choice, released as their text is answered.

    offset0: where the generated text starts in the choice's text (characters; the prompt's length
    for completions, whose offsets count from the prompt's start; 0 for chat).
    """

    def __init__(self, decode: Callable[[list[int]], str], offset0: int = 0):
        self.detok = StreamDetokenizer(decode)
        self.offset0 = offset0
        self.decoded = 0  # characters of the generated tokens' decode so far
        self.answered = 0  # characters of the answer's text so far (stop strings cut it)
        self.pending: list[Entry] = []

    def push(self, ev: Event) -> list[Entry]:
        """Take one engine event; return the entries whose text the answer now holds, in order
        (none of the rest once the event finishes the choice)."""
        if ev.token_id is not None:
            self.pending.append((ev.token_id, ev.logprob, self.offset0 + self.decoded))
            self.decoded += len(self.detok.push(ev.token_id))
        self.answered += len(ev.text)
        n = 0
        while n < len(self.pending) and self.pending[n][2] - self.offset0 < self.answered:
            n += 1
        ready, self.pending = self.pending[:n], self.pending[n:]
        if ev.finish_reason is not None:
            self.pending = []
        return ready

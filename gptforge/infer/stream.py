"""Streaming text out of a token stream: whole characters only, and stop strings held back.

Byte-level BPE tokens (GPT-2, Radford et al. 2019, section 2.2) can end inside a UTF-8 character:
an emoji or a Chinese character may take two or three tokens. Decoding each token alone gives
U+FFFD replacement characters; decoding the whole text every token costs O(n) per token.
`StreamDetokenizer` decodes a short window of recent tokens twice (with and without the newest)
and emits only the new suffix, and only when it does not end in an incomplete character (the
prefix/read offsets scheme of Hugging Face text-generation-inference and vLLM). The deltas it
emits, followed by `flush()`, concatenate to exactly `decode(all ids)`.

`StopStringFilter` sits after it: it emits text up to the first stop string and holds back any
tail that could still become the start of one.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

REPLACEMENT = "\ufffd"


class StreamDetokenizer:
    """Incremental decoder: `push(token_id) -> str` delta of complete characters; `flush() -> str`.

    decode: ids -> text (e.g. `Tokenizer.decode`). The concatenation of all deltas and the flush
    equals `decode(every pushed id)` for tokenizers whose decoding of a sequence is the decoding
    of its bytes (byte-level BPE); an incomplete trailing character is held until the tokens that
    complete it arrive, or until `flush` (which then emits what `decode` gives for it).
    """

    def __init__(self, decode: Callable[[list[int]], str]):
        self.decode = decode
        self.ids: list[int] = []
        self.prefix_offset = 0  # window start: a token boundary at a complete character
        self.read_offset = 0  # tokens up to here have been emitted as text
        self.emitted = 0  # characters emitted so far

    def push(self, token_id: int) -> str:
        """Add one token id; return the newly completed text ("" while a character is incomplete)."""
        self.ids.append(int(token_id))
        prefix = self.decode(self.ids[self.prefix_offset:self.read_offset])
        text = self.decode(self.ids[self.prefix_offset:])
        if len(text) > len(prefix) and not text.endswith(REPLACEMENT):
            delta = text[len(prefix):]
            self.prefix_offset, self.read_offset = self.read_offset, len(self.ids)
            self.emitted += len(delta)
            return delta
        return ""

    def flush(self) -> str:
        """The text of the tokens not yet emitted (e.g. a final incomplete character as U+FFFD)."""
        prefix = self.decode(self.ids[self.prefix_offset:self.read_offset])
        text = self.decode(self.ids[self.prefix_offset:])
        self.prefix_offset = self.read_offset = len(self.ids)
        delta = text[len(prefix):]
        self.emitted += len(delta)
        return delta


class StopStringFilter:
    """Cut a text stream at the first of `stop` strings, holding back a tail that may start one.

    push(delta) -> (text safe to emit, stopped). After stopping, nothing more is emitted and the
    stop string itself never is. flush() -> the held-back tail (when the stream ends without a stop).
    """

    def __init__(self, stop: Sequence[str] = ()):
        self.stop = [s for s in stop if s]
        self.text = ""
        self.sent = 0
        self.stopped = False

    def push(self, delta: str) -> tuple[str, bool]:
        if self.stopped:
            return "", True
        # A stop string may straddle deltas: search from where a match could still begin.
        begin = max(0, len(self.text) - max((len(s) for s in self.stop), default=0))
        self.text += delta
        hits = [i for i in (self.text.find(s, begin) for s in self.stop) if i >= 0]
        if hits:
            cut = min(hits)
            out, self.sent, self.stopped = self.text[self.sent:cut], cut, True
            return out, True
        hold = 0
        for s in self.stop:  # the longest tail of the text that is a proper prefix of a stop string
            for k in range(min(len(s) - 1, len(self.text)), hold, -1):
                if self.text.endswith(s[:k]):
                    hold = k
                    break
        safe = len(self.text) - hold
        out = self.text[self.sent:safe]
        self.sent = max(self.sent, safe)
        return out, False

    def flush(self) -> str:
        if self.stopped:
            return ""
        out, self.sent = self.text[self.sent:], len(self.text)
        return out

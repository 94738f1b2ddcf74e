"""Byte windows of a big curated shard, so that its tokenization is shared between workers.

A single big input file (a 500 MB .txt, one document without --doc-separator, or many with
one) is one work shard, so curation gives one worker all of it; tokenizing it, the slowest phase,
in that one worker left the other cores idle. `plan_encode_windows` cuts a curated shard holding
more than twice `window_bytes` UTF-8 bytes into windows of about `window_bytes`: consecutive
spans of documents (whole documents where they fit, a big document in several spans), each
window a task of its own. A span inside a document is cut where a run of whitespace starts (as
`text_stats.whitespace_pieces` cuts), so the tokens of the spans, concatenated, are those of the
whole text; only the span that ends a document (or a train/val/test piece of it) is followed by
EOS. The windows' outputs are appended in order, so the token files are byte-identical to an
unwindowed run (a test checks this).

The text is read through a memory map of the shard's Arrow file (`ShardText`): a worker decodes
only its window's bytes, so its memory is bounded by the window, not by the document.
"""

from __future__ import annotations

import bisect
import re
from collections.abc import Callable
from pathlib import Path

import numpy as np

#: a cut point: the first character of a whitespace run (space, newline, tab, CR after a non-whitespace byte).
_RUN_START = re.compile(rb"(?<![ \n\t\r])[ \n\t\r]")


class ShardText:
    """Zero-copy access to the UTF-8 bytes of a curated shard's texts (`WorkFolder.curated`, an
    Arrow IPC file of id and text)."""

    def __init__(self, path: Path):
        import pyarrow as pa

        self._source = pa.memory_map(str(path))
        reader = pa.ipc.open_file(self._source)
        self._batches = [reader.get_batch(b) for b in range(reader.num_record_batches)]
        self._starts = np.cumsum([0] + [b.num_rows for b in self._batches]).tolist()
        self.documents = self._starts[-1]

    def _locate(self, pos: int) -> tuple[int, int]:
        b = bisect.bisect_right(self._starts, pos) - 1
        return b, pos - self._starts[b]

    def _text_column(self, b: int) -> tuple[np.ndarray, memoryview]:
        arr = self._batches[b].column("text")
        bufs = arr.buffers()
        offsets = np.frombuffer(bufs[1], dtype=np.int64, count=len(arr) + 1, offset=arr.offset * 8)
        return offsets, memoryview(bufs[2]).cast("B")

    def text_bytes(self, pos: int) -> memoryview:
        """The UTF-8 bytes of document `pos` (its position in the shard), without a copy."""
        b, j = self._locate(pos)
        offsets, data = self._text_column(b)
        return data[int(offsets[j]):int(offsets[j + 1])]

    def byte_sizes(self) -> np.ndarray:
        """UTF-8 bytes of every document, shape (documents,) int64."""
        parts = [np.diff(self._text_column(b)[0]) for b in range(len(self._batches))]
        return np.concatenate(parts).astype(np.int64) if parts else np.zeros(0, np.int64)

    def keys(self) -> list[str]:
        """Every document's split key, in shard order."""
        return [i for b in self._batches for i in b.column("key").to_pylist()]


def snap_to_whitespace(data: memoryview, target: int, end: int, limit: int) -> int:
    """The first cut point at or after `target` and before `end`: a whitespace run's first byte.

    Searched within `limit` bytes; without one there, a hard cut at the first UTF-8 character
    boundary at or after `target + limit` (there the tokens may differ, as with
    `whitespace_pieces`' hard limit). Returns `end` when the cut would reach it.
    """
    if target >= end:
        return end
    m = _RUN_START.search(data, target, min(end, target + limit))
    if m is not None:
        return m.start()
    cut = target + limit
    while cut < end and (data[cut] & 0xC0) == 0x80:  # not inside a multi-byte character
        cut += 1
    return min(cut, end)


def char_to_byte_offsets(data: memoryview, chars: list[int], chunk: int = 16 << 20) -> list[int]:
    """Byte offsets in UTF-8 `data` of the (ascending) character offsets `chars`, read in chunks."""
    out: list[int] = []
    seen_chars = 0  # characters before the current chunk
    k = 0
    for lo in range(0, len(data) + 1, chunk):
        if k == len(chars):
            break
        a = np.frombuffer(data[lo:lo + chunk], dtype=np.uint8)
        starts = np.flatnonzero((a & 0xC0) != 0x80)  # first byte of each character
        while k < len(chars) and chars[k] - seen_chars < starts.size:
            out.append(lo + int(starts[chars[k] - seen_chars]))
            k += 1
        seen_chars += starts.size
    out.extend([len(data)] * (len(chars) - k))  # at or past the end
    return out


def plan_encode_windows(text: ShardText, mask: np.ndarray | None, split_of: Callable[[str], str],
                        cuts: dict[str, list], window_bytes: int) -> list[list[list]] | None:
    """Windows of about `window_bytes` over a shard's kept documents, or None when it is small.

    A shard is windowed when its kept documents hold more than 2 * `window_bytes` UTF-8 bytes,
    into ceil(bytes / `window_bytes`) windows of equal size (so that the last round of tasks is
    not one small window).
    `split_of(key)` is a document's split; `cuts` the position splits ({split key: [[0, "train"], [char,
    "val"], ...]}, character offsets, see `prepare.cut_pieces`). Each window is a list of spans
    `[pos, piece_start, start, end, piece_end, split]` (byte offsets in document `pos`): the
    piece [piece_start, piece_end) is one text of the output (a whole document or a split piece
    of one); the span is its part [start, end), first when start == piece_start, last (followed
    by EOS) when end == piece_end.
    """
    sizes = text.byte_sizes()
    kept = np.ones(sizes.size, bool) if mask is None else ~np.asarray(mask, bool)
    total = int(sizes[kept].sum())
    if total <= 2 * window_bytes:
        return None
    window_bytes = -(-total // -(-total // window_bytes))  # windows of equal size: no small last one
    keys = text.keys()
    windows: list[list[list]] = [[]]
    size = 0
    for pos in np.flatnonzero(kept).tolist():
        n = int(sizes[pos])
        doc_key = keys[pos]
        if doc_key in cuts:
            chars = [int(c) for c, _ in cuts[doc_key]]
            starts = char_to_byte_offsets(text.text_bytes(pos), chars) if n > 0 else [0] * len(chars)
            pieces = [(split, b, e) for (_, split), b, e in zip(cuts[doc_key], starts, starts[1:] + [n], strict=True)]
        else:
            pieces = [(split_of(doc_key), 0, n)]
        data = None
        for split, p0, p1 in pieces:
            start = p0
            while True:
                room = window_bytes - size
                if p1 - start <= room:
                    windows[-1].append([pos, p0, start, p1, p1, split])
                    size += p1 - start
                    break
                if data is None:
                    data = text.text_bytes(pos)
                cut = snap_to_whitespace(data, start + max(room, 1), p1, window_bytes)
                windows[-1].append([pos, p0, start, cut, p1, split])
                size += cut - start
                if cut >= p1:
                    break
                start = cut
                windows.append([])
                size = 0
            if size >= window_bytes:
                windows.append([])
                size = 0
    return [w for w in windows if w]

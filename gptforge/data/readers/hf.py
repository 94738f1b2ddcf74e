"""hf:NAME[:CONFIG]: a Hugging Face dataset from the local cache."""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Iterator
from pathlib import Path

import gptforge.data.readers.base as base
from gptforge.data.readers.base import Document, Opener, Reader, ReadOptions, ReadStats

log = logging.getLogger("gptforge.data")


class HFReader(Reader, registered=False):
    """`hf:NAME[:CONFIG]`: the train split of a Hugging Face dataset, streamed with `datasets`.

    Ids are `hf:NAME[:CONFIG]#ROW`. Needs network access to the Hub (or its cache). Chosen by the
    `hf:` prefix of an input (`dispatch.read_file`), not by extension.
    """

    def read(self, path: Path, stats: ReadStats, options: ReadOptions, opener: Opener | None = None) -> Iterator[Document]:
        return _read_hf(str(path), stats, options.text_field)


def _read_hf(spec: str, stats: ReadStats, text_field: str) -> Iterator[Document]:
    try:
        import datasets
    except ImportError as e:
        raise base.BadFileError("unreadable", f"{spec}: reading Hugging Face datasets needs the datasets package "
                           f"(pip install 'gptforge[hf]'); local save_to_disk folders and .arrow files "
                           f"read without it") from e
    name, _, config = spec[len(base.HF_PREFIX):].partition(":")
    try:
        ds = datasets.load_dataset(name, config or None, split="train", streaming=True)
    except Exception as e:  # the Hub client raises many types; all mean "cannot open it"
        raise base.BadFileError("unreadable", f"{spec}: cannot open the dataset ({type(e).__name__}: {e})") from e
    for row, record in enumerate(ds):
        t = base.text_of(record, text_field, f"{spec}#{row}", stats)
        if t is None:
            continue
        stats.documents += 1
        yield Document(t, f"{spec}#{row}", spec, base.metadata_of(record, text_field))


def hf_dataset_folder(root: str, names: list[str]) -> list[Path] | None:
    """The .arrow files of a Hugging Face `save_to_disk` folder (state.json order), else None."""
    if "state.json" not in names or "dataset_info.json" not in names:
        return None
    try:
        with open(os.path.join(root, "state.json"), encoding="utf-8") as f:
            state = json.load(f)
        files = [d["filename"] for d in state.get("_data_files", [])]
    except (OSError, json.JSONDecodeError, KeyError, TypeError):
        files = []
    if not files:
        files = sorted(n for n in names if n.endswith(".arrow"))
    return [Path(os.path.normpath(os.path.join(root, f))) for f in files]

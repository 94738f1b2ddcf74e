"""Dataclass <-> plain dict for YAML/JSON, rejecting unknown keys with the nearest valid spelling."""

from __future__ import annotations

import dataclasses
import difflib
from dataclasses import fields
from typing import Any


def _did_you_mean(word: str, choices) -> str:
    close = difflib.get_close_matches(word, list(choices), n=1, cutoff=0.5)
    return f" (did you mean {close[0]!r}?)" if close else ""


def to_dict(obj) -> Any:
    """Dataclass (nested) -> plain dict, for YAML/JSON."""
    if dataclasses.is_dataclass(obj):
        return {f.name: to_dict(getattr(obj, f.name)) for f in fields(obj)}
    if isinstance(obj, dict):
        return {k: to_dict(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [to_dict(v) for v in obj]
    return obj


def from_dict(cls, data: dict, where: str = ""):
    """Plain dict -> dataclass `cls`, rejecting unknown keys with the nearest valid spelling.

    Raises:
        ValueError: an unknown key, naming `where.key` and a suggestion.
    """
    names = {f.name for f in fields(cls)}
    for k in data:
        if k not in names:
            raise ValueError(f"unknown config key {where}{k!r}{_did_you_mean(k, names)}")
    return cls(**{k: v for k, v in data.items()})

"""The project's exceptions: failures gptforge expects and explains in one line.

`gptforge <command>` prints a `GptforgeError` (and an operating-system error such as a missing
file, a full disk or a read-only folder) as one `gptforge <command>: error: ...` line; anything
else keeps its traceback, and `gptforge --debug <command>` shows tracebacks for all.
Each class also derives from the built-in exception it refines, so `except ValueError` callers
keep working.
"""

from __future__ import annotations


class GptforgeError(Exception):
    """A known failure: the message says what was wrong, where, and what to do."""


class InputError(GptforgeError, ValueError):
    """Bad input: an option, a config key, a data file or a task file that cannot be used."""


class MissingInputError(GptforgeError, FileNotFoundError):
    """A file or folder the command needs is not there (the message names it)."""


class DamagedFileError(GptforgeError, ValueError):
    """A file exists but its content is broken (truncated, wrong format, checksum mismatch)."""


class TrainingError(GptforgeError, RuntimeError):
    """Training stopped for a reason the run can explain (e.g. consecutive non-finite losses)."""

"""The project's exceptions: failures gptforge expects and explains in one line.

`gptforge <command>` prints a `GptforgeError` (and an operating-system error such as a missing
file, a full disk or a read-only folder) as one `gptforge <command>: error: ...` line and exits
with USAGE_EXIT for a bad command line (`OptionError`), FAILURE_EXIT otherwise; anything
else keeps its traceback, and `gptforge --debug <command>` shows tracebacks for all.
Each class also derives from the built-in exception it refines, so `except ValueError` callers
keep working.
"""

from __future__ import annotations

USAGE_EXIT = 2
"""Exit status of a bad command line: an unknown option, a value of the wrong type or outside its
range (`gptforge.ranges.bounded`), options that contradict each other (`OptionError`). The same
status as the option parser's own refusals (argparse's usage errors)."""
FAILURE_EXIT = 1
"""Exit status of every other known failure: bad input data, a missing or damaged file, a run
that stopped for a reason it explains."""


class GptforgeError(Exception):
    """A known failure: the message says what was wrong, where, and what to do."""


class InputError(GptforgeError, ValueError):
    """Bad input: an option, a config key, a data file or a task file that cannot be used."""


class OptionError(InputError):
    """A bad option value, or options that contradict each other, found after parsing: the
    command line is wrong. `gptforge` exits with USAGE_EXIT, as for an option the parser refuses."""


class MissingInputError(GptforgeError, FileNotFoundError):
    """A file or folder the command needs is not there (the message names it)."""


class DamagedFileError(GptforgeError, ValueError):
    """A file exists but its content is broken (truncated, wrong format, checksum mismatch)."""


class TrainingError(GptforgeError, RuntimeError):
    """Training stopped for a reason the run can explain (e.g. consecutive non-finite losses)."""


class MissingExtraError(GptforgeError, ImportError):
    """An optional package a command needs is not installed; the message names the pip extra."""


def require_extra(what: str, extra: str, packages: dict[str, str]) -> None:
    """Import each module of `packages` ({module: pip package}) or fail in one line.

    what: who needs them, e.g. "gptforge serve". Only a module that is itself missing counts (a
    broken installation of one keeps its own error).

    Raises:
        MissingExtraError: "<what> needs <package>: pip install 'gptforge[<extra>]'" for the first
            missing module.
    """
    import importlib

    for module, package in packages.items():
        try:
            importlib.import_module(module)
        except ModuleNotFoundError as e:
            if e.name is not None and module != e.name and not module.startswith(e.name + "."):
                raise
            raise MissingExtraError(f"{what} needs {package}: pip install 'gptforge[{extra}]'") from None

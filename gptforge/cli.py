"""`gptforge <command>`: one entry point; each command parses its config and calls into a stage.

Each command is a module `gptforge/commands/<name>.py` with `main(argv) -> int`, imported only
when run, and one description: its DESCRIPTION (`gptforge <name> --help`) begins with its
one-line SUMMARY, which `gptforge --help` reads from the source without importing the module, so
the list stays fast and cannot disagree with the command's own text. Its options are a typed dataclass parsed by
`gptforge.options` (hyphenated `--option-name`; config sections as `--section.field`).

Every command runs inside one error wrapper: a `gptforge.errors.GptforgeError`, a ValueError
raised by gptforge's own code (a message written for the user), or an operating-system error
(missing file, full disk, read-only folder, ...) prints one `gptforge <command>: error: ...` line
and exits 1 (`errors.FAILURE_EXIT`); a bad command line exits 2 (`errors.USAGE_EXIT`): an option
the parser refuses (the parser exits itself), or an `errors.OptionError` raised after parsing
(options that contradict each other, a value that cannot fit the model). Anything else keeps its
traceback.
`gptforge --debug <command> ...` (or GPTFORGE_DEBUG=1) shows the traceback for every error.
"""

from __future__ import annotations

import sys

COMMANDS = ("quickstart", "plan", "prepare", "pretrain", "evaluate", "vocab", "generate", "distill", "finetune",
            "rl", "convert", "launch", "slurm", "report", "serve", "export", "quantize", "prune", "sweep",
            "export-checkpoint")
"""The commands in the order `gptforge --help` lists them; `gptforge/commands/<name>.py` (hyphens
as underscores) implements each."""


def command_summary(name: str) -> str:
    """The one-line SUMMARY of command `name`, read from its module's source without importing it
    (a command module imports its stage, and many stages import torch: `gptforge --help` would take
    seconds). The module's DESCRIPTION, its `--help` text, begins with the same SUMMARY.

    Raises:
        ValueError: the module defines no SUMMARY as a string literal (or parenthesised literals).
    """
    import ast
    from pathlib import Path

    path = Path(__file__).parent / "commands" / f"{name.replace('-', '_')}.py"
    for node in ast.parse(path.read_text(encoding="utf-8")).body:
        if (isinstance(node, ast.Assign) and any(isinstance(t, ast.Name) and t.id == "SUMMARY" for t in node.targets)
                and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)):
            return node.value.value
    raise ValueError(f"{path}: no SUMMARY = \"...\" (the command's one-line summary for `gptforge --help`)")


def _usage() -> str:
    width = max(map(len, COMMANDS))
    lines = ["usage: gptforge [--debug] <command> [options]   (gptforge <command> --help for its options)", "",
             "  --debug   show the traceback of every error", "", "commands:"]
    lines += [f"  {name:<{width}}  {command_summary(name)}" for name in COMMANDS]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    """Dispatch `gptforge [--debug] <command> ...`. Returns the process exit code."""
    import os

    argv = list(sys.argv[1:] if argv is None else argv)
    debug = os.environ.get("GPTFORGE_DEBUG", "") not in ("", "0")
    while argv and argv[0] == "--debug":
        debug, argv = True, argv[1:]
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(_usage())
        return 0
    if argv[0] in ("-V", "--version"):
        from gptforge import __version__

        print(f"gptforge {__version__}")
        return 0
    name, rest = argv[0], argv[1:]
    if name not in COMMANDS:
        import difflib

        close = difflib.get_close_matches(name, COMMANDS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        print(f"gptforge: unknown command {name!r}{hint}\n\n{_usage()}", file=sys.stderr)
        from gptforge.errors import USAGE_EXIT

        return USAGE_EXIT
    import importlib

    # Before torch (and its OpenMP runtime) loads: idle OpenMP threads sleep instead of spinning.
    # On a CPU shared with other work, spinning threads take the time slices the busy ones need:
    # a 4-layer d_model 128 training step ran 4-5x faster with PASSIVE on the loaded 2-core VM
    # (bench/RESULTS.md). An explicit OMP_WAIT_POLICY is kept.
    os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")
    module = importlib.import_module(f"gptforge.commands.{name.replace('-', '_')}")
    return run_command(name, module.main, rest, debug)


def run_command(name: str, fn, argv: list[str], debug: bool = False) -> int:
    """Run a command's `fn(argv)` inside the error wrapper (see the module docstring)."""
    import os
    import warnings

    from gptforge.errors import FAILURE_EXIT, USAGE_EXIT, GptforgeError, OptionError

    shown = warnings.showwarning

    def plain(message, category, filename, lineno, file=None, line=None):
        # gptforge's own UserWarnings (rows skipped, pairs dropped) read as one of its lines, not Python's.
        if issubclass(category, UserWarning) and f"{os.sep}gptforge{os.sep}" in str(filename):
            print(f"gptforge {name}: warning: {message}", file=sys.stderr)
        else:
            shown(message, category, filename, lineno, file, line)

    try:
        with warnings.catch_warnings():
            warnings.showwarning = plain
            return fn(argv) or 0
    except KeyboardInterrupt:
        print("interrupted", file=sys.stderr)
        return 130
    except (GptforgeError, OSError, ValueError) as e:
        if debug or (isinstance(e, ValueError) and not isinstance(e, GptforgeError) and not raised_by_gptforge(e)):
            raise
        print(f"gptforge {name}: error: {describe_error(e)}", file=sys.stderr)
        return USAGE_EXIT if isinstance(e, OptionError) else FAILURE_EXIT


def check_command(cmd: list[str], launcher: str) -> None:
    """Check the gptforge command that `launcher` (launch, slurm) wraps, without running it: the
    command name, and its options with the command's own parser (unknown options get their
    "did you mean"); a model section is resolved too (an unknown --model preset).

    Raises:
        OptionError: an unknown command or a bad model; SystemExit(2) after the command's own
            one-line `error:` for an option its parser refuses.
    """
    import difflib
    import importlib

    from gptforge.errors import OptionError

    if not cmd:
        return
    name = cmd[0]
    if name not in COMMANDS or name in ("launch", "slurm"):
        close = difflib.get_close_matches(name, COMMANDS, n=1)
        hint = f" (did you mean {close[0]!r}?)" if close else ""
        raise OptionError(f"{name!r} is not a gptforge command to run{hint}; see `gptforge --help`")
    module = importlib.import_module(f"gptforge.commands.{name.replace('-', '_')}")
    build = getattr(module, "build_parser", None)
    if build is None:
        return
    from gptforge.options import parse_command

    argv = list(cmd[1:])
    for i in range(len(argv) - 1):  # `--resume auto` is rewritten by the command itself before parsing
        if argv[i] == "--resume" and argv[i + 1] == "auto":
            del argv[i + 1]
            break
    _opts, init = parse_command(build(), argv)
    model = getattr(init, "model", None)
    if model is not None and hasattr(model, "resolved"):
        try:
            model.resolved()
        except ValueError as e:
            raise OptionError(f"{launcher} {name}: {e}") from None


def raised_by_gptforge(e: BaseException) -> bool:
    """Whether the innermost frame of `e`'s traceback is gptforge's own code (not a library's)."""
    tb = e.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    return tb is not None and str(tb.tb_frame.f_globals.get("__name__", "")).startswith("gptforge.")


def describe_error(e: BaseException) -> str:
    """One line for a known failure; an OSError names its path and what to do."""
    if isinstance(e, OSError) and e.filename is not None and str(e.filename) not in str(e.args[-1] if e.args else ""):
        import errno

        advice = {errno.ENOSPC: "free disk space or choose another --out",
                  errno.EACCES: "choose a folder you can write, or fix its permissions",
                  errno.EROFS: "the file system is read-only: choose another --out",
                  errno.ENOENT: "check the path",
                  errno.EEXIST: "a file is there where a folder is wanted: choose another path",
                  errno.ENOTDIR: "a file is there where a folder is wanted: check the path"}.get(e.errno, "")
        return f"{e.filename}: {e.strerror or e}" + (f" ({advice})" if advice else "")
    return str(e)


if __name__ == "__main__":
    sys.exit(main())

"""One CLI vocabulary (issue 36 item 3): one spelling per option, the other a documented alias."""

from __future__ import annotations

from gptforge.commands.prepare import build_parser
from gptforge.options import parse_command


def test_an_alias_sets_the_one_option_and_help_names_it():
    parser = build_parser()
    for spelling in ("--quiet", "--no-progress"):
        opts, _ = parse_command(parser, ["x.txt", "--out", "o", spelling])
        assert opts.quiet is True
    assert parse_command(parser, ["x.txt", "--out", "o"])[0].quiet is False
    assert not hasattr(opts, "no_progress")  # one field, two spellings
    text = " ".join(parser.format_help().split())
    assert "--quiet, --no-progress" in text and "(--no-progress: an alias of --quiet)" in text


def test_help_lists_each_commands_own_summary_without_importing_torch():
    import subprocess
    import sys
    import time

    code = ("import sys; from gptforge.cli import main; main(['--help']); "
            "print('HEAVY', sorted(m for m in sys.modules if m.split('.')[0] in "
            "('torch', 'numpy', 'jsonargparse', 'rich', 'gptforge.commands') or m.startswith('gptforge.commands.')))")
    t0 = time.perf_counter()
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    seconds = time.perf_counter() - t0
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip().splitlines()[-1] == "HEAVY []"  # torch alone takes seconds to import
    assert seconds < 5.0, f"gptforge --help took {seconds:.1f}s"  # about 0.1 s on an idle 2-core VM


def test_one_description_per_command():
    import importlib

    from gptforge.cli import COMMANDS, _usage, command_summary

    text = _usage()
    for name in COMMANDS:
        module = importlib.import_module(f"gptforge.commands.{name.replace('-', '_')}")
        assert command_summary(name) == module.SUMMARY and "\n" not in module.SUMMARY
        assert module.DESCRIPTION.startswith(module.SUMMARY), name
        assert f"  {module.SUMMARY}" in text
        build = getattr(module, "build_parser", None) or getattr(module, "_parser", None)
        if build is not None:  # the --help text is that DESCRIPTION
            assert " ".join(module.SUMMARY.split()) in " ".join(build().format_help().split()), name

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

"""`gptforge report` prints its steps as log lines when stderr is not a terminal, none with --quiet."""

from __future__ import annotations

import re

from gptforge.cli import main


def test_report_progress_lines_and_quiet(real_run, tmp_path, capsys):
    assert main(["report", str(real_run), "--out", str(tmp_path / "r.html")]) == 0
    err = capsys.readouterr().err
    assert "gptforge: report: 0/2 steps (0%)" in err and "reading nano" in err
    assert re.search(r"gptforge: report: 2/2 steps \(100%\).*done", err)
    assert main(["report", str(real_run), "--out", str(tmp_path / "q.html"), "--quiet"]) == 0
    assert "gptforge:" not in capsys.readouterr().err and (tmp_path / "q.html").is_file()

"""`gptforge prepare` prints each phase's progress as log lines when stderr is not a terminal."""

from __future__ import annotations

import re

from gptforge.commands.prepare import main as prepare_main
from tests.conftest import stdlib_sample_files


def test_prepare_phases_are_log_lines_and_quiet_silences_them(tmp_path, capsys):
    inputs = [str(p) for p in stdlib_sample_files(8)]
    common = ["--vocab-size", "300", "--workers", "1", "--val-fraction", "0.2"]
    assert prepare_main([*inputs, "--out", str(tmp_path / "a"), *common]) == 0
    err = capsys.readouterr().err
    phases = [m[0] for m in re.findall(r"^gptforge: ([a-z ]+): (\d+)/\2 shards \(100%\).*done$", err, flags=re.M)]
    assert phases[-1] == "tokenize" and "curate" in phases, err
    assert all(re.search(rf"^gptforge: {p}: 0/\d+ shards \(0%\).*started$", err, flags=re.M) for p in phases)
    lines = err.splitlines()  # each phase ends before the next one starts
    assert lines.index(next(ln for ln in lines if ln.startswith("gptforge: curate:") and ln.endswith("done"))) < \
        lines.index(next(ln for ln in lines if ln.startswith("gptforge: tokenize:")))
    assert prepare_main([*inputs, "--out", str(tmp_path / "b"), *common, "--quiet"]) == 0
    assert "gptforge:" not in capsys.readouterr().err

"""gptforge.progress: log lines when stderr is not a terminal, nothing when quiet, a rich bar on a terminal."""

from __future__ import annotations

import io
import re

import pytest

from gptforge import progress as P


class _Terminal(io.StringIO):
    def isatty(self) -> bool:
        return True


@pytest.fixture(autouse=True)
def _auto_mode(monkeypatch):
    monkeypatch.delenv("GPTFORGE_PROGRESS", raising=False)
    P.set_mode("auto")
    yield
    P.set_mode("auto")


def test_log_mode_writes_a_line_per_tenth_with_counts_rate_and_eta():
    out = io.StringIO()  # not a terminal: "auto" is log mode
    with P.progress("scoring demo", total=200, unit="examples", stream=out, every_s=1e9) as bar:
        for _ in range(200):
            bar.advance()
    lines = out.getvalue().splitlines()
    assert lines[0].startswith("gptforge: scoring demo: 0/200 examples (0%)") and "started" in lines[0]
    middle = lines[1:-1]
    assert [re.search(r": (\d+)/200 examples", ln).group(1) for ln in middle] == [str(20 * k) for k in range(1, 10)]
    assert all("ETA " in ln and "examples/s" in ln and "elapsed " in ln for ln in middle)
    assert re.search(r"\(50%\)", middle[4])
    assert lines[-1].startswith("gptforge: scoring demo: 200/200 examples (100%)") and lines[-1].endswith("done")
    assert "ETA" not in lines[-1]


def test_log_mode_writes_on_time_too_and_without_a_total(monkeypatch):
    clock = [1000.0]
    monkeypatch.setattr(P.time, "monotonic", lambda: clock[0])
    out = io.StringIO()
    with P.progress("reading", total=None, unit="bytes", stream=out, every_s=5) as bar:
        for _ in range(12):  # 1 s per call: a line every 5 s
            clock[0] += 1.0
            bar.advance(1000)
    lines = out.getvalue().splitlines()
    assert [re.match(r"gptforge: reading: ([\d,]+ bytes)", ln).group(1) for ln in lines] == [
        "0 bytes", "5,000 bytes", "10,000 bytes", "12,000 bytes"]
    assert "1,000 bytes/s" in lines[1] and "elapsed 0:00:05" in lines[1] and "ETA" not in lines[1]


def test_eta_is_remaining_over_rate(monkeypatch):
    clock = [0.0]
    monkeypatch.setattr(P.time, "monotonic", lambda: clock[0])
    out = io.StringIO()
    with P.progress("x", total=100, unit="it", stream=out, every_s=1e9) as bar:
        clock[0] = 30.0
        bar.advance(10)  # 10 in 30 s: 90 left at 1/3 per second = 270 s
    assert "10/100 it (10%), 0.333 it/s, elapsed 0:00:30, ETA 0:04:30" in out.getvalue().splitlines()[1]


def test_quiet_writes_nothing_and_disabled_writes_nothing():
    out = io.StringIO()
    P.set_quiet(True)
    with P.progress("quiet step", total=10, stream=out) as bar:
        for _ in range(10):
            bar.advance()
    assert out.getvalue() == ""
    P.set_quiet(False)
    with P.progress("disabled step", total=10, stream=out, enabled=False) as bar:
        bar.advance(10)
    assert out.getvalue() == ""
    with P.progress("shown step", total=10, stream=out) as bar:
        bar.advance(10)
    assert "shown step" in out.getvalue()


def test_environment_variable_wins(monkeypatch):
    out = io.StringIO()
    monkeypatch.setenv("GPTFORGE_PROGRESS", "off")
    assert list(P.track(range(5), "tracked", stream=out)) == list(range(5))
    assert out.getvalue() == ""
    monkeypatch.setenv("GPTFORGE_PROGRESS", "loud")
    with pytest.raises(ValueError, match="GPTFORGE_PROGRESS='loud'"):
        P.resolved_mode()


def test_terminal_gets_a_rich_bar_and_nested_steps_share_it():
    term = _Terminal()
    assert P.resolved_mode(term) == "bar"
    with P.progress("outer", total=2, unit="steps", stream=term, transient=False) as outer:
        with P.progress("inner", total=4, unit="windows", stream=term) as inner:  # no LiveError
            inner.advance(4)
        outer.advance(2)
    text = term.getvalue()
    assert "outer" in text and "2/2" in text and "gptforge:" not in text  # a bar, not log lines


def test_phases_take_the_rich_task_interface():
    out = io.StringIO()
    with P.Phases(stream=out, every_s=1e9) as ph:
        a = ph.add_task("count lines", total=4, completed=1, info="1 reused")
        b = ph.add_task("curate", total=2)
        for _ in range(3):
            ph.advance(a)
        ph.advance(b, 2)
    text = out.getvalue()
    assert "gptforge: count lines: 4/4 (100%)" in text and "1 reused" in text
    assert "gptforge: curate: 2/2 (100%)" in text and text.count("done") == 2


def test_a_step_that_fails_writes_no_final_line():
    out = io.StringIO()
    with pytest.raises(RuntimeError):
        with P.progress("failing", total=10, stream=out) as bar:
            bar.advance(3)
            raise RuntimeError("boom")
    lines = out.getvalue().splitlines()
    assert len(lines) == 2 and lines[-1].startswith("gptforge: failing: 3/10 it (30%)")  # no final "done" line
    assert not any(ln.endswith("done") for ln in lines)


@pytest.mark.parametrize("env, quiet, lines", [("", False, 2), ("log", False, 2), ("off", False, 0), ("", True, 0)])
def test_training_progress_line_follows_the_mode_on_stderr(monkeypatch, capsys, env, quiet, lines):
    from gptforge.train.loggers import Progress

    monkeypatch.setenv("GPTFORGE_PROGRESS", env)  # "": unset (auto; capsys' stderr is no terminal: log lines)
    P.set_quiet(quiet)
    bar = Progress(total_steps=3, start_step=0)
    for step in (1, 2, 3):  # a line for the first step, none for the second (within 5 s), one for the last
        bar.update(step, f"loss {4 - step:.4f}")
    bar.log("step 2: a message")
    bar.close()
    out, err = capsys.readouterr()
    assert [ln.split(" |")[0] for ln in err.splitlines()] == ["step 1/3 loss 3.0000", "step 3/3 loss 1.0000"][:lines]
    assert out == "step 2: a message\n"  # messages are the run's output, whatever the progress mode


def test_training_progress_bar_on_a_terminal_and_quiet_training_prints_nothing(monkeypatch, capsys):
    from gptforge.train.loggers import Progress

    monkeypatch.setenv("GPTFORGE_PROGRESS", "bar")
    bar = Progress(total_steps=3, start_step=0)
    assert bar.bar is not None and bar.bar.console.stderr
    bar.close()
    assert "0/3" in capsys.readouterr().err
    silent = Progress(total_steps=3, start_step=0, enabled=False)  # train(progress=False): --quiet
    silent.update(3, "loss 1")
    silent.log("a message")
    assert silent.bar is None and capsys.readouterr() == ("", "")

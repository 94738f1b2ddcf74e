"""The report as a person sees it: headless chromium draws every chart, offline, without errors.

One browser serves the module's pages (a start costs a second or more on a loaded machine)."""

import json
import re

import pytest

from gptforge.report import write_report, write_run_report
from gptforge.train.loggers import read_metrics
from tests.report.browser import Page, chromium_paths, start_chromium
from tests.report.conftest import write_rows

# Every chart has drawn: a plot SVG, at least one trace, and a trace path with points.
_DRAWN = """return Array.from(document.querySelectorAll('.plotly-graph-div')).map(g => [g.id,
  g.querySelectorAll('.main-svg').length, g.querySelectorAll('.scatterlayer .trace').length,
  Array.from(g.querySelectorAll('.scatterlayer path.js-line, .scatterlayer path.point'))
    .filter(p => (p.getAttribute('d') || '').length > 10).length])"""


@pytest.fixture(scope="module")
def chromium():
    """One headless chromium for the module's pages, quit after them (skips without chromium)."""
    driver = start_chromium()
    yield driver
    driver.quit()


def _check(page_path, shot, driver):
    page = Page(page_path, driver)
    try:
        page.screenshot(shot)
        assert shot.stat().st_size > 50_000  # a PNG with content, not a blank page
        assert page.console_errors() == []
        urls = page.requested_urls()
        assert urls == [page_path.resolve().as_uri()], urls  # the page itself, nothing else
        drawn = page.js(_DRAWN)
        assert len(drawn) >= 7
        for gid, svgs, traces, paths in drawn:
            assert svgs > 0 and traces > 0 and paths > 0, (gid, svgs, traces, paths)
        shown = {el: page.js(f"return Array.from(document.querySelectorAll('[data-key={el}]')).map(e => e.textContent)")
                 for el in ("final_train_loss", "tokens_seen", "steps", "best_val_loss")}
        return shown
    finally:
        page.close()


def test_report_in_a_headless_browser(chromium, real_run, tmp_path):
    shown = _check(write_run_report(real_run), tmp_path / "one.png", chromium)
    rows = read_metrics(real_run)
    vals = [r["val_loss"] for r in rows if "val_loss" in r]
    assert shown["final_train_loss"] == [f"{rows[-1]['loss']:,.4f}"]
    assert shown["tokens_seen"] == [f"{rows[-1]['tokens_seen']:,}"]
    assert shown["steps"] == [f"{rows[-1]['step']:,} of 12"]
    best_step = next(r["step"] for r in rows if r.get("val_loss") == min(vals))
    assert shown["best_val_loss"] == [f"{min(vals):,.4f} (step {best_step:,})"]


def test_overlaid_report_in_a_headless_browser(chromium, real_run, tmp_path):
    cfg = (real_run / "config.yaml").read_text().replace("lr: 0.003", "lr: 0.001")
    rows = [{"step": s, "loss": 6.5 - 0.05 * s + (2.0 if s == 30 else 0.0), "lr": 1e-3, "grad_norm": 0.5,
             "tokens_per_second": 900.0 + s, "step_seconds": 0.1, "eval_score": 0.2 + 0.001 * s,
             **({"events": [{"kind": "spike", "metric": "loss", "value": 7.0, "advice": "lower train.lr"}]}
                if s == 30 else {}),
             **({"val_loss": 6.0 - 0.01 * s} if s % 10 == 0 else {})} for s in range(1, 61)]
    other = write_rows(tmp_path / "other", rows, cfg)
    out = write_report([real_run, other], tmp_path / "ab.html")
    shown = _check(out, tmp_path / "ab.png", chromium)
    assert shown["final_train_loss"][1] == f"{rows[-1]['loss']:,.4f}"
    assert shown["tokens_seen"][1] == "—"  # the hand-made run logged no tokens_seen
    summary = json.loads(re.search(r"id=summary-json>(.*?)</script>", out.read_text(), re.S).group(1))
    assert [s["steps"] for s in summary] == [12, 60]


def test_prepare_report_in_a_headless_browser(chromium, tiny_shards, tmp_path):
    path = tiny_shards / "report.html"
    page = Page(path, chromium)
    try:
        page.screenshot(tmp_path / "prepare.png")
        assert page.console_errors() == []
        assert page.requested_urls() == [path.resolve().as_uri()]
        bars = page.js("return Array.from(document.querySelectorAll('.plotly-graph-div')).map(g => "
                       "g.querySelectorAll('.barlayer .point path').length)")
        assert len(bars) >= 2 and all(n > 0 for n in bars), bars
    finally:
        page.close()


def test_browser_tests_skip_cleanly_without_chromium(monkeypatch):
    import shutil

    import pytest

    monkeypatch.setattr(shutil, "which", lambda name: None)
    with pytest.raises(pytest.skip.Exception, match="apt-get install -y chromium chromium-driver"):
        chromium_paths()

"""How long the run report of a long run takes to build, and to render in a browser.

Writes a synthetic 20,000-step run (metrics.jsonl rows shaped like the trainer's, an eval every
500 steps, a few skipped steps and spikes, two resumes), then times:
  build   `gptforge.report.write_run_report` (read metrics.jsonl, downsample, plotly figures, page);
  render  headless chromium (Debian's, through selenium) opening the file until every chart has
          drawn its SVG (the page's own load, plotly.js parse and all Plotly.newPlot calls).
Target: render under 3 s. Prints the CPU model. Run: python bench/report_speed.py [--steps 20000]
"""

from __future__ import annotations

import argparse
import json
import math
import platform
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
from machine import cpu_description  # bench/machine.py

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))




def synthetic_run(run: Path, steps: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    run.mkdir(parents=True)
    (run / "config.yaml").write_text(
        "model: {preset: gpt2-small, arch: gpt2, n_layer: 12, n_head: 12, d_model: 768, block_size: 1024, "
        "vocab_size: 50257}\ntrain: {max_steps: %d, grad_clip: 1.0, warmup_steps: 2000, precision: bf16}\n"
        "layout: {world_size: 8, dp: 8, tp: 1, pp: 1, zero_stage: 2}\n"
        "versions: {gptforge: 0.1.0, torch: 2.13.0}\n" % steps)
    elapsed, rows = 0.0, []
    for s in range(1, steps + 1):
        loss = 3.0 + 8.0 * math.exp(-s / 1500) + rng.normal(0, 0.05)
        dt = 0.5 + abs(rng.normal(0, 0.02))
        elapsed += dt
        row = {"step": s, "loss": loss, "lr": 6e-4 * min(1.0, s / 2000), "grad_norm": 0.3 + abs(rng.normal(0, 0.05)),
               "tokens_per_second": 524288 / dt, "mfu": 0.42 * 0.5 / dt, "peak_memory_bytes": 61 * 2**30,
               "predicted_memory_bytes": 58 * 2**30, "tokens_seen": 524288 * s, "step_seconds": dt,
               "elapsed_seconds": elapsed, "skipped": s in (7000, 7001)}
        if s % 500 == 0:
            row["val_loss"] = loss + 0.05
        if s in (4000, 12000):
            row["loss"] += 2.0
            row["events"] = [{"kind": "spike", "metric": "loss", "value": row["loss"], "advice": "lower train.lr"}]
        rows.append(json.dumps(row))
    (run / "metrics.jsonl").write_text("\n".join(rows) + "\n")


def render_seconds(page: Path) -> float | None:
    try:
        from selenium import webdriver
        from selenium.webdriver.chrome.service import Service
        from selenium.webdriver.support.ui import WebDriverWait
    except ImportError:
        return None
    import shutil

    browser, driver = shutil.which("chromium"), shutil.which("chromedriver")
    if not browser or not driver:
        return None
    opts = webdriver.ChromeOptions()
    opts.binary_location = browser
    for a in ("--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage", "--window-size=1300,2400"):
        opts.add_argument(a)
    d = webdriver.Chrome(service=Service(executable_path=driver), options=opts)
    try:
        d.get("about:blank")  # browser start-up is not part of rendering
        t0 = time.perf_counter()
        d.get(page.resolve().as_uri())
        WebDriverWait(d, 60).until(lambda drv: drv.execute_script(
            "return document.readyState === 'complete' && Array.from(document.querySelectorAll("
            "'.plotly-graph-div')).every(g => g.querySelector('.scatterlayer .trace'))"))
        return time.perf_counter() - t0
    finally:
        d.quit()


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=20_000)
    ap.add_argument("--repeat", type=int, default=3)
    args = ap.parse_args()
    from gptforge.report import write_run_report

    print(f"CPU: {cpu_description()}; Python {platform.python_version()}")
    with tempfile.TemporaryDirectory() as tmp:
        run, short = Path(tmp) / "long_run", Path(tmp) / "short_run"
        synthetic_run(run, args.steps)
        synthetic_run(short, 20)
        short_page = write_run_report(short)
        builds, renders, short_renders = [], [], []
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            out = write_run_report(run)
            builds.append(time.perf_counter() - t0)
            r = render_seconds(out)
            if r is not None:
                renders.append(r)
                short_renders.append(render_seconds(short_page))
        size = out.stat().st_size / 1e6
        print(f"{args.steps:,} steps, metrics.jsonl {(run / 'metrics.jsonl').stat().st_size / 1e6:.1f} MB; "
              f"report {size:.1f} MB")
        print(f"build  (write_run_report): best {min(builds):.2f} s, median {sorted(builds)[len(builds) // 2]:.2f} s")
        if renders:
            print(f"render (headless chromium, load until every chart drew): best {min(renders):.2f} s, "
                  f"median {sorted(renders)[len(renders) // 2]:.2f} s (target < 3 s)")
            print(f"render of a 20-step report (plotly.js parse + page, the fixed cost), same session: best "
                  f"{min(short_renders):.2f} s; long / short {min(renders) / min(short_renders):.2f}x")
        else:
            print("render: chromium / chromium-driver / selenium not installed; not measured")


if __name__ == "__main__":
    main()

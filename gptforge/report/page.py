"""The run report page: one self-contained HTML file (plotly.js inlined once, no network).

`write_report([run, ...], out)` builds it for one or several runs (overlaid, with a config diff
table); `write_run_report(run_dir)` writes `RUN/report.html` for one run, as the trainer does at
the end of every run. Sections: summary card, curves, memory, evaluation, data, environment, and
a list of what was missing or damaged in the inputs.

Summary numbers carry `data-key` attributes (`final_train_loss`, `best_val_loss`, ...) so a test
(or a script) can read them back from the page.
"""

from __future__ import annotations

import html
import json
import math
import os
import platform
import time
from pathlib import Path
from typing import Any

from gptforge.atomic import atomic_write_text
from gptforge.errors import InputError
from gptforge.progress import progress as show_progress
from gptforge.report.run_data import RunData, has_run_files, load_run, require_run_dir

_CSS = """body{font-family:system-ui,sans-serif;margin:1.5em auto;max-width:1200px;color:#222;padding:0 1em}
h1{margin-bottom:.2em}h2{margin-top:1.6em;border-bottom:1px solid #ddd}.sub{color:#666}
table{border-collapse:collapse;margin:.5em 0 1.2em;font-size:14px}td,th{border:1px solid #ccc;padding:3px 8px;
text-align:right;vertical-align:top}th{background:#f3f3f3}td.l,th.l{text-align:left}
.cards{display:flex;flex-wrap:wrap;gap:1em}.card{border:1px solid #ccd;border-radius:6px;padding:.6em 1em;
flex:1 1 520px;background:#fafbff}.card h3{margin:.2em 0 .5em}.card table{width:100%}
.grid{display:grid;grid-template-columns:repeat(auto-fill,minmax(560px,1fr));gap:.8em}
.chart{border:1px solid #eee;min-height:330px}.warn{color:#a40;background:#fff6e8;padding:.5em 1em;border-radius:4px}
.empty{color:#888;font-style:italic;padding:1em}code{background:#f4f4f4;padding:0 3px}"""


def _e(x: Any) -> str:
    return html.escape(str(x))


def _finite(v: Any) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool) and math.isfinite(v)


def fmt_duration(seconds: float) -> str:
    """`1h 02m 03s` / `2m 03s` / `4.2 s`."""
    if seconds < 60:
        return f"{seconds:.1f} s"
    s = int(round(seconds))
    h, rem = divmod(s, 3600)
    m, sec = divmod(rem, 60)
    return f"{h}h {m:02d}m {sec:02d}s" if h else f"{m}m {sec:02d}s"


def summarize(run: RunData, stopped: str | None = None) -> dict[str, Any]:
    """The numbers of the summary card, computed from the run's rows, config and data.

    Returns a dict with (None where unknown): steps, max_steps, tokens_seen, wall_seconds,
    final_train_loss (last finite loss), final_val_loss, best_val_loss, best_val_step,
    val_perplexity (exp of the final val loss), val_bits_per_byte (final val loss x val tokens /
    (ln 2 x val bytes) from the data's meta.json, the same ratio `gptforge evaluate` uses over a
    whole split), skipped_steps, parameters, stopped (a sentence).
    """
    rows = run.rows
    tc = run.config.get("train") or {}
    s: dict[str, Any] = {k: None for k in ("steps", "max_steps", "tokens_seen", "wall_seconds", "final_train_loss",
                                           "final_val_loss", "best_val_loss", "best_val_step", "val_perplexity",
                                           "val_bits_per_byte", "skipped_steps", "parameters", "stopped")}
    s["max_steps"] = tc.get("max_steps")
    if rows:
        last = rows[-1]
        s["steps"] = int(last["step"])
        s["tokens_seen"] = last.get("tokens_seen")
        s["wall_seconds"] = last.get("elapsed_seconds")
        s["skipped_steps"] = sum(1 for r in rows if r.get("skipped"))
        _, losses = run.series("loss")
        s["final_train_loss"] = losses[-1] if losses else None
        vx, vy = run.series("val_loss")
        if vy:
            s["final_val_loss"] = vy[-1]
            j = min(range(len(vy)), key=vy.__getitem__)
            s["best_val_loss"], s["best_val_step"] = vy[j], vx[j]
            s["val_perplexity"] = math.exp(min(vy[-1], 700.0))
            val = ((run.data_meta or {}).get("splits") or {}).get("val") or {}
            if val.get("bytes") and val.get("tokens"):
                s["val_bits_per_byte"] = vy[-1] * val["tokens"] / (math.log(2) * val["bytes"])
    model = run.config.get("model")
    if isinstance(model, dict) and model.get("n_layer"):
        from gptforge.config import ModelConfig
        from gptforge.plan.params import param_count

        try:
            known = {k: v for k, v in model.items() if k in ModelConfig.__dataclass_fields__}
            s["parameters"] = param_count(ModelConfig(**known).resolved())
        except (TypeError, ValueError):
            s["parameters"] = None
    s["stopped"] = stopped or _why_stopped(run, s)
    return s


def _why_stopped(run: RunData, s: dict[str, Any]) -> str:
    tc = run.config.get("train") or {}
    if not run.rows:
        return "no step was logged"
    step, max_steps = s["steps"], s["max_steps"]
    stops = [e for e in run.events if e.get("kind") == "stop"]
    if stops:
        return str(stops[-1].get("reason", "stopped"))
    if max_steps and step >= max_steps:
        return f"reached train.max_steps ({max_steps})"
    tail = 0
    for r in reversed(run.rows):
        if not (r.get("skipped") or not _finite(r.get("loss"))):
            break
        tail += 1
    if tail and tail >= int(tc.get("max_bad_steps") or 0) > 0:
        return f"stopped after {tail} consecutive non-finite steps (train.max_bad_steps)"
    if tc.get("stop_at_step") and step >= tc["stop_at_step"]:
        return f"stopped at train.stop_at_step ({tc['stop_at_step']})"
    if tc.get("patience") and "val_loss" in run.rows[-1]:
        return (f"stopped at step {step} of {max_steps} after an evaluation: early stopping (train.patience "
                f"{tc['patience']}) is the likely reason")
    return (f"stopped at step {step} of {max_steps}: interrupted (signal or crash), or still running"
            if max_steps else f"last logged step {step}")


def _num(v: Any, fmt: str = "{:,.4f}") -> str:
    if v is None:
        return "—"
    if isinstance(v, bool):
        return str(v)
    if isinstance(v, int):
        return f"{v:,}"
    return fmt.format(v) if _finite(v) else str(v)


def _summary_card(run: RunData, s: dict[str, Any], index: int, color: str) -> str:
    cfg = run.config
    m = cfg.get("model") or {}
    lay = cfg.get("layout") or {}
    meta = run.data_meta or {}
    tc = cfg.get("train") or {}
    shape = ", ".join(f"{k} {m[k]}" for k in ("arch", "n_layer", "n_head", "d_model", "block_size", "vocab_size")
                      if m.get(k) is not None)
    splits = meta.get("splits") or {}
    data = ""
    if splits:
        data = "; ".join(f"{name} {v.get('documents', 0):,} docs / {v.get('tokens', 0):,} tokens"
                         for name, v in splits.items() if v.get("tokens"))
        data += f"; vocab {meta.get('vocab_size', '?'):,}, tokenizer sha256 {str(meta.get('tokenizer_sha256'))[:12]}"
    elif isinstance(cfg.get("data"), dict):
        data = str(cfg["data"].get("path", "—"))
    layout = ", ".join(f"{k} {v}" for k, v in lay.items()) if lay else "—"

    def row(label: str, key: str | None, value: str) -> str:
        attr = f" data-key='{key}' data-run='{index}'" if key else ""
        return f"<tr><th class=l>{_e(label)}</th><td class=l{attr}>{value}</td></tr>"

    best = _num(s["best_val_loss"])
    if s["best_val_step"] is not None:
        best += f" (step {s['best_val_step']:,})"
    return (f"<div class=card style='border-left:6px solid {color}'><h3>{_e(run.label)}</h3>"
            f"<div class=sub>{_e(run.path)}</div><table>"
            + row("model", None, _e(f"{m.get('preset') or 'custom'}: {shape}") if m else "—")
            + row("parameters", "parameters", _num(s["parameters"]))
            + row("data", None, _e(data or "—"))
            + row("layout", None, _e(f"{layout}; precision {tc.get('precision', '?')}"))
            + row("steps", "steps", _num(s["steps"]) + (f" of {s['max_steps']:,}" if s["max_steps"] else ""))
            + row("tokens seen", "tokens_seen", _num(s["tokens_seen"]))
            + row("wall time (training steps)", "wall_seconds",
                  fmt_duration(s["wall_seconds"]) if _finite(s["wall_seconds"]) else "—")
            + row("final train loss", "final_train_loss", _num(s["final_train_loss"]))
            + row("final val loss", "final_val_loss", _num(s["final_val_loss"]))
            + row("best val loss", "best_val_loss", best)
            + row("val perplexity", "val_perplexity", _num(s["val_perplexity"], "{:,.2f}"))
            + row("val bits per byte", "val_bits_per_byte", _num(s["val_bits_per_byte"]))
            + row("skipped (non-finite) steps", "skipped_steps", _num(s["skipped_steps"]))
            + row("loss / gradient alarms", "alarms", _e(_alarms(run)))
            + row("resumed at steps", None, ", ".join(f"{x:,}" for x in run.resumes) or "never")
            + row("rollbacks", "rollbacks", _e(_rollbacks(run)))
            + row("stopped", "stopped", _e(s["stopped"]))
            + "</table></div>")


def _rollbacks(run: RunData) -> str:
    """train.spike_action rollback events: "FROM -> TO (N batches skipped, reason)", or "none"."""
    return "; ".join(f"{e.get('from_step')} -> {e.get('to_step')} ({e.get('skipped_batches')} batches skipped, "
                     f"{e.get('reason')})" for e in run.events if e.get("kind") == "rollback") or "none"


def _alarms(run: RunData) -> str:
    kinds: dict[str, int] = {}
    for e in run.events:
        if e.get("kind") in ("spike", "divergence"):
            name = f"{e.get('metric')} {e.get('kind')}"
            kinds[name] = kinds.get(name, 0) + 1
    return ", ".join(f"{n} {k}" + ("s" if n > 1 else "") for k, n in sorted(kinds.items())) or "none"


def _flatten(d: Any, prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    if isinstance(d, dict):
        for k, v in d.items():
            out.update(_flatten(v, f"{prefix}{k}."))
    else:
        out[prefix[:-1]] = d
    return out


def config_diff(runs: list[RunData]) -> list[tuple[str, list[Any]]]:
    """[(dotted key, [value per run])] for every config key whose value differs between runs
    (a key missing from a run counts as a different value). Provenance keys (data hashes, git
    commit) are compared too: they tell runs on different data or code apart."""
    flats = [_flatten(r.config) for r in runs]
    keys = sorted(set().union(*flats))
    missing = object()
    out = []
    for k in keys:
        vals = [f.get(k, missing) for f in flats]
        if any(v != vals[0] for v in vals[1:]):
            out.append((k, [None if v is missing else v for v in vals]))
    return out


def _config_diff_html(runs: list[RunData]) -> str:
    diff = config_diff(runs)
    head = "".join(f"<th class=l>{_e(r.label)}</th>" for r in runs)
    if not diff:
        return "<p>The runs' config.yaml files are identical.</p>"
    body = "".join("<tr><td class=l><code>" + _e(k) + "</code></td>"
                   + "".join(f"<td class=l>{'<i>absent</i>' if v is None else _e(v)}</td>" for v in vals) + "</tr>"
                   for k, vals in diff)
    return f"<table id=config-diff><tr><th class=l>config key</th>{head}</tr>{body}</table>"


def _memory_html(runs: list[RunData]) -> str:
    rows = []
    for r in runs:
        _, meas = r.series("peak_memory_bytes")
        _, pred = r.series("predicted_memory_bytes")
        m = max(meas) if meas else None
        p = pred[-1] if pred else None
        ratio = f"{m / p:.2f}" if m and p else "—"
        rows.append(f"<tr><td class=l>{_e(r.label)}</td><td>{_gib(p)}</td><td>{_gib(m)}</td><td>{ratio}</td></tr>")
    note = ("" if any(r.series("peak_memory_bytes")[0] for r in runs) else
            "<p class=sub>No measured peak: the device has no allocator statistics (CPU); only the planner's "
            "prediction is shown.</p>")
    return ("<table><tr><th class=l>run</th><th>planner prediction (GiB)</th><th>measured peak (GiB)</th>"
            "<th>measured / predicted</th></tr>" + "".join(rows) + "</table>" + note)


def _gib(v: float | None) -> str:
    return "—" if v is None else f"{v / 2**30:.3f}"


def _eval_html(runs: list[RunData]) -> str:
    parts = []
    for r in runs:
        for rel, doc in r.eval_results:
            flat = [(k, v) for k, v in _flatten(doc).items() if isinstance(v, (int, float, str, bool)) or v is None]
            body = "".join(f"<tr><td class=l><code>{_e(k)}</code></td><td>{_e(_num(v) if not isinstance(v, str) else v)}"
                           "</td></tr>" for k, v in flat[:300])
            more = f"<p class=sub>{len(flat) - 300} more keys in the file.</p>" if len(flat) > 300 else ""
            parts.append(f"<h3>{_e(r.label)}: <code>{_e(rel)}</code></h3><table class=eval>"
                         f"<tr><th class=l>key</th><th>value</th></tr>{body}</table>{more}")
    return "".join(parts) or "<p class=empty>No evaluation results (RUN/eval/**/*.json) in these runs.</p>"


def _samples_html(runs: list[RunData]) -> str:
    """The end-of-run samples (RUN/samples.json: greedy and sampled continuations of prompts taken
    from the run's data, or fixed prompts; "prompt_source" says which)."""
    import json

    parts = []
    for r in runs:
        f = r.path / "samples.json"
        try:
            doc = json.loads(f.read_text()) if f.is_file() else None
        except (OSError, ValueError):
            doc = None
        if not doc:
            continue
        rows = "".join(f"<tr><td class=l><code>{_e(s['prompt'] or '<|endoftext|>')}</code></td><td class=l>"
                       f"{_e(s['mode'])}</td><td class=l><pre>{_e(s['prompt'] + s['text'])}</pre></td></tr>"
                       for s in doc.get("samples", []))
        src = f"<p class=sub>Prompts: {_e(doc['prompt_source'])}.</p>" if doc.get("prompt_source") else ""
        parts.append(f"<h3>{_e(r.label)} at step {_e(doc.get('step'))}</h3>{src}<table class=eval><tr><th class=l>prompt"
                     f"</th><th class=l>mode</th><th class=l>text</th></tr>{rows}</table>")
    return "".join(parts) or "<p class=empty>No samples (RUN/samples.json) in these runs.</p>"


def _data_html(runs: list[RunData], out_dir: Path) -> str:
    parts, seen = [], set()
    for r in runs:
        if r.data_dir is None or r.data_dir in seen:
            continue
        seen.add(r.data_dir)
        meta, rep = r.data_meta or {}, r.data_report
        link = ""
        if (r.data_dir / "report.html").is_file():
            href = os.path.relpath(r.data_dir / "report.html", out_dir.resolve())
            link = f" (<a href='{_e(Path(href).as_posix())}'>prepare report</a>)"
        rows = "".join(f"<tr><td class=l>{_e(n)}</td><td>{v.get('documents', 0):,}</td><td>{v.get('tokens', 0):,}</td>"
                       f"<td>{v.get('bytes', 0):,}</td></tr>" for n, v in (meta.get("splits") or {}).items())
        parts.append(f"<h3><code>{_e(r.data_dir)}</code>{link}</h3><table><tr><th class=l>split</th><th>documents</th>"
                     f"<th>tokens</th><th>UTF-8 bytes</th></tr>{rows}</table>")
        if rep:
            c = rep.get("check") or {}
            drops: dict[str, int] = {}
            for step in rep.get("steps") or []:
                for reason, n in (step.get("dropped") or {}).items():
                    drops[f"{step.get('name')}: {reason}"] = drops.get(f"{step.get('name')}: {reason}", 0) + n
            parts.append(f"<p>recipe <b>{_e(rep.get('recipe'))}</b>; documents read {c.get('documents_read', 0):,}, "
                         f"dropped {c.get('documents_dropped', 0):,}, written {c.get('documents_written', 0):,} "
                         f"({'adds up' if c.get('adds_up') else 'does not add up'}).</p>")
            if drops:
                parts.append("<table><tr><th class=l>drop reason</th><th>documents</th></tr>" + "".join(
                    f"<tr><td class=l>{_e(k)}</td><td>{v:,}</td></tr>"
                    for k, v in sorted(drops.items(), key=lambda kv: -kv[1])) + "</table>")
    return "".join(parts) or "<p class=empty>The prepared data was not found (config.yaml data.path).</p>"


def _env_html(runs: list[RunData]) -> str:
    import plotly

    rows = []
    for r in runs:
        v = r.config.get("versions") or {}
        tc = r.config.get("train") or {}
        d = r.config.get("data") or {}
        items = [("gptforge", v.get("gptforge")), ("torch", v.get("torch")), ("git commit", v.get("git_commit")),
                 ("device (train.device)", tc.get("device")), ("precision", tc.get("precision")),
                 ("data", d.get("path") if isinstance(d, dict) else d), ("command line", r.config.get("command"))]
        rows.append(f"<h3>{_e(r.label)}</h3><table>" + "".join(
            f"<tr><th class=l>{_e(k)}</th><td class=l>{_e(val if val is not None else 'not recorded')}</td></tr>"
            for k, val in items) + "</table>")
    return ("".join(rows) + f"<p class=sub>Report built {time.strftime('%Y-%m-%d %H:%M:%S %Z')} with Python "
            f"{platform.python_version()} and plotly {plotly.__version__} on {_e(platform.platform())}.</p>")


def _mixture_html(runs: list[RunData]) -> str:
    """The mixture table of each run trained on several sources: weight (per stage), tokens seen
    and epochs per source, and the definition of the overall val loss; "" without a mixture."""
    out = []
    for run in runs:
        train = run.config.get("train") or {}
        weights = train.get("data_weights") or {}
        if not weights:
            continue
        stages = train.get("stages") or []
        head = "".join(f"<th>stage {k + 1} (to step {st['until_step']:,})</th>" for k, st in enumerate(stages))
        rows = []
        for name, w in weights.items():
            last: dict[str, Any] = next((r for r in reversed(run.rows) if f"data/{name}/tokens_seen" in r), {})
            seen, epoch = int(last.get(f"data/{name}/tokens_seen") or 0), last.get(f"data/{name}/epoch")
            cells = "".join(f"<td>{st['data_weights'].get(name, 0):.3f}</td>" for st in stages)
            rows.append(f"<tr><td>{_e(name)}</td>{cells}<td>{w:.3f}</td><td>{seen:,}</td>"
                        f"<td>{'' if epoch is None else epoch}</td></tr>")
        out.append(f"<h3>Mixture: {_e(run.label)}</h3><table><tr><th>source</th>{head}"
                   f"<th>weight{' (after the stages)' if stages else ''}</th><th>tokens seen</th>"
                   f"<th>epoch (0-based, last step)</th></tr>" + "".join(rows) + "</table><p class=sub>val_loss of a "
                   "mixture: the token-weighted mean over the sources' val splits.</p>")
    return ("<h2>Data mixture</h2>" + "".join(out)) if out else ""


def render_report(runs: list[RunData], out_dir: Path | None = None, stopped: str | None = None) -> str:
    """The whole page as a string (see the module docstring).

    Args:
        runs: one or more loaded runs (overlaid in every chart).
        out_dir: the folder the page will be written to (links to data reports are relative to it).
        stopped: why a single run stopped (as the trainer knows it); inferred from the rows otherwise.
    """
    from plotly.offline import get_plotlyjs

    from gptforge.report.charts import all_charts, color

    if not runs:
        raise InputError("gptforge report: give at least one run directory")
    out_dir = Path(out_dir or runs[0].path)
    title = "gptforge run report: " + ", ".join(r.label for r in runs)
    summaries = [summarize(r, stopped if len(runs) == 1 else None) for r in runs]
    parts = [f"<!doctype html><html><head><meta charset='utf-8'><title>{_e(title)}</title><style>{_CSS}</style>",
             # plotly.js once, inline: the page opens from disk with no network.
             f"<script type='text/javascript'>{get_plotlyjs()}</script></head><body>",
             f"<h1>{_e(title)}</h1>"]
    problems = []
    for r in runs:
        problems += [f"{r.label}: {m}" for m in r.missing]
        if r.bad_lines:
            problems.append(f"{r.label}: {r.bad_lines} unreadable line(s) in {r.path / 'metrics.jsonl'} skipped"
                            + (" (the last line was cut, as by a killed writer)" if r.last_line_cut else ""))
    if problems:
        parts.append("<div class=warn id=problems><b>Missing or damaged inputs</b><ul>"
                     + "".join(f"<li>{_e(p)}</li>" for p in problems) + "</ul></div>")
    parts.append("<h2>Summary</h2><div class=cards>" + "".join(
        _summary_card(r, s, i, color(i)) for i, (r, s) in enumerate(zip(runs, summaries, strict=True))) + "</div>")
    if len(runs) > 1:
        parts.append("<h2>Config differences</h2>" + _config_diff_html(runs))
    charts = all_charts(runs)
    plot_config = {"displaylogo": False, "responsive": True}

    def chart(cid: str) -> str:
        fig, key = charts[cid]
        if fig is None:
            return f"<div class='chart empty' id='chart-{cid}'>no data: no run logged <code>{_e(key)}</code></div>"
        return ("<div class=chart>" + fig.to_html(full_html=False, include_plotlyjs=False, div_id=f"chart-{cid}",
                                                  config=plot_config, default_height="330px") + "</div>")

    parts.append("<h2>Training curves</h2><p class=sub>Drag to zoom, double-click to reset, click a legend entry to "
                 "hide it. Dashed vertical lines: resumes; long dashes: mixture stage ends; dotted: rollbacks to an earlier checkpoint; red crosses: skipped (non-finite) steps; triangles: "
                 f"loss or gradient spikes. Curves over {2000:,} points keep every bucket's min and max.</p>"
                 "<div class=grid>" + "".join(chart(c) for c in ("loss", "lr", "grad_norm", "tokens_per_second",
                                                                  "mfu", "step_seconds")) + "</div>")
    if charts["preference"][0] is not None:
        parts.append("<h2>Preference tuning</h2><div class=grid>" + chart("preference") + "</div>")
    if charts["reward"][0] is not None:
        parts.append("<h2>Reward</h2><p class=sub>gptforge rl: the mean reward of each step's rollouts and the "
                     "greedy held-out pass@1 (rl.eval_prompts) at each evaluation.</p><div class=grid>"
                     + chart("reward") + "</div>")
    if charts["other"][0] is not None:
        parts.append("<h2>Other metrics</h2><div class=grid>" + chart("other") + "</div>")
    parts.append("<h2>Memory</h2><div class=grid>" + chart("memory") + "</div>" + _memory_html(runs))
    parts.append("<h2>Evaluation</h2><div class=grid>" + chart("eval")
                 + (chart("sources") if charts["sources"][0] is not None else "") + "</div>" + _eval_html(runs))
    parts.append(_mixture_html(runs))
    parts.append("<h2>Samples</h2>" + _samples_html(runs))
    parts.append("<h2>Data</h2>" + _data_html(runs, out_dir))
    parts.append("<h2>Environment</h2>" + _env_html(runs))
    parts.append("<script type='application/json' id=summary-json>"
                 + json.dumps(summaries, default=str).replace("</", "<\\/") + "</script></body></html>")
    return "".join(parts)


def write_report(run_dirs: list[str | Path], out: str | Path, stopped: str | None = None,
                 progress: bool = False) -> Path:
    """Load the runs and write the report to `out` (atomically). Returns `out` as a Path.

    progress: show the steps (each run read, the page built) with `gptforge.progress`.

    Raises:
        MissingInputError: a run directory does not exist.
        InputError: no run directories given, or none holds any run file (metrics.jsonl,
            config.yaml, samples.json, eval/).
    """
    if not run_dirs:
        raise InputError("gptforge report: give at least one run directory")
    paths = [Path(p) for p in run_dirs]
    for p in paths:
        if (p / "meta.json").is_file() and not (p / "config.yaml").is_file() and not (p / "metrics.jsonl").exists():
            raise InputError(f"{p} is a shard folder from `gptforge prepare` (its report.html is the curation "
                             "report), not a run directory: give the --out folder of pretrain / finetune")
    names = [p.resolve().name for p in paths]
    labels = [(f"{p.resolve().parent.name}/{n}" if names.count(n) > 1 else n) for p, n in zip(paths, names, strict=True)]
    for p in paths:
        require_run_dir(p)  # before the progress lines start
    if not any(has_run_files(p) for p in paths):
        raise InputError(f"{', '.join(map(str, paths))}: not a run folder, nothing to report (a run folder, the "
                         "--out of pretrain / finetune, holds metrics.jsonl and config.yaml)")
    out = Path(out)
    with show_progress("report", len(paths) + 1, "steps", info=f"reading {labels[0]}", enabled=progress) as bar:
        runs = []
        for i, (p, label) in enumerate(zip(paths, labels, strict=True)):
            runs.append(load_run(p, label))
            bar.advance(info=f"reading {labels[i + 1]}" if i + 1 < len(labels) else "building the page")
        out.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_text(out, render_report(runs, out.parent, stopped))
        bar.advance()
    return out


def missing_metrics(run_dirs: list[str | Path]) -> list[str]:
    """One line per run directory without a non-empty metrics.jsonl: its page has no curves."""
    return [f"{p}: no metrics.jsonl (the run logged no step): its part of the page has no curves"
            for p in map(Path, run_dirs) if not ((p / "metrics.jsonl").is_file() and (p / "metrics.jsonl").stat().st_size)]


def write_run_report(run_dir: str | Path, stopped: str | None = None) -> Path:
    """Write RUN_DIR/report.html for one run; the trainer calls this at the end of every run.

    Args:
        run_dir: the run directory (config.yaml, metrics.jsonl, tb/ ...; whatever exists).
        stopped: why the run stopped, in words (e.g. TrainResult.stopped: "max_steps",
            "early_stopping", "signal", "non_finite", "stop_at_step"); inferred from the rows when None.

    Returns: the path of the written report.

    Raises:
        MissingInputError: run_dir does not exist.
    """
    return write_report([run_dir], Path(run_dir) / "report.html", stopped)

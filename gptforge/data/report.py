"""The curation report of `prepare`: `report.json` and a single self-contained `report.html`
(interactive plotly charts, plotly.js inlined: it opens from disk with no network).

Counts are made independently so that they check each other: every step counts its drops as
they happen (in the workers), while the output is recounted from the shard files written
(documents = EOS ids in the files, tokens = file sizes / dtype size). `report["check"]` holds
the equation documents read = documents dropped (all steps) + documents written, and whether
it holds.
"""

from __future__ import annotations

import html
import json
import os
import platform
from itertools import pairwise
from pathlib import Path
from typing import Any, Sequence

import numpy as np

from gptforge.data.shards import SPLITS

REPORT_VERSION = 1


def recount_output(shard_dir: Path, meta: dict[str, Any]) -> dict[str, dict[str, int]]:
    """{split: {"documents", "tokens", "files"}} counted from the .bin files themselves."""
    dtype = np.dtype("<u2" if meta["dtype"] == "uint16" else "<u4")
    eos = meta["eos_id"]
    out = {}
    for split in SPLITS:
        docs = toks = 0
        names = meta["splits"][split]["files"]
        for name in names:
            path = Path(shard_dir) / name
            if path.stat().st_size == 0:
                continue
            mm = np.memmap(path, dtype=dtype, mode="r")
            toks += int(mm.size)
            for start in range(0, mm.size, 1 << 24):  # bounded memory for large files
                docs += int(np.count_nonzero(mm[start:start + (1 << 24)] == eos))
            del mm
        out[split] = {"documents": docs, "tokens": toks, "files": len(names)}
    return out


def build_report(*, cfg, recipe, files, shards, read, normalize, steps, corpus, passes, encoded, meta,
                 recount, timings, seconds, hist_edges, resumed, pieces_added: int = 0) -> dict[str, Any]:
    """Assemble the report dict (see module docstring for what is checked).

    corpus: {corpus step name: its verdict's report entry}; every corpus step kind a recipe can
    name (`pipeline.CORPUS_STEPS`) gets a key, empty when the recipe has no such step.
    passes: the timing names of the phases that read every document (rates per document and MB).
    pieces_added: documents made by cutting a document into train/val/test pieces (a split by
    position inside a document), which the written count holds on top of the documents read.
    """
    from gptforge.data.pipeline import CORPUS_STEPS

    hist_tokens = np.sum([e["hist_tokens"] for e in encoded], axis=0).tolist() if encoded else []
    hist_chars = np.sum([e["hist_characters"] for e in encoded], axis=0).tolist() if encoded else []
    chain = [{"name": "read + normalize", "documents_in": read.documents, "documents_out": normalize.documents_out,
              "characters_in": None, "characters_out": normalize.characters_out,
              "dropped": dict(normalize.dropped), "examples": {}, "counts": {}}]
    chain += [s.to_dict() for s in steps]
    dropped_total = sum(sum(s["dropped"].values()) for s in chain)
    written = sum(v["documents"] for v in recount.values())
    links_ok = all(a["documents_out"] == b["documents_in"] for a, b in pairwise(chain))
    mb = read.input_bytes / 1e6
    throughput = {name: {"seconds": round(sec, 3)} for name, sec in timings.items()}
    for name in passes:
        if timings.get(name):
            throughput[name]["documents_per_second"] = round(read.documents / timings[name], 1)
            throughput[name]["input_mb_per_second"] = round(mb / timings[name], 3)
    tok_total = sum(v["tokens"] for v in recount.values())
    if timings.get("tokenize"):
        throughput["tokenize"]["tokens_per_second"] = round(tok_total / timings["tokenize"], 1)
    return {
        "report_version": REPORT_VERSION,
        "recipe": cfg.recipe,
        "recipe_steps": recipe,
        "inputs": {"files": len(files), "shards": shards, "input_bytes": read.input_bytes,
                   "first_files": [str(f) for f in files[:5]]},
        "read": read.to_dict(),
        "warnings": read.warnings,
        "steps": chain,
        **{name: {k: v for k, v in corpus.get(name, {}).items() if k != "step"} for name in CORPUS_STEPS},
        **({"quality": {k: v for k, v in corpus["quality"].items() if k != "step"}} if "quality" in corpus else {}),
        "splits": meta["splits"],
        "output_recounted": recount,
        "histograms": {"edges": hist_edges, "characters_per_document": hist_chars, "tokens_per_document": hist_tokens},
        "check": {"documents_read": read.documents, "documents_dropped": dropped_total, "documents_written": written,
                  "position_split_pieces": pieces_added,
                  "adds_up": read.documents + pieces_added == dropped_total + written and links_ok,
                  "steps_chain": links_ok,
                  "meta_matches_files": all(recount[s]["documents"] == meta["splits"][s]["documents"]
                                            and recount[s]["tokens"] == meta["splits"][s]["tokens"] for s in SPLITS)},
        "throughput": throughput,
        "seconds": round(seconds, 3),
        "workers": cfg.workers,
        "resumed": resumed,
        "machine": {"cpus": os.cpu_count(), "python": platform.python_version()},
    }


def write_report(out_dir: Path, report: dict[str, Any]) -> None:
    """Write `report.json` and `report.html` into `out_dir` (atomically each)."""
    from gptforge.atomic import atomic_write_bytes

    atomic_write_bytes(Path(out_dir) / "report.json",
                       (json.dumps(report, indent=1, ensure_ascii=False) + "\n").encode("utf-8"))
    atomic_write_bytes(Path(out_dir) / "report.html", render_html(report).encode("utf-8"))


# --------------------------------------------------------------------------------------------
# HTML
# --------------------------------------------------------------------------------------------

_CSS = """body{font-family:system-ui,sans-serif;margin:2em;max-width:1100px;color:#222}
table{border-collapse:collapse;margin:.5em 0 1.5em}td,th{border:1px solid #ccc;padding:3px 8px;text-align:right}
th{background:#f3f3f3}td.l,th.l{text-align:left}.ex{font-family:monospace;font-size:12px;white-space:pre-wrap;
text-align:left;max-width:700px;color:#444}.ok{color:#070}.bad{color:#b00;font-weight:bold}h2{margin-top:1.5em}"""


def _e(x: Any) -> str:
    return html.escape(str(x))


def _n(x: Any) -> str:
    return f"{x:,}" if isinstance(x, int) else ("" if x is None else _e(x))


def bar_chart(labels: list[str], values: Sequence[float], title: str, div_id: str) -> str:
    """An interactive plotly bar chart as an HTML fragment (plotly.js itself is inlined once in
    the page head by `render_html`; nothing is fetched)."""
    if not values or max(values) <= 0:
        return f"<p>{_e(title)}: no data</p>"
    import plotly.graph_objects as go

    fig = go.Figure(go.Bar(x=[str(x) for x in labels], y=values, marker_color="#4a7ebb",
                           hovertemplate="%{x}: %{y:,}<extra></extra>"))
    fig.update_layout(title=title, template="plotly_white", height=300, margin=dict(l=60, r=20, t=45, b=90))
    fig.update_xaxes(type="category", tickangle=-45)
    return fig.to_html(full_html=False, include_plotlyjs=False, div_id=div_id,
                       config={"displaylogo": False, "responsive": True}, default_height="300px")


def _hist_chart(edges: list[int], counts: list[int], title: str, div_id: str) -> str:
    if not counts or not any(counts):
        return f"<p>{_e(title)}: no data</p>"
    nz = [i for i, c in enumerate(counts) if c]
    lo, hi = nz[0], nz[-1]
    labels = []
    for i in range(lo, hi + 1):
        a = edges[i]
        b = edges[i + 1] if i + 1 < len(edges) else None
        labels.append(f"{a:,}–{b - 1:,}" if b is not None and b - 1 > a else (f"{a:,}" if b is not None else f"≥{a:,}"))
    return bar_chart(labels, counts[lo:hi + 1], title, div_id)


def render_html(r: dict[str, Any]) -> str:
    """The report as one self-contained HTML page: inline CSS, plotly.js inlined once, plotly charts."""
    from plotly.offline import get_plotlyjs

    c = r["check"]
    out = [f"<!doctype html><html><head><meta charset='utf-8'><title>gptforge prepare report</title>"
           f"<style>{_CSS}</style><script type='text/javascript'>{get_plotlyjs()}</script></head><body>"
           "<h1>gptforge prepare report</h1>",
           f"<p>recipe <b>{_e(r['recipe'])}</b>; {r['inputs']['files']:,} input file(s) in {r['inputs']['shards']:,} "
           f"shard(s), {r['inputs']['input_bytes']:,} bytes; {r['seconds']:.1f} s"
           f"{' (resumed)' if r['resumed'] else ''}.</p>",
           f"<p class='{'ok' if c['adds_up'] else 'bad'}'>documents read {c['documents_read']:,} = dropped "
           f"{c['documents_dropped']:,} + written {c['documents_written']:,}: "
           f"{'adds up' if c['adds_up'] else 'DOES NOT ADD UP'}; shard files "
           f"{'match' if c['meta_matches_files'] else 'DO NOT MATCH'} meta.json.</p>",
           "<h2>Steps</h2><table><tr><th class=l>step</th><th>docs in</th><th>docs out</th><th>chars in</th>"
           "<th>chars out</th><th class=l>dropped</th><th class=l>other counts</th></tr>"]
    for s in r["steps"]:
        dropped = ", ".join(f"{k}: {v:,}" for k, v in sorted(s["dropped"].items(), key=lambda kv: -kv[1]))
        counts = ", ".join(f"{k}: {v:,}" for k, v in sorted(s["counts"].items()))
        out.append(f"<tr><td class=l>{_e(s['name'])}</td><td>{_n(s['documents_in'])}</td><td>{_n(s['documents_out'])}</td>"
                   f"<td>{_n(s['characters_in'])}</td><td>{_n(s['characters_out'])}</td><td class=l>{_e(dropped)}</td>"
                   f"<td class=l>{_e(counts)}</td></tr>")
    out.append("</table>")
    out.append(bar_chart([s["name"] for s in r["steps"]], [sum(s["dropped"].values()) for s in r["steps"]],
                         "documents dropped per step", "chart-dropped"))
    out.append("<h2>Drop reasons, with examples</h2><table><tr><th class=l>step</th><th class=l>reason</th>"
               "<th>documents</th><th class=l>examples (truncated)</th></tr>")
    for s in r["steps"]:
        for reason, n in sorted(s["dropped"].items(), key=lambda kv: -kv[1]):
            ex = "<hr>".join(_e(t) for t in s["examples"].get(reason, []))
            out.append(f"<tr><td class=l>{_e(s['name'])}</td><td class=l>{_e(reason)}</td><td>{n:,}</td>"
                       f"<td class=ex>{ex}</td></tr>")
        # Lines a step removed from documents it kept (C4's line rules): counted in lines.
        for key, texts in s["examples"].items():
            if key in s["dropped"] or not key.startswith("line removed: "):
                continue
            n = s["counts"].get(key[len("line removed: "):], 0)
            ex = "<hr>".join(_e(t) for t in texts)
            out.append(f"<tr><td class=l>{_e(s['name'])}</td><td class=l>{_e(key)}</td><td>{n:,} lines</td>"
                       f"<td class=ex>{ex}</td></tr>")
    out.append("</table>")
    d = r.get("dedup") or {}
    if d:
        sizes = sorted(((int(k), v) for k, v in d.get("cluster_sizes", {}).items()))
        out.append(f"<h2>Duplicates</h2><p>{d.get('documents', 0):,} documents checked; candidate pairs: "
                   f"exact {d.get('exact_candidate_pairs', 0):,}, near {d.get('near_candidate_pairs', 0):,}.</p>")
        out.append(bar_chart([str(k) for k, _ in sizes], [v for _, v in sizes], "duplicate clusters by size (documents)",
                             "chart-dup-clusters") if sizes else "<p>no duplicate clusters</p>")
    if r.get("boilerplate"):
        b = r["boilerplate"]
        out.append(f"<h2>Boilerplate lines</h2><p>{b['boilerplate_lines']:,} distinct lines held by at least "
                   f"{b['threshold_documents']:,} of {b['documents_counted']:,} documents were removed.</p>")
    if r.get("quality"):
        out.append(quality_html(r["quality"]))
    out.append("<h2>Output (recounted from the shard files)</h2><table><tr><th class=l>split</th><th>documents</th>"
               "<th>tokens</th><th>bytes</th><th>bytes/token</th><th>files</th></tr>")
    for split, v in r["output_recounted"].items():
        b = r["splits"][split]["bytes"]
        text_tokens = v["tokens"] - v["documents"]
        out.append(f"<tr><td class=l>{split}</td><td>{v['documents']:,}</td><td>{v['tokens']:,}</td><td>{b:,}</td>"
                   f"<td>{(b / text_tokens if text_tokens else 0):.2f}</td><td>{v['files']}</td></tr>")
    out.append("</table>")
    h = r["histograms"]
    out.append(_hist_chart(h["edges"], h["characters_per_document"], "documents by length (characters)",
                           "chart-len-chars"))
    out.append(_hist_chart(h["edges"], h["tokens_per_document"], "documents by length (tokens)", "chart-len-tokens"))
    out.append("<h2>Throughput</h2><table><tr><th class=l>phase</th><th>seconds</th><th>documents/s</th>"
               "<th>input MB/s</th><th>tokens/s</th></tr>")
    for name, t in r["throughput"].items():
        out.append(f"<tr><td class=l>{_e(name)}</td><td>{t['seconds']:.2f}</td><td>{_n(t.get('documents_per_second'))}</td>"
                   f"<td>{_n(t.get('input_mb_per_second'))}</td><td>{_n(t.get('tokens_per_second'))}</td></tr>")
    out.append("</table>")
    if r["warnings"]:
        out.append("<h2>Input warnings (first 50)</h2><ul>" + "".join(f"<li>{_e(w)}</li>" for w in r["warnings"]) + "</ul>")
    out.append("<h2>Recipe</h2><pre>" + _e(json.dumps(r["recipe_steps"], indent=1)) + "</pre></body></html>")
    return "\n".join(out)


def quality_html(q: dict[str, Any]) -> str:
    """The quality step's section: the classifier, the cut, the score histogram per language,
    and the highest and lowest scored documents."""
    m = q.get("model") or {}
    acc = m.get("held_out_accuracy")
    cut = (f"documents scoring at least {q['threshold']:.4f}" if q.get("threshold_given") else
           f"the top {q['keep']:.0%} (score at least {q['threshold']:.4f})")
    out = [f"<h2>Quality classifier</h2><p>{q['scored']:,} documents scored, {q['kept']:,} kept: {_e(cut)}. "
           f"Classifier: {m.get('positive_documents', '?')} reference and {m.get('negative_documents', '?')} "
           f"negative documents, held-out accuracy "
           f"{'n/a' if acc is None else f'{acc:.1%}'} (ROC AUC "
           f"{'n/a' if m.get('held_out_auc') is None else format(m['held_out_auc'], '.3f')}) on "
           f"{m.get('held_out_documents', 0)} documents"
           + (" (scores reused from the output this run replaced)" if q.get("reused_scores") else "") + ".</p>"]
    bins = int(q.get("histogram_bins", 20))
    labels = [f"{k / bins:.2f}" for k in range(bins)]
    for lang, counts in (q.get("histogram") or {}).items():
        out.append(bar_chart(labels, counts, f"quality scores, language {lang} (documents per bin)",
                             f"chart-quality-{_e(lang)}"))
    for title, key in (("Highest scored", "highest"), ("Lowest scored", "lowest")):
        out.append(f"<h3>{title}</h3><table><tr><th>score</th><th>kept</th><th class=l>text</th></tr>")
        for ex in q.get(key) or []:
            out.append(f"<tr><td>{ex['score']:.4f}</td><td>{'yes' if ex['kept'] else 'no'}</td>"
                       f"<td class=ex>{_e(ex['text'])}</td></tr>")
        out.append("</table>")
    return "".join(out)

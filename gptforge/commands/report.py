"""`gptforge report RUN [RUN2 ...] [--out report.html]`: the interactive run report."""

from __future__ import annotations

import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

# One description: `gptforge --help` lists SUMMARY (read from this file unimported); DESCRIPTION begins with it.
SUMMARY = "Write an interactive HTML report of one run, or several runs overlaid (self-contained, no network)."

DESCRIPTION = SUMMARY + """

One self-contained HTML page (opens from disk, no network) for one run or several
runs overlaid: summary card, loss / lr / gradient norm / throughput / MFU / step time curves with
resumes, skipped steps and spikes marked, memory predicted vs measured, evaluation results, data
and environment; with several runs, a table of their config differences."""


@dataclass
class ReportOptions:
    runs: list[str] = field(default_factory=list)
    """Run directories (the --out folders of pretrain / finetune)."""
    out: Optional[str] = None
    """Where to write the page. Default: RUN/report.html for one run, report.html here for several."""
    quiet: bool = False
    """No progress bars (on a terminal) or progress lines (otherwise) on stderr."""


def main(argv: list[str]) -> int:
    from gptforge.options import command_parser, parse_command
    from gptforge.report import write_report

    opts, _ = parse_command(command_parser("gptforge report", DESCRIPTION, ReportOptions, positional=("runs",)), argv)
    from gptforge.progress import set_quiet

    set_quiet(opts.quiet)
    out = Path(opts.out) if opts.out else (Path(opts.runs[0]) / "report.html" if len(opts.runs) == 1
                                           else Path("report.html"))
    path = write_report(opts.runs, out, progress=True)
    from gptforge.report.page import missing_metrics

    for line in missing_metrics(opts.runs):
        print(f"gptforge report: warning: {line}", file=sys.stderr)
    print(f"wrote {path} ({path.stat().st_size / 1e6:.1f} MB; open it in a browser)")
    return 0

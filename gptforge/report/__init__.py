"""Run reports: one self-contained interactive HTML page per run (or several runs overlaid).

    from gptforge.report import write_run_report, write_report
    write_run_report("runs/r1")                       # runs/r1/report.html
    write_report(["runs/a", "runs/b"], "ab.html")     # overlaid, with a config diff table

Modules: `run_data` (reading a run directory), `downsample` (min/max curve shortening),
`charts` (plotly figures), `page` (the HTML page).
"""

from gptforge.report.page import render_report, write_report, write_run_report

__all__ = ["render_report", "write_report", "write_run_report"]

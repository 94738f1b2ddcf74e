"""The machine a benchmark ran on, in one line: every script under bench/ prints it beside its figures.

Run as `python bench/<script>.py`, a script finds this module on its own folder's path.
"""

from __future__ import annotations

import os
from pathlib import Path

#: CPU flags that decide training and inference speed (vector width, bf16/int8 matmul units).
FLAGS = ("avx2", "avx512f", "avx512_bf16", "avx512_vnni", "amx_bf16", "amx_tile")


def cpu_description() -> str:
    """'<model name>, <n> logical CPUs, flags: <those of FLAGS present>' from /proc/cpuinfo
    ('unknown CPU' where it cannot be read, as on macOS)."""
    model, flags = "unknown CPU", set()
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name") and model == "unknown CPU":
                model = line.split(":", 1)[1].strip()
            elif line.startswith("flags") and not flags:
                flags = set(line.split(":", 1)[1].split())
    except OSError:
        pass
    have = [f for f in FLAGS if f in flags]
    return f"{model}, {os.cpu_count()} logical CPUs, flags: {' '.join(have) or 'none of ' + ' '.join(FLAGS)}"

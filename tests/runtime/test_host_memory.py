"""keep_freed_memory: a step that allocates and frees the same buffers reuses them once the heap has
grown to fit them, instead of page-faulting fresh mappings every step (glibc only)."""

import platform
import subprocess
import sys

import pytest

SCRIPT = """
import resource, sys
import torch
from gptforge.runtime.host_memory import keep_freed_memory
applied = keep_freed_memory() if sys.argv[1] == "keep" else None
faults = []
for _ in range(12):  # a "step": buffers of 4 to 64 MiB, above and below glibc's dynamic mmap threshold
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    bufs = [torch.ones(s << 20) for s in (1, 4, 16, 2, 8)]
    del bufs
    faults.append(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
print(applied, sum(faults[-4:]))
"""


@pytest.mark.skipif(platform.system() != "Linux" or platform.libc_ver()[0] != "glibc", reason="glibc malloc only")
@pytest.mark.parametrize("mode", ["default", "keep"])
def test_step_buffers_are_reused_without_page_faults(mode):
    out = subprocess.run([sys.executable, "-c", SCRIPT, mode], capture_output=True, text=True, check=True).stdout
    applied, faults = out.split()
    pages = 4 * (124 << 20) // 4096  # the last four steps' 124 MiB, in 4 KiB pages
    if mode == "keep":
        assert applied == "True" and int(faults) < pages // 20
    else:
        assert int(faults) > pages // 4  # glibc's default maps and unmaps the large blocks every step

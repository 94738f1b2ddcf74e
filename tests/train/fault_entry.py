"""`gptforge.cli` with a fault hook, for torchrun in the restart test (test_multi_node.py).

Run as `torchrun ... tests/train/fault_entry.py pretrain ...` with FAULT_RANK=R and
FAULT_AFTER_CHECKPOINTS=N: during torchrun's first attempt (TORCHELASTIC_RESTART_COUNT 0), rank R
exits hard (os._exit, no clean-up, as a lost node would) right after its N-th checkpoint is
complete on every rank, having first written FAULT_MARKER. Later attempts run undisturbed, so
the restarted group must finish the run by itself (--resume auto).
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

FAULT_EXIT = 17  # the failed rank's exit status, as torchrun reports it


def install_fault_hook() -> None:
    """Wrap gptforge.runtime.checkpoint.save_checkpoint on the chosen rank of the first attempt."""
    if os.environ.get("TORCHELASTIC_RESTART_COUNT", "0") != "0":
        return
    if os.environ.get("RANK") != os.environ["FAULT_RANK"]:
        return
    from gptforge.runtime import checkpoint

    save, after, saved = checkpoint.save_checkpoint, int(os.environ["FAULT_AFTER_CHECKPOINTS"]), []

    def save_then_fail(*args, **kwargs):
        path = save(*args, **kwargs)  # returns after the final barrier: `latest` names this step
        saved.append(path)
        if len(saved) == after:
            Path(os.environ["FAULT_MARKER"]).write_text(f"rank {os.environ['RANK']} exits after {path.name}\n")
            os._exit(FAULT_EXIT)
        return path

    checkpoint.save_checkpoint = save_then_fail


if __name__ == "__main__":
    install_fault_hook()
    from gptforge.cli import main

    sys.exit(main(sys.argv[1:]))

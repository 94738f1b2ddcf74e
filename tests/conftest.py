"""Shared fixtures: tiny models and tiny shard folders built in the test, no downloads."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

# Keep CPU tests predictable on a 2-core machine.
torch.set_num_threads(min(2, os.cpu_count() or 1))

REPO = Path(__file__).resolve().parents[1]
SHARED_DATA = REPO.parent / "shared" / "data"


@pytest.fixture
def shared_data() -> Path:
    """../shared/data beside the checkout, or skip (a user's clone has none)."""
    if not SHARED_DATA.is_dir():
        pytest.skip("../shared/data is not present")
    return SHARED_DATA

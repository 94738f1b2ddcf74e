"""The CLI makes idle OpenMP threads sleep (OMP_WAIT_POLICY=PASSIVE) unless the user chose a policy."""

import os
import subprocess
import sys

import pytest

from gptforge.cli import main


def _help():
    with pytest.raises(SystemExit):
        main(["report", "--help"])


def test_cli_sets_passive_wait_policy_by_default(monkeypatch, capsys):
    monkeypatch.delenv("OMP_WAIT_POLICY", raising=False)
    _help()
    assert os.environ["OMP_WAIT_POLICY"] == "PASSIVE"
    monkeypatch.setenv("OMP_WAIT_POLICY", "ACTIVE")
    _help()
    assert os.environ["OMP_WAIT_POLICY"] == "ACTIVE"


def test_policy_is_set_before_torch_loads():
    # The command module is imported after the default is set; torch is not loaded before it.
    code = ("import os, sys\nfrom gptforge.cli import main\nassert 'torch' not in sys.modules\n"
            "try:\n    main(['report', '--help'])\nexcept SystemExit:\n    pass\n"
            "print(os.environ['OMP_WAIT_POLICY'])")
    env = {k: v for k, v in os.environ.items() if k != "OMP_WAIT_POLICY"}
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, check=True)
    assert out.stdout.strip().splitlines()[-1] == "PASSIVE"

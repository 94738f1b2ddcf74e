"""Preference tuning on 2 gloo ranks gives the losses and rewards of one process: DDP, and FSDP2
with the frozen reference copy sharded like the policy. A pair's rows stay on one rank
(`PairBatches`), so the ranks' pair counts add up to the single process's batch."""

from __future__ import annotations

import pytest

pytest.importorskip("transformers")

from tests.preference_fixtures import plain_rows, write_hf_model, write_jsonl  # noqa: E402
from tests.train.dist_harness import run_layouts  # noqa: E402

KEYS = ("loss", "rewards/chosen", "rewards/rejected", "rewards/margins", "logps/chosen", "logps/rejected")


def _argv(hf, data, out, micro: int, *extra: str) -> list[str]:
    return ["finetune", "--from", str(hf), "--data", str(data), "--out", str(out), "--quiet",
            "--finetune.objective", "dpo", "--finetune.method", "full", "--finetune.val_fraction", "0",
            "--train.max_steps", "3", "--train.micro_batch_size", str(micro), "--train.lr", "3e-3",
            "--train.lr_schedule", "constant", "--train.warmup_steps", "0", "--train.weight_decay", "0",
            "--train.precision", "fp32", "--train.device", "cpu", "--train.eval_interval", "0", *extra]


def test_ddp_and_fsdp2_equal_one_process(tmp_path):
    from gptforge.cli import main
    from gptforge.train.loggers import read_metrics

    hf = write_hf_model(tmp_path / "hf", "qwen2")
    data = write_jsonl(tmp_path / "pairs.jsonl", plain_rows(16))
    assert main(_argv(hf, data, tmp_path / "one", 8)) == 0
    one = [r for r in read_metrics(tmp_path / "one") if "rewards/chosen" in r]
    jobs = [{"name": name, "run_dir": str(tmp_path / name), "argv": _argv(hf, data, tmp_path / name, 4, *layout)}
            for name, layout in (("ddp", ("--parallel.dp_replicate", "2")), ("fsdp", ("--parallel.dp_shard", "2")))]
    results = run_layouts(2, jobs, tmp_path / "dist", timeout_s=400)
    for name in ("ddp", "fsdp"):
        assert "error" not in results[name], results[name].get("error")
        rows = [r for r in results[name]["rows"] if "rewards/chosen" in r]
        assert len(rows) == len(one) == 3
        assert abs(one[-1]["rewards/margins"]) > 1e-3
        for a, b in zip(one, rows, strict=True):
            for key in KEYS:
                assert b[key] == pytest.approx(a[key], abs=1e-5), (name, a["step"], key)

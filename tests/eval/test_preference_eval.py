"""`gptforge evaluate MODEL --tasks pairs.jsonl [--reference REF]`: preference accuracy of a
model, and its implicit-reward accuracy against the model it was tuned from, checked against
log-probs computed by the Hugging Face model itself."""

from __future__ import annotations

import json

import pytest
import torch

pytest.importorskip("transformers")

from gptforge.data.chat import ChatTokenizer  # noqa: E402
from gptforge.data.preference import load_pairs  # noqa: E402
from gptforge.eval.preference import is_preference_file  # noqa: E402
from tests.preference_fixtures import conversational_rows, plain_rows, write_hf_model, write_jsonl  # noqa: E402


def _hf_logps(folder, examples) -> tuple[torch.Tensor, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    out = []
    for which in ("chosen_ids", "rejected_ids"):
        vals = []
        for ex in examples:
            ids = torch.tensor([ex.prompt_ids + getattr(ex, which)])
            with torch.no_grad():
                logp = model(ids).logits[0, :-1].log_softmax(-1)
            n = len(ex.prompt_ids)
            vals.append(float(logp[n - 1:].gather(-1, ids[0, n:, None]).sum()))
        out.append(torch.tensor(vals, dtype=torch.float64))
    return out[0], out[1]


def test_pref_acc_and_reward_acc_against_hf(tmp_path, capsys):
    from gptforge.commands.evaluate import main

    policy, ref = write_hf_model(tmp_path / "policy", seed=1), write_hf_model(tmp_path / "ref", seed=2)
    rows = plain_rows(10) + conversational_rows(6)
    pairs = write_jsonl(tmp_path / "pairs.jsonl", rows)
    assert is_preference_file(pairs) and not is_preference_file(write_jsonl(tmp_path / "t.jsonl", [{"text": "x"}]))
    examples, _ = load_pairs(pairs, ChatTokenizer.from_dir(policy), 1000)
    c, r = _hf_logps(policy, examples)
    rc, rr = _hf_logps(ref, examples)
    out = tmp_path / "results.json"
    assert main([str(policy), "--tasks", str(pairs), "--reference", str(ref), "--out", str(out), "--json",
                 "--quiet"]) == 0
    metrics = json.loads(capsys.readouterr().out)["tasks"]["pairs"]["metrics"]
    assert metrics["pref_acc"]["n"] == 16
    assert metrics["pref_acc"]["value"] == pytest.approx(float((c > r).double().mean()))
    assert metrics["logp_margin"]["value"] == pytest.approx(float((c - r).mean()), abs=1e-4)
    margin = (c - rc) - (r - rr)
    assert metrics["reward_acc"]["value"] == pytest.approx(float((margin > 0).double().mean()))
    assert metrics["reward_margin"]["value"] == pytest.approx(float(margin.mean()), abs=1e-4)
    assert json.loads(out.read_text())["tasks"]["pairs"]["type"] == "preference"


def test_reference_without_pairs_is_refused(tmp_path):
    from gptforge.commands.evaluate import main
    from gptforge.errors import InputError

    task = write_jsonl(tmp_path / "mc.jsonl", [{"context": "a", "choices": ["b", "c"], "label": 0}])
    with pytest.raises(InputError, match="--reference scores preference files"):
        main([str(tmp_path), "--tasks", str(task), "--reference", str(tmp_path)])

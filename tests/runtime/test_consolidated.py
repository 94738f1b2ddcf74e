"""The consolidated model.safetensors beside a DCP checkpoint (issue 18 item 9): written whole on
one process, read by generate/evaluate without torch.distributed.checkpoint, the same output as
the DCP path, and ignored (DCP read instead) when it does not belong to its checkpoint."""

from __future__ import annotations

import json
import logging
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from gptforge.cli import main
from gptforge.config import ModelConfig, RunConfig, TrainConfig
from gptforge.runtime import checkpoint as ck
from gptforge.runtime.loading import load_for_inference
from gptforge.train.run import train

MODELS = {"gpt2": dict(arch="gpt2", n_layer=2, n_head=2, d_model=32, block_size=32),  # tied embeddings
          "llama": dict(arch="llama", n_layer=2, n_head=2, n_kv_head=1, d_model=32, block_size=32,
                        tie_embeddings=False)}
TEXT = "def add(a, b):\n    return a + b\n\nprint(add(2, 3))\n" * 8


@pytest.fixture(scope="module")
def runs(tiny_shards, tmp_path_factory):
    """{arch: run_dir}: 4 steps, checkpoints at steps 2 and 4."""
    root = tmp_path_factory.mktemp("consolidated")
    out = {}
    for arch, model in MODELS.items():
        cfg = RunConfig(model=ModelConfig(**model),
                        train=TrainConfig(max_steps=4, micro_batch_size=2, lr=1e-2, warmup_steps=1, eval_interval=0,
                                          checkpoint_interval=2, keep_checkpoints=2, tensorboard=False, seed=0))
        train(cfg, tiny_shards, root / arch, progress=False)
        out[arch] = root / arch
    return out


def _dcp_weights(step: Path) -> dict[str, torch.Tensor]:
    import torch.distributed.checkpoint as dcp

    meta = dcp.FileSystemReader(str(step)).read_metadata().state_dict_metadata
    want = {k: torch.empty(v.size, dtype=v.properties.dtype) for k, v in meta.items() if k.startswith("model.")}
    with ck.quiet_single_process_dcp():
        dcp.load(want, checkpoint_id=str(step), no_dist=True)
    return {k[len("model."):]: v for k, v in want.items()}


def _without_consolidated(run: Path, dest: Path) -> Path:
    shutil.copytree(run, dest)
    for f in dest.glob(f"checkpoints/step_*/{ck.CONSOLIDATED_FILE}"):
        f.unlink()
    return dest


@pytest.mark.parametrize("arch", list(MODELS))
def test_checkpoint_holds_the_dcp_weights_whole(runs, arch):
    from safetensors import safe_open

    step = ck.find_checkpoint(runs[arch])
    assert step.name == "step_0000004" and ck.consolidated_problem(step) is None
    dcp_sd = _dcp_weights(step)
    with safe_open(str(step / ck.CONSOLIDATED_FILE), framework="pt") as f:
        meta = f.metadata()
        stored = {k: f.get_tensor(k) for k in f.keys()}
    aliases = json.loads(meta["aliases"])
    assert meta["step"] == "4" and meta["format"] == ck.CONSOLIDATED_FORMAT
    assert aliases == ({"lm_head.weight": "wte.weight"} if arch == "gpt2" else {})
    assert set(stored) | set(aliases) == set(dcp_sd)
    for k, v in dcp_sd.items():
        assert torch.equal(stored[aliases.get(k, k)], v), k


@pytest.mark.parametrize("arch", list(MODELS))
def test_generate_and_evaluate_print_the_same_from_either_file(runs, arch, tmp_path, capsys):
    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    outputs = []
    for run in (runs[arch], _without_consolidated(runs[arch], tmp_path / "dcp_only")):
        assert main(["generate", str(run), "--prompt", "def ", "--max-new-tokens", "12", "--num-samples", "2",
                     "--seed", "3", "--temperature", "0.9"]) == 0
        gen = capsys.readouterr().out
        assert main(["evaluate", str(run), "--text", str(text), "--json"]) == 0
        ev = json.loads(capsys.readouterr().out)
        ev.pop("checkpoint")
        outputs.append((gen, ev))
    assert outputs[0][1]["tokens"] > 0 and outputs[0][0].count("def ") >= 2
    assert outputs[0] == outputs[1]


def test_unsound_consolidated_file_is_ignored_for_dcp(runs, tmp_path, caplog):
    run = _without_consolidated(runs["gpt2"], tmp_path / "run")
    src = runs["gpt2"] / "checkpoints"
    step2, step4 = run / "checkpoints" / "step_0000002", run / "checkpoints" / "step_0000004"
    want = _dcp_weights(step4)
    # Another checkpoint's file, under the step_N name and under another folder name.
    shutil.copyfile(src / "step_0000002" / ck.CONSOLIDATED_FILE, step4 / ck.CONSOLIDATED_FILE)
    assert "written at step 2, in the folder of step 4" in ck.consolidated_problem(step4)
    renamed = run / "checkpoints" / "mine"
    shutil.copytree(step4, renamed)
    assert "another trainer_state.pt" in ck.consolidated_problem(renamed)
    # A file cut short.
    good = (src / "step_0000004" / ck.CONSOLIDATED_FILE).read_bytes()
    (step4 / ck.CONSOLIDATED_FILE).write_bytes(good[:-100])
    assert "truncated" in ck.consolidated_problem(step4)
    with caplog.at_level(logging.WARNING, logger="gptforge"):
        model, ckpt, _, _ = load_for_inference(run, "cpu")
    assert ckpt == step4 and "reading the weights from the DCP files instead" in caplog.text
    for k, v in model.state_dict().items():
        assert torch.equal(v, want[k]), k
    # A sound file carries a weights-only reader past damaged DCP data; a resume falls back.
    (step4 / ck.CONSOLIDATED_FILE).write_bytes(good)
    data = next(step4.glob("*.distcp"))
    data.write_bytes(data.read_bytes()[:1000])
    assert ck.find_checkpoint(run, weights_only=True) == step4
    assert ck.find_checkpoint(run) == step2
    model, _, _, _ = load_for_inference(run, "cpu")
    for k, v in model.state_dict().items():
        assert torch.equal(v, want[k]), k


def test_whole_signature_refuses_what_is_not_whole():
    t = torch.zeros(2, 3)
    assert ck.whole_signature({"a": t, "b": torch.nn.Parameter(t)}) == (("a", (2, 3), "torch.float32"),
                                                                        ("b", (2, 3), "torch.float32"))
    assert ck.whole_signature({}) is None  # DeepSpeed's other ranks
    assert ck.whole_signature({"a": t, "x": b"bytes"}) is None
    assert ck.whole_signature({"blocks.0.mlp.fc.weight_4bit": t.to(torch.uint8)}) is None  # QLoRA

    class Sub(torch.Tensor):
        pass

    assert ck.whole_signature({"a": t.as_subclass(Sub)}) is None  # DTensor is a subclass too


def test_inference_start_imports_neither_dcp_nor_sympy(runs, tmp_path):
    """generate and evaluate in a fresh interpreter; then a run without the file, which must
    import DCP (so the check can fail)."""
    text = tmp_path / "t.txt"
    text.write_text(TEXT)
    dcp_only = _without_consolidated(runs["llama"], tmp_path / "dcp_only")
    heavy = ["torch.distributed.checkpoint", "torch.distributed.tensor", "sympy", "torch._dynamo", "transformers"]
    script = f"""
import json, sys
from gptforge.cli import main
assert main(["generate", {str(runs["llama"])!r}, "--max-new-tokens", "2"]) == 0
assert main(["evaluate", {str(runs["gpt2"])!r}, "--text", {str(text)!r}]) == 0
fast = [m for m in {heavy!r} if m in sys.modules]
assert main(["generate", {dcp_only.as_posix()!r}, "--max-new-tokens", "2"]) == 0
print(json.dumps({{"fast": fast, "dcp": [m for m in {heavy!r} if m in sys.modules]}}))
"""
    res = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert res.returncode == 0, res.stderr
    found = json.loads(res.stdout.strip().splitlines()[-1])
    assert found["fast"] == []
    assert "torch.distributed.checkpoint" in found["dcp"]


def test_written_by_default_only_where_cheap(tmp_path):
    """Beside an optimizer state at least as large as the weights (full training) by default;
    not beside weights alone or a tiny optimizer state (LoRA), where it would double the folder."""
    from gptforge.model.gpt import GPT

    model = GPT(ModelConfig(**MODELS["gpt2"], vocab_size=64).resolved())

    def saved(name, optimizer, **kw):
        step = ck.save_checkpoint(tmp_path / name, 1, model, optimizer, {"step": 1}, "model: {}\n", **kw)
        return (step / ck.CONSOLIDATED_FILE).is_file()

    def stepped(params):
        opt = torch.optim.AdamW(params, lr=1e-3)
        model(torch.zeros(1, 4, dtype=torch.long)).float().sum().backward()
        opt.step()
        return opt

    assert not saved("weights_only", None)
    assert saved("forced", None, consolidated=True)
    assert not saved("tiny_optimizer", stepped([model.norm_f.weight]))
    full = stepped(model.parameters())
    assert saved("full_training", full)
    assert not saved("refused", full, consolidated=False)

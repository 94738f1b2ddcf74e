"""llama.cpp's OpenAI-compatible server as llama-cpp-python ships it (`python -m llama_cpp.server`)
on gptforge's GGUF export of a chat fine-tune: the `openai` client's greedy completion equals
gptforge's greedy continuation, and a chat request is rendered with the GGUF file's chat template
to the ids gptforge's template gives. Skips where llama-cpp-python or its server extra is missing
(pip install 'llama-cpp-python[server]'; .ci/run installs it)."""

from __future__ import annotations

import json
import random
import sys

import pytest

pytest.importorskip("llama_cpp", reason="llama-cpp-python not installed (pip install 'llama-cpp-python[server]')")
pytest.importorskip("sse_starlette", reason="llama_cpp.server's extra not installed "
                                             "(pip install 'llama-cpp-python[server]')")

from gptforge.cli import main  # noqa: E402
from tests.engine_servers import free_port, running_server  # noqa: E402

PROMPT = "def main():\n    "
CHAT = [{"role": "user", "content": "reverse: abcd"}]


@pytest.fixture(scope="module")
def chat_gguf(trained_runs, tmp_path_factory):
    """(fine-tuned qwen3 run with the built-in chat template, its f32 GGUF file)."""
    root = tmp_path_factory.mktemp("llama-server")
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefgh") for _ in range(4)) for _ in range(24)]
    data = root / "chat.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"reverse: {w}"},
                                                     {"role": "assistant", "content": w[::-1]}]}) + "\n"
                            for w in words))
    run = root / "run"
    assert main(["finetune", "--from", str(trained_runs["qwen3"]), "--data", str(data), "--out", str(run),
                 "--finetune.method", "full", "--train.max_steps", "4", "--train.micro_batch_size", "4",
                 "--finetune.block_size", "32", "--train.eval_interval", "0", "--train.tensorboard", "false",
                 "--train.device", "cpu", "--train.warmup_steps", "1", "--quiet"]) == 0
    assert main(["export", str(run), "--format", "gguf", "--dtype", "f32", "--out", str(root / "g"), "--quiet"]) == 0
    return run, next((root / "g").glob("*.gguf"))


def test_llama_cpp_server_answers_the_openai_client(chat_gguf, tmp_path):
    import torch
    from openai import OpenAI

    from gptforge.data.chat import ChatTokenizer, prompt_ids
    from gptforge.data.tokenizer import Tokenizer
    from gptforge.infer.generate import generate
    from gptforge.runtime.loading import load_for_inference

    run, gguf_file = chat_gguf
    port = free_port()
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(gguf_file), "--model_alias", "tiny",
           "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "64", "--n_threads", "1"]
    with running_server(cmd, f"http://127.0.0.1:{port}", tmp_path / "llama-server.log", 300):
        client = OpenAI(base_url=f"http://127.0.0.1:{port}/v1", api_key="none", max_retries=0, timeout=120)
        done = client.completions.create(model="tiny", prompt=PROMPT, max_tokens=12, temperature=0)
        reply = client.chat.completions.create(model="tiny", messages=CHAT, max_tokens=8, temperature=0)

    model, _, _, tok_path = load_for_inference(run, "cpu")
    tok, chat = Tokenizer.from_file(tok_path), ChatTokenizer.from_dir(run)
    ids = tok.encode(PROMPT)
    ours = generate(model, torch.tensor([ids]), 12, temperature=0)[0, len(ids):].tolist()
    assert done.choices[0].text == tok.decode(ours) and done.usage.prompt_tokens == len(ids)

    prompt = prompt_ids(chat, CHAT)
    assert reply.usage.prompt_tokens == len(prompt)  # the GGUF's template rendered to gptforge's ids
    answer = generate(model, torch.tensor([prompt]), 8, temperature=0, eos_id=chat.eos_id)[0, len(prompt):].tolist()
    answer = answer[: answer.index(chat.eos_id)] if chat.eos_id in answer else answer
    assert reply.choices[0].message.content == tok.decode(answer)

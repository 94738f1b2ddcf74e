"""llama.cpp's OpenAI-compatible server, as llama-cpp-python ships it (`python -m llama_cpp.server`),
on gptforge's GGUF export: a completion and a chat request through the OpenAI client give the
greedy tokens `gptforge generate` gives, the chat one rendered by the chat template the export
embeds. Skips when llama-cpp-python or its server extra (`pip install 'llama-cpp-python[server]'`)
is missing; `.ci/run` installs both."""

from __future__ import annotations

import importlib.util
import shutil
import sys

import pytest
import torch

pytest.importorskip("llama_cpp", reason="llama-cpp-python is not installed (it compiles llama.cpp)")
if importlib.util.find_spec("sse_starlette") is None or importlib.util.find_spec("starlette_context") is None:
    pytest.skip("llama_cpp.server's extra is not installed: pip install 'llama-cpp-python[server]'",
                allow_module_level=True)
openai = pytest.importorskip("openai")

from gptforge.data.chat import ChatTokenizer, default_chat_template, render_default  # noqa: E402
from gptforge.export.gguf import write_gguf  # noqa: E402
from gptforge.infer.generate import generate  # noqa: E402
from gptforge.runtime.loading import load_model_checkpoint  # noqa: E402
from tests.engine_servers import free_port, running_server  # noqa: E402

from .conftest import val_tokens  # noqa: E402

NEW_TOKENS = 12
# Greedy on the server's side: one candidate, no repetition penalty (its default is 1.1).
GREEDY = {"top_k": 1, "repeat_penalty": 1.0}


def _greedy(model, prompt: list[int], n: int = NEW_TOKENS) -> list[int]:
    return generate(model, torch.tensor([prompt]), n, temperature=0)[0, len(prompt):].tolist()


def test_llama_cpp_server_answers_like_gptforge(trained_runs, tiny_shards, tmp_path):
    run = trained_runs["qwen3"]
    model, _ = load_model_checkpoint(run)
    model = model.float().eval()
    tok_dir = tmp_path / "tok"
    tok_dir.mkdir()
    shutil.copy(run / "tokenizer.json", tok_dir)
    (tok_dir / "chat_template.jinja").write_text(default_chat_template())
    path = write_gguf(model, tok_dir, tmp_path / "m.gguf", dtype="f32")
    tok = ChatTokenizer.from_dir(tok_dir)

    port = free_port()
    url = f"http://127.0.0.1:{port}"
    cmd = [sys.executable, "-m", "llama_cpp.server", "--model", str(path), "--model_alias", "gptforge",
           "--host", "127.0.0.1", "--port", str(port), "--n_ctx", "64", "--n_threads", "1"]
    with running_server(cmd, url, tmp_path / "server.log", timeout_s=300):
        client = openai.OpenAI(base_url=url + "/v1", api_key="none")
        assert [m.id for m in client.models.list().data] == ["gptforge"]

        # A completion of a prompt of real text: the greedy continuation, token for token.
        prompt_ids = val_tokens(tiny_shards, 12).tolist()
        prompt = tok.tokenizer.decode(prompt_ids)
        assert tok.tokenizer.encode(prompt).ids == prompt_ids  # the text round-trips to the same ids
        want = _greedy(model, prompt_ids)
        r = client.completions.create(model="gptforge", prompt=prompt, max_tokens=NEW_TOKENS, temperature=0,
                                      extra_body=GREEDY)
        assert r.usage.prompt_tokens == len(prompt_ids)
        assert r.choices[0].text == tok.tokenizer.decode(want)

        # A chat request: rendered by the embedded template exactly as gptforge renders it.
        messages = [{"role": "user", "content": "def add(a, b):"}]
        ids = render_default(tok, messages, add_generation_prompt=True).ids
        assert len(ids) + NEW_TOKENS <= 64  # inside --n_ctx (llama-cpp-python fails past it, not with an error)
        want = _greedy(model, ids)
        if tok.eos_id in want:
            want = want[: want.index(tok.eos_id)]
        assert want, "the model ends its answer at once: nothing to compare"
        r = client.chat.completions.create(model="gptforge", messages=messages, max_tokens=NEW_TOKENS,
                                           temperature=0, extra_body=GREEDY)
        assert r.usage.prompt_tokens == len(ids)
        assert r.choices[0].message.content == tok.tokenizer.decode(want)

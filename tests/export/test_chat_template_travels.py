"""A run fine-tuned with the built-in instruction format carries it as a Jinja chat template into
its hf, gguf and onnx exports, and serve renders conversations with it: one conversation gives
the same token ids through transformers' apply_chat_template, the GGUF file's template and
gptforge's own rendering."""

from __future__ import annotations

import json
from types import SimpleNamespace

import pytest

from gptforge.cli import main
from gptforge.data.chat import ChatTokenizer, default_chat_template, prompt_ids, render_default

CONVERSATION = [{"role": "system", "content": "You reverse words."},
                {"role": "user", "content": "reverse: abcd"},
                {"role": "assistant", "content": "dcba"},
                {"role": "user", "content": "reverse: hello world"}]


@pytest.fixture(scope="module")
def chat_run(trained_runs, tmp_path_factory):
    import random

    root = tmp_path_factory.mktemp("chat")
    rng = random.Random(0)
    words = ["".join(rng.choice("abcdefgh") for _ in range(4)) for _ in range(24)]
    data = root / "chat.jsonl"
    data.write_text("".join(json.dumps({"messages": [{"role": "user", "content": f"reverse: {w}"},
                                                     {"role": "assistant", "content": w[::-1]}]}) + "\n"
                            for w in words))
    run = root / "run"
    assert main(["finetune", "--from", str(trained_runs["qwen3"]), "--data", str(data), "--out", str(run),
                 "--train.max_steps", "2", "--train.micro_batch_size", "4", "--finetune.block_size", "32",
                 "--train.eval_interval", "0", "--train.tensorboard", "false", "--train.device", "cpu",
                 "--train.warmup_steps", "1", "--quiet"]) == 0
    return run


def _reference_ids(run) -> list[int]:
    """gptforge's built-in rendering (no Jinja), as fine-tuning encoded the data."""
    tok = ChatTokenizer.from_dir(run)
    tok.chat_template = None
    return render_default(tok, CONVERSATION, add_generation_prompt=True).ids


def test_run_dir_holds_the_template_and_gptforge_renders_it_alike(chat_run):
    assert (chat_run / "chat_template.jinja").read_text() == default_chat_template()
    tok = ChatTokenizer.from_dir(chat_run)
    assert tok.chat_template == default_chat_template()
    assert prompt_ids(tok, CONVERSATION) == _reference_ids(chat_run)  # the Jinja path, same ids


def test_hf_export_carries_it_to_transformers(chat_run, tmp_path):
    transformers = pytest.importorskip("transformers")
    out = tmp_path / "hf"
    assert main(["export", str(chat_run), "--format", "hf", "--out", str(out)]) == 0
    assert json.loads((out / "tokenizer_config.json").read_text())["chat_template"] == default_chat_template()
    tok = transformers.AutoTokenizer.from_pretrained(out)
    text = tok.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True)
    assert tok(text, add_special_tokens=False)["input_ids"] == _reference_ids(chat_run)


def test_gguf_export_carries_it(chat_run, tmp_path):
    gguf = pytest.importorskip("gguf")
    transformers = pytest.importorskip("transformers")
    out = tmp_path / "g"
    assert main(["export", str(chat_run), "--format", "gguf", "--dtype", "f32", "--out", str(out)]) == 0
    reader = gguf.GGUFReader(next(out.glob("*.gguf")))
    template = reader.fields["tokenizer.chat_template"].contents()
    assert template == default_chat_template()
    tok = transformers.PreTrainedTokenizerFast(tokenizer_file=str(chat_run / "tokenizer.json"),
                                               eos_token="<|endoftext|>", bos_token="<|endoftext|>")
    tok.chat_template = template
    text = tok.apply_chat_template(CONVERSATION, tokenize=False, add_generation_prompt=True)
    assert tok(text, add_special_tokens=False)["input_ids"] == _reference_ids(chat_run)


def test_onnx_folder_carries_it(chat_run, tmp_path):
    pytest.importorskip("onnxscript")
    out = tmp_path / "o"
    assert main(["export", str(chat_run), "--format", "onnx", "--out", str(out)]) == 0
    assert (out / "chat_template.jinja").read_text() == default_chat_template()
    assert json.loads((out / "tokenizer_config.json").read_text())["chat_template"] == default_chat_template()


def test_serve_chat_endpoint_renders_the_same_ids(chat_run):
    pytest.importorskip("fastapi")
    from gptforge.serve.app import ServeConfig, Server, load_model

    model, tok_file, template = load_model(str(chat_run), "cpu", "fp32")
    srv = Server(model, tok_file, ServeConfig(model_name="t", chat_template=template))
    messages = [SimpleNamespace(**m) for m in CONVERSATION]
    assert srv.chat_ids(messages) == _reference_ids(chat_run)

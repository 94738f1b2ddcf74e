"""Preference-tuning fixtures built inside the tests: a byte-level BPE with a ChatML template, a tiny
Qwen2- or Llama-shaped Hugging Face model beside it, and 16 pair rows in each of TRL's formats."""

from __future__ import annotations

import functools
import inspect
import json
from pathlib import Path

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


@functools.lru_cache(maxsize=None)
def tokenizer_json() -> str:
    """A byte-level BPE (vocab 400) trained on the json package's source."""
    import json as json_module

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=400, special_tokens=list(SPECIALS), show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(inspect.getsource(json_module).splitlines(), trainer)
    return tok.to_str()


def write_tokenizer(folder: Path) -> Path:
    """tokenizer.json + tokenizer_config.json (EOS and pad <|im_end|>, the ChatML template)."""
    folder.mkdir(parents=True, exist_ok=True)
    (folder / "tokenizer.json").write_text(tokenizer_json())
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "pad_token": "<|im_end|>",
        "bos_token": None, "chat_template": CHATML,
    }))
    return folder


def write_hf_model(folder: Path, kind: str = "qwen2", seed: int = 0) -> Path:
    """A tiny random Hugging Face causal LM (Qwen2: q/k/v biases, tied embeddings; Llama: GQA,
    untied head) with the test tokenizer, every weight perturbed so no mapping hides."""
    import torch
    import transformers
    from transformers import LlamaConfig, Qwen2Config

    write_tokenizer(folder)
    from tokenizers import Tokenizer

    size = Tokenizer.from_str(tokenizer_json()).get_vocab_size(with_added_tokens=True)
    common = dict(vocab_size=size, hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, max_position_embeddings=128, eos_token_id=2, pad_token_id=2)
    cfg = Qwen2Config(**common, tie_word_embeddings=True) if kind == "qwen2" else \
        LlamaConfig(**common, tie_word_embeddings=False)
    torch.manual_seed(seed)
    model = transformers.AutoModelForCausalLM.from_config(cfg)
    with torch.no_grad():
        for p in model.parameters():
            p.add_(torch.randn_like(p) * 0.05)
    model.save_pretrained(folder)
    return folder


_WORDS = ["dumps", "loads", "encode", "decode", "object", "string", "float", "array", "number", "indent",
          "separators", "default", "sort_keys", "ensure_ascii", "parse", "hook"]


def plain_rows(n: int = 16) -> list[dict]:
    """`{"prompt", "chosen", "rejected"}` text rows of varied lengths."""
    rows = []
    for i in range(n):
        w, v = _WORDS[i % len(_WORDS)], _WORDS[(i * 7 + 3) % len(_WORDS)]
        rows.append({"prompt": f"What does json.{w} do with {i}?",
                     "chosen": f" It returns the {w} of {v}" + " again" * (i % 3),
                     "rejected": f" No idea about {v}" + "." * (i % 4 + 1)})
    return rows


def conversational_rows(n: int = 16) -> list[dict]:
    """Rows whose prompt, chosen and rejected are message lists (a system turn on every other)."""
    rows = []
    for i, r in enumerate(plain_rows(n)):
        prompt = ([{"role": "system", "content": "Be brief."}] if i % 2 else []) + \
            [{"role": "user", "content": r["prompt"]}]
        rows.append({"prompt": prompt, "chosen": [{"role": "assistant", "content": r["chosen"].strip()}],
                     "rejected": [{"role": "assistant", "content": r["rejected"].strip()}]})
    return rows


def implicit_rows(n: int = 16) -> list[dict]:
    """Rows with only `chosen` / `rejected`: two full conversations sharing the prompt turns."""
    return [{"chosen": r["prompt"] + r["chosen"], "rejected": r["prompt"] + r["rejected"]}
            for r in conversational_rows(n)]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path

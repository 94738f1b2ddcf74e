"""The loss curves of tiny runs stay what they were: a refactor of the trainer's plumbing must not
move them.

Seven tiny runs (fp32, one thread, CPU) whose per-step train loss and val loss are compared with
`golden/curves.json` within 1e-6 relative: plain pretraining, a two-source mixture, the document
mask, completion-only SFT and LoRA from the plain run, distillation from the plain run as
teacher, and a 2-stage pipeline (gloo, 2 processes). Everything the runs read is built here
from fixed rules (a byte-level tokenizer without merges, text from a seeded generator), so the
figures depend on torch's fp32 kernels and the trainer alone.

Regenerate the golden file (only when a change is meant to move the curves, and say why in the
commit): `python -m tests.train.test_golden_curves --write`.
"""

from __future__ import annotations

import json
import random
import sys
from pathlib import Path

import pytest

GOLDEN = Path(__file__).parent / "golden" / "curves.json"
REL = 1e-6
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
WORDS = ("the", "cat", "dog", "sat", "ran", "on", "a", "mat", "log", "and", "then", "slept", "ate", "fish",
         "big", "small", "red", "blue", "quickly", "home")
MODEL = dict(arch="gpt2", n_layer=2, n_head=2, d_model=32, block_size=32, dropout=0.0)
UNTIED = dict(MODEL, tie_embeddings=False)


def _train_kw(**kw) -> dict:
    d = dict(max_steps=4, micro_batch_size=2, gradient_accumulation_steps=2, lr=3e-3, warmup_steps=1,
             eval_interval=2, eval_steps=2, checkpoint_interval=0, tensorboard=False, report=False, seed=7,
             grad_clip=1.0, precision="fp32", device="cpu", spike_alarms=True)
    d.update(kw)
    return d


def byte_tokenizer_json() -> str:
    """A byte-level BPE with the 256 byte symbols and no merges, plus the chat special tokens: the
    same ids on every machine (nothing is trained)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    alphabet = sorted(pre_tokenizers.ByteLevel.alphabet())
    tok = Tokenizer(models.BPE(vocab={c: i for i, c in enumerate(alphabet)}, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIALS))
    return tok.to_str()


def _documents(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    docs = []
    for _ in range(n):
        sentences = []
        for _ in range(rng.randint(1, 4)):
            sentences.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 8))) + ".")
        docs.append(" ".join(sentences))
    return docs


def write_shards(out: Path, seed: int, n_train: int = 200, n_val: int = 40) -> Path:
    """A shard folder of generated documents (byte tokens, EOS after each)."""
    import numpy as np

    from gptforge.data.shards import ShardWriter
    from gptforge.data.tokenizer import Tokenizer

    tok = Tokenizer.from_str(byte_tokenizer_json())
    with ShardWriter(out, tok) as w:
        for split, docs in (("train", _documents(n_train, seed)), ("val", _documents(n_val, seed + 1000))):
            ids = [i for d in docs for i in (*tok.encode(d), tok.eos_id)]
            w.write(split, np.asarray(ids), documents=len(docs), nbytes=sum(len(d.encode()) for d in docs))
        w.finish()
    return out


def write_instructions(path: Path, n: int = 48) -> Path:
    """Generated instructions (reverse / repeat a word), prompt/completion and chat rows."""
    rng = random.Random(3)
    rows = []
    for i in range(n):
        word = "".join(rng.choice("abcdefgh") for _ in range(rng.randint(2, 5)))
        task = rng.choice(["reverse", "repeat"])
        answer = word[::-1] if task == "reverse" else f"{word} {word}"
        rows.append({"prompt": f"{task}: {word}\n", "completion": answer} if i % 2 else
                    {"messages": [{"role": "user", "content": f"{task} {word}"},
                                  {"role": "assistant", "content": answer}]})
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def _curve(history: list[dict]) -> dict[str, list]:
    return {"loss": [r["loss"] for r in history], "val_loss": [r.get("val_loss") for r in history]}


def run_all(root: Path) -> dict[str, dict[str, list]]:
    """Every golden run under `root`; name -> {"loss": [...], "val_loss": [...]} per step."""
    import torch

    from gptforge.config import FinetuneConfig, ModelConfig, ParallelConfig, RunConfig, TrainConfig
    from gptforge.train.run import train
    from gptforge.train.workflows.distill import distill
    from gptforge.train.workflows.finetune import finetune

    torch.set_num_threads(1)
    a, b = write_shards(root / "a", seed=1), write_shards(root / "b", seed=2)
    jsonl = write_instructions(root / "sft.jsonl")

    def cfg(model=MODEL, **kw) -> RunConfig:
        return RunConfig(model=ModelConfig(**model), train=TrainConfig(**_train_kw(**kw)))

    out: dict[str, dict[str, list]] = {}
    out["pretrain"] = _curve(train(cfg(), a, root / "pretrain", progress=False).history)
    out["mixture"] = _curve(train(cfg(data_weights={"a": 0.7, "b": 0.3}), [a, b], root / "mixture",
                                  progress=False).history)
    out["document_mask"] = _curve(train(cfg(document_mask=True), a, root / "docmask", progress=False).history)
    ft = dict(block_size=32, val_fraction=0.25, chat_template="default")
    for method in ("full", "lora"):
        res = finetune(FinetuneConfig(method=method, **ft), cfg(lr=1e-2), root / "pretrain", jsonl,
                       root / f"sft_{method}", progress=False)
        out["sft" if method == "full" else "lora"] = _curve(res.history)
    student = RunConfig(model=ModelConfig(preset="gpt2-nano", n_layer=1, d_model=32, block_size=32, dropout=0.0),
                        train=TrainConfig(**_train_kw()))
    res = distill(student, root / "pretrain", "gpt2-nano", a, root / "distill", alpha=0.5, temperature=2.0,
                  progress=False)
    out["distill"] = _curve(res.history)
    out["pipeline"] = _pipeline(a, root)
    return out


def _pipeline(data: Path, root: Path) -> dict[str, list]:
    from tests.train.dist_harness import run_layouts

    job = dict(name="pp", model=UNTIED, train=_train_kw(), parallel=dict(pp=2, pp_schedule="1f1b",
                                                                        pp_microbatches=2),
               data=str(data), run_dir=str(root / "pp"), resume=False)
    res = run_layouts(2, [job], root / "pp_out")["pp"]
    assert "error" not in res, res["error"]
    return {"loss": res["loss"], "val_loss": res["val_loss"]}


def _close(a, b) -> bool:
    if a is None or b is None:
        return a is b
    return abs(a - b) <= REL * abs(b)


@pytest.fixture(scope="module")
def curves(tmp_path_factory) -> dict[str, dict[str, list]]:
    return run_all(tmp_path_factory.mktemp("golden"))


@pytest.mark.parametrize("name", ["pretrain", "mixture", "document_mask", "sft", "lora", "distill", "pipeline"])
def test_curve_equals_golden(curves, name):
    want = json.loads(GOLDEN.read_text())[name]
    got = curves[name]
    for key in ("loss", "val_loss"):
        assert len(got[key]) == len(want[key]), f"{name} {key}: {len(got[key])} steps, golden {len(want[key])}"
        bad = [(i + 1, g, w) for i, (g, w) in enumerate(zip(got[key], want[key], strict=True)) if not _close(g, w)]
        assert not bad, f"{name} {key}: (step, now, golden) differ beyond {REL} relative: {bad}"
    assert any(v is not None for v in got["val_loss"]), f"{name}: no validation row (the golden checks val too)"


if __name__ == "__main__":
    if sys.argv[1:] != ["--write"]:
        sys.exit("usage: python -m tests.train.test_golden_curves --write")
    import os
    import tempfile

    os.environ.setdefault("GPTFORGE_AUTO_PRECISION", "fp32")
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    with tempfile.TemporaryDirectory() as tmp:
        result = run_all(Path(tmp))
    GOLDEN.parent.mkdir(exist_ok=True)
    GOLDEN.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {GOLDEN}")

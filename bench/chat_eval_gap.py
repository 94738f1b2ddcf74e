"""Plain against chat scoring of a chat-tuned model: the gap `gptforge evaluate --chat` closes.

A small GPT (gpt2-micro, block 128) is pretrained briefly on standard-library source, then
fine-tuned for a few CPU minutes on a synthetic chat task, rendered exactly as `--chat` renders
it (`gptforge.eval.chat.user_turn`): one colour among three other words,
- `colour_mc`: "Which word is a colour?" with the 4 words as lettered options, answered by the
  letter (multiple choice; plain scoring reads it as `context + " " + word`, lm-eval style);
- `colour_gen`: "Which word is a colour: w1, w2, w3, w4?" answered by the word (generation;
  plain: greedy text after the prompt, SQuAD exact match; chat: the reply's answer).
Held-out items of both are scored on the base model and the tuned one, plain and with --chat
(the base through gptforge's built-in template, `--chat-template default`). Prints each score,
CORE and ChatCORE, the seconds each stage took and the machine's load.

    python bench/chat_eval_gap.py [--pretrain-steps 20] [--finetune-steps 200] [--lr 1e-3] [--examples 100]
"""

from __future__ import annotations

import argparse
import json
import os
import random
import sys
import tempfile
import time
from pathlib import Path

from machine import cpu_description  # bench/machine.py

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))


COLOURS = ["red", "blue", "green", "yellow", "purple", "orange", "brown", "black"]
OTHERS = ["table", "river", "window", "horse", "pencil", "garden", "bottle", "ladder", "cloud", "spoon", "candle",
          "bridge", "apple", "mirror", "rabbit", "basket", "engine", "pillow", "forest", "hammer"]


def write_tasks(folder: Path, n: int, seed: int) -> tuple[Path, Path]:
    """(multiple-choice task, generation task) of `n` items each: one colour among three other words."""
    rng = random.Random(seed)
    mc_rows, gen_rows = [], []
    for _ in range(2 * n):
        words = rng.sample(OTHERS, 3) + [rng.choice(COLOURS)]
        rng.shuffle(words)
        colour = next(w for w in words if w in COLOURS)
        if len(mc_rows) < n:
            mc_rows.append({"context": "Which word is a colour?", "choices": words, "label": words.index(colour)})
        else:
            gen_rows.append({"prompt": f"Which word is a colour: {', '.join(words)}?", "answer": colour})
    folder.mkdir(parents=True, exist_ok=True)
    mc, gen = folder / "colour_mc.jsonl", folder / "colour_gen.jsonl"
    mc.write_text("".join(json.dumps(r) + "\n" for r in mc_rows))
    gen.write_text("".join(json.dumps(r) + "\n" for r in gen_rows))
    (folder / "colour_gen.yaml").write_text("data: colour_gen.jsonl\nmax_new_tokens: 6\n")
    return mc, folder / "colour_gen.yaml"


def chat_rows(mc: Path, gen: Path) -> list[dict]:
    """The tasks' items as chat conversations, rendered as --chat renders them, answers included."""
    from gptforge.eval.chat import gold_reply, user_turn
    from gptforge.eval.tasks import load_task

    rows = []
    for path in (mc, gen):
        task = load_task(path)
        for ex in task.examples:
            rows.append({"messages": [{"role": "user", "content": user_turn(task, ex)},
                                      {"role": "assistant", "content": gold_reply(task, ex)}]})
    random.Random(0).shuffle(rows)
    return rows


def pretrain(work: Path, steps: int) -> Path:
    from gptforge.config import ModelConfig, RunConfig, TrainConfig
    from gptforge.data.prepare import PrepareConfig, prepare
    from gptforge.data.stdlib_corpus import stdlib_files
    from gptforge.train.run import train

    files = stdlib_files()[::8][:20]
    prepare(PrepareConfig(inputs=[str(p) for p in files], out=str(work / "data"), vocab_size=1024, val_fraction=0.05,
                          workers=1), show_progress=False)
    cfg = RunConfig(model=ModelConfig(preset="gpt2-micro", block_size=128),
                    train=TrainConfig(max_steps=steps, micro_batch_size=8, lr=2e-3, warmup_steps=min(10, steps), eval_interval=0,
                                      checkpoint_interval=0, tensorboard=False))
    train(cfg, work / "data", work / "base", progress=False)
    return work / "base"


def score(run: Path, tasks: list[str], chat: bool, template: str = "auto") -> dict:
    from gptforge.eval.task_report import evaluate_tasks

    doc, _ = evaluate_tasks(str(run), tasks, device="cpu", out=str(run / "bench_eval" / f"{chat}.json"), chat=chat,
                            chat_template=template)
    return doc


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pretrain-steps", type=int, default=20)
    ap.add_argument("--finetune-steps", type=int, default=200)
    ap.add_argument("--lr", type=float, default=1e-3, help="Peak learning rate of the fine-tuning.")
    ap.add_argument("--examples", type=int, default=100, help="Held-out items per task.")
    args = ap.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    from gptforge.cli import main as cli

    seconds = {}
    load_start = os.getloadavg()
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        t0 = time.perf_counter()
        base = pretrain(work, args.pretrain_steps)
        seconds["pretrain"] = time.perf_counter() - t0
        train_mc, train_gen = write_tasks(work / "train_tasks", 1000, seed=1)
        data = work / "chat.jsonl"
        data.write_text("".join(json.dumps(r) + "\n" for r in chat_rows(train_mc, train_gen)))
        t0 = time.perf_counter()
        assert cli(["finetune", "--from", str(base), "--data", str(data), "--out", str(work / "tuned"),
                    "--train.max_steps", str(args.finetune_steps), "--train.micro_batch_size", "8",
                    "--finetune.method", "full", "--train.lr", str(args.lr), "--train.warmup_steps", str(min(10, args.finetune_steps)), "--finetune.block_size", "128",
                    "--train.eval_interval", "0", "--train.tensorboard", "false", "--train.device", "cpu",
                    "--quiet"]) == 0
        seconds["finetune"] = time.perf_counter() - t0
        mc, gen = write_tasks(work / "eval_tasks", args.examples, seed=2)
        tasks = [str(mc), str(gen)]
        t0 = time.perf_counter()
        docs = {("base", "plain"): score(base, tasks, False), ("base", "chat"): score(base, tasks, True, "default"),
                ("tuned", "plain"): score(work / "tuned", tasks, False),
                ("tuned", "chat"): score(work / "tuned", tasks, True)}
        seconds["evaluate (4 scorings)"] = time.perf_counter() - t0
    print(f"CPU: {cpu_description()}; torch {torch.__version__}, {torch.get_num_threads()} threads")
    print(f"load average (1, 5, 15 min) at start {load_start}, at end {os.getloadavg()}")
    print("seconds: " + ", ".join(f"{k} {v:.0f}" for k, v in seconds.items()))
    print(f"gpt2-micro block 128: pretrain {args.pretrain_steps} steps, finetune (full) {args.finetune_steps} steps at lr {args.lr:g} x 8 "
          f"packed rows of 128 tokens; {args.examples} held-out items per task (4 options: chance 0.25)")
    print(f"{'model':6} {'scoring':6} {'colour_mc acc':>14} {'colour_gen exact_match':>23} {'CORE / ChatCORE':>16}")
    for (model, how), doc in docs.items():
        t = doc["tasks"]
        agg = doc["aggregate"]["chatcore" if how == "chat" else "core"]["value"]
        print(f"{model:6} {how:6} {t['colour_mc']['metrics']['acc']['value']:>14.3f} "
              f"{t['colour_gen']['metrics']['exact_match']['value']:>23.3f} {agg:>16.3f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

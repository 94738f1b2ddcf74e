"""Preference tuning shown to work, measured: DPO (`gptforge finetune --finetune.objective dpo`) on a
small SFT'd model, pairs whose chosen answer is a correct sum and whose rejected answer is off by
one; held-out implicit-reward accuracy and the share of correct greedy answers before and after;
the step time against TRL's `DPOTrainer` on the same model, rows and batch, in the same process.

    nice python bench/preference.py --seeds 1,2,3 [--steps 40] [--sft-steps 300] [--sweep | --timing 2]

Per seed (everything made here, nothing downloaded):
1. A byte-level tokenizer without merges (every digit, "+", "=" one token; EOS <|im_end|>) and a
   random Llama-shaped Hugging Face model (d_model 64, 2 layers, 4 heads, 2 KV heads).
2. SFT: `gptforge finetune --finetune.method full` on "a+b=" -> "s" rows (a < 100, 1 <= b <= 3),
   70% of the 300 problems, 8 rows each, where 60% of the completions are s+1: a systematic
   off-by-one error the SFT'd model learns (its greedy answers are mostly one too high).
3. Pairs on the SFT problems: {"prompt": "a+b=", "chosen": "s", "rejected": "s+1"} (TRL's plain
   format); held-out pairs on the other 30% of problems, which DPO never sees.
4. Before: on the held-out problems, the share of greedy answers (the SFT model, up to EOS) equal
   to the sum, and pref_acc (log p(chosen) > log p(rejected)). The implicit reward of the SFT
   model against itself is 0 for every pair, so its reward accuracy is 0 (TRL's strict >).
5. DPO (sigmoid, beta 0.1, full fine-tuning with the frozen reference copy), micro-batch 16 pairs,
   `--finetune.objective dpo` defaults for lr and warmup unless --lr is given. After: the same
   held-out figures, reward_acc against the SFT model (`gptforge evaluate --reference`).
6. TRL: the SFT run converted to Hugging Face (`gptforge convert --to-hf`), `trl.DPOTrainer` with
   the same pairs, batch (per_device_train_batch_size 16), lr, warmup, schedule, AdamW and fp32,
   the same number of steps, in this process with the same torch threads. Step time: the median
   over steps 3..N (the first steps warm allocators up) of gptforge's `step_seconds` in
   metrics.jsonl and of TRL's wall time between `on_step_begin` and `on_step_end` (its callback).

--sweep (item 6 of issue 43, the default lr): DPO from the SFT run (a model gptforge trained) and
from its Hugging Face export (the converted-HF path: a model loaded from an HF folder), lr in
3e-6 .. 3e-3, warmup 10% of the steps (and 0 at 1e-3); held-out reward accuracy and correct share.
--timing N: N back-to-back repeats of the step-time comparison on the first seed (ratios measured
within the same minute; absolute times on a shared machine swing with the other load).

Figures print as JSON lines and a markdown table (copied into bench/RESULTS.md by hand, the
machine named). Runs on the CPU (torch threads: --threads, default 2).
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import random
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path

import torch
import yaml

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

A_MAX, B_MAX = 100, 3  # problems a+b=, a in 0..A_MAX-1, b in 1..B_MAX
NOISE = 0.6  # share of SFT completions one too high (a systematic error the SFT'd model learns)
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")


def write_tokenizer(folder: Path) -> None:
    """Byte-level BPE with no merges: every byte one token, plus SPECIALS (EOS <|im_end|>)."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers

    vocab = {ch: i for i, ch in enumerate(SPECIALS)}
    for ch in pre_tokenizers.ByteLevel.alphabet():
        vocab.setdefault(ch, len(vocab))
    tok = Tokenizer(models.BPE(vocab=vocab, merges=[]))
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens(list(SPECIALS))
    folder.mkdir(parents=True, exist_ok=True)
    tok.save(str(folder / "tokenizer.json"))
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "pad_token": "<|im_end|>",
        "bos_token": None}))


def write_base(folder: Path, seed: int) -> Path:
    """A random Llama-shaped HF model (d_model 64, 2 layers) beside the tokenizer."""
    from tokenizers import Tokenizer
    from transformers import AutoModelForCausalLM, LlamaConfig

    write_tokenizer(folder)
    size = Tokenizer.from_file(str(folder / "tokenizer.json")).get_vocab_size(with_added_tokens=True)
    cfg = LlamaConfig(vocab_size=size, hidden_size=64, intermediate_size=172, num_hidden_layers=2,
                      num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=32, eos_token_id=2,
                      pad_token_id=2, tie_word_embeddings=True)
    torch.manual_seed(seed)
    AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
    return folder


def problems(seed: int) -> tuple[list[tuple[int, int]], list[tuple[int, int]]]:
    """(train, held-out) problems (a, b): a seeded 70/30 split of all A_MAX * B_MAX."""
    allp = [(a, b) for a in range(A_MAX) for b in range(1, B_MAX + 1)]
    random.Random(seed).shuffle(allp)
    cut = int(0.7 * len(allp))
    return allp[:cut], allp[cut:]


def write_jsonl(path: Path, rows: list[dict]) -> Path:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return path


def cli(*argv: str) -> None:
    """One gptforge command in this process, its console output swallowed."""
    from gptforge.cli import main

    with contextlib.redirect_stdout(io.StringIO()):
        code = main(list(argv))
    if code != 0:
        raise SystemExit(f"gptforge {' '.join(argv)} exited {code}")


def greedy_correct(run: Path, held: list[tuple[int, int]]) -> float:
    """Share of held-out problems whose greedy answer (up to EOS) is the sum."""
    from gptforge.data.chat import ChatTokenizer
    from gptforge.infer.generate import generate_batch
    from gptforge.runtime.loading import load_for_inference

    model, _, _, tok_path = load_for_inference(run)
    tok = ChatTokenizer.from_dir(tok_path)
    prompts = [tok.encode_text(f"{a}+{b}=") for a, b in held]
    outs = generate_batch(model, prompts, max_new_tokens=4, temperature=0.0, eos_id=tok.eos_id,
                          decode=lambda ids: tok.tokenizer.decode(ids))
    texts = [tok.tokenizer.decode([t for t in o.tokens if t != tok.eos_id]) for o in outs]
    return sum(t.strip() == str(a + b) for t, (a, b) in zip(texts, held, strict=True)) / len(held)


def pair_scores(run: Path, pairs: Path, reference: Path | None) -> dict[str, float]:
    """pref_acc (and reward_acc against `reference`) of `run` on the pair file, via gptforge evaluate."""
    from gptforge.cli import main

    argv = ["evaluate", str(run), "--tasks", str(pairs), "--json", "--quiet"]
    if reference is not None:
        argv += ["--reference", str(reference)]
    buf = io.StringIO()
    with contextlib.redirect_stdout(buf):
        assert main(argv) == 0
    metrics = json.loads(buf.getvalue())["tasks"][pairs.stem]["metrics"]
    return {k: float(v["value"] if isinstance(v, dict) else v) for k, v in metrics.items() if k.endswith("acc")}


def dpo(source: Path, pairs: Path, out: Path, steps: int, lr: float | None, warmup: int | None) -> list[dict]:
    """`gptforge finetune --finetune.objective dpo` (full, sigmoid, beta 0.1); its metrics rows."""
    argv = ["finetune", "--from", str(source), "--data", str(pairs), "--out", str(out), "--quiet",
            "--finetune.objective", "dpo", "--finetune.method", "full", "--finetune.val_fraction", "0",
            "--train.max_steps", str(steps), "--train.micro_batch_size", "16", "--train.precision", "fp32",
            "--train.device", "cpu", "--train.eval_interval", "0", "--train.compile", "false",
            "--train.seed", "0"]
    if lr is not None:
        argv += ["--train.lr", str(lr), "--train.min_lr", str(lr / 10)]
    if warmup is not None:
        argv += ["--train.warmup_steps", str(warmup)]
    cli(*argv)
    return [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines() if '"step_seconds"' in x]


def trl_step_seconds(hf: Path, pairs: Path, steps: int, lr: float, warmup: int, min_lr_ratio: float,
                     tmp: Path) -> list[float]:
    """Seconds of each optimizer step of TRL's DPOTrainer on the same rows and batch."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM, PreTrainedTokenizerFast, TrainerCallback
    from trl import DPOConfig, DPOTrainer

    times: list[float] = []

    class Clock(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            self.t0 = time.perf_counter()

        def on_step_end(self, args, state, control, **kw):
            times.append(time.perf_counter() - self.t0)

    rows = [json.loads(x) for x in pairs.read_text().splitlines()]
    args = DPOConfig(output_dir=str(tmp / "trl"), report_to=[], use_cpu=True, bf16=False, max_length=None,
                     per_device_train_batch_size=16, max_steps=steps, learning_rate=lr,
                     lr_scheduler_type="cosine_with_min_lr", lr_scheduler_kwargs={"min_lr_rate": min_lr_ratio},
                     warmup_steps=warmup, weight_decay=0.0, optim="adamw_torch", max_grad_norm=1.0,
                     logging_steps=10, save_strategy="no", disable_tqdm=True, seed=0, dataloader_num_workers=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        trainer = DPOTrainer(model=AutoModelForCausalLM.from_pretrained(hf, dtype=torch.float32), args=args,
                             train_dataset=Dataset.from_list(rows),
                             processing_class=PreTrainedTokenizerFast.from_pretrained(hf), callbacks=[Clock()])
        trainer.train()
    return times


def prepare(seed: int, tmp: Path, sft_steps: int) -> dict:
    """Base model, SFT run, its HF export, pair files of one seed."""
    rng = random.Random(seed)
    train, held = problems(seed)
    base = write_base(tmp / "base", seed)
    sft_rows = [{"prompt": f"{a}+{b}=", "completion": str(a + b + 1 if rng.random() < NOISE else a + b)}
                for _ in range(8) for a, b in train]
    rng.shuffle(sft_rows)
    sft = tmp / "sft"
    cli("finetune", "--from", str(base), "--data", str(write_jsonl(tmp / "sft.jsonl", sft_rows)), "--out", str(sft),
        "--quiet", "--finetune.method", "full", "--finetune.val_fraction", "0", "--finetune.block_size", "32",
        "--train.max_steps", str(sft_steps), "--train.micro_batch_size", "16", "--train.lr", "3e-3",
        "--train.min_lr", "3e-4", "--train.warmup_steps", "30", "--train.precision", "fp32", "--train.device", "cpu",
        "--train.eval_interval", "0", "--train.compile", "false", "--train.seed", str(seed))
    hf = tmp / "sft_hf"
    cli("convert", "--to-hf", str(sft), "--out", str(hf))

    def pair_rows(probs):
        return [{"prompt": f"{a}+{b}=", "chosen": str(a + b), "rejected": str(a + b + 1)}
                for a, b in probs]

    return {"train": train, "held": held, "sft": sft, "hf": hf,
            "pairs": write_jsonl(tmp / "pairs.jsonl", pair_rows(train)),
            "held_pairs": write_jsonl(tmp / "heldout.jsonl", pair_rows(held))}


def prepared(seed: int, folder: Path) -> dict:
    """What `prepare` made for `seed` in `folder` (an earlier run's, e.g. a --sweep's kept folder)."""
    train, held = problems(seed)
    return {"train": train, "held": held, "sft": folder / "sft", "hf": folder / "sft_hf",
            "pairs": folder / "pairs.jsonl", "held_pairs": folder / "heldout.jsonl"}


def run_seed(seed: int, steps: int, sft_steps: int, lr: float | None, trl: bool, reuse: Path | None = None) -> dict:
    torch.manual_seed(seed)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        p = prepare(seed, tmp, sft_steps) if reuse is None else prepared(seed, reuse)
        out = {"seed": seed, "before_correct": greedy_correct(p["sft"], p["held"]),
               "before_pref_acc": pair_scores(p["sft"], p["held_pairs"], None)["pref_acc"]}
        rows = dpo(p["sft"], p["pairs"], tmp / "dpo", steps, lr, None)
        after = pair_scores(tmp / "dpo", p["held_pairs"], p["sft"])
        train_cfg = yaml.safe_load((tmp / "dpo" / "config.yaml").read_text())["train"]
        out.update(after_correct=greedy_correct(tmp / "dpo", p["held"]), after_pref_acc=after["pref_acc"],
                   after_reward_acc=after["reward_acc"], lr=train_cfg["lr"], warmup=train_cfg["warmup_steps"],
                   ours_step_s=statistics.median(r["step_seconds"] for r in rows[2:]))
        if trl:
            t = trl_step_seconds(p["hf"], p["pairs"], steps, train_cfg["lr"], train_cfg["warmup_steps"],
                                 train_cfg["min_lr"] / train_cfg["lr"], tmp)
            out["trl_step_s"] = statistics.median(t[2:])
        return out


def timing(seed: int, steps: int, sft_steps: int, lr: float | None, repeats: int, reuse: Path | None) -> list[dict]:
    """Step time of gptforge then TRL, back to back, `repeats` times on one seed's SFT model: on a
    shared machine only ratios measured within the same minute mean anything."""
    res = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        p = prepare(seed, tmp, sft_steps) if reuse is None else prepared(seed, reuse)
        for rep in range(repeats):
            rows = dpo(p["sft"], p["pairs"], tmp / f"dpo{rep}", steps, lr, None)
            train_cfg = yaml.safe_load((tmp / f"dpo{rep}" / "config.yaml").read_text())["train"]
            ours = statistics.median(r["step_seconds"] for r in rows[2:])
            trl = statistics.median(trl_step_seconds(p["hf"], p["pairs"], steps, train_cfg["lr"],
                                                     train_cfg["warmup_steps"], 0.1, tmp / f"t{rep}")[2:])
            res.append({"source": "timing", "rep": rep, "ours_step_s": ours, "trl_step_s": trl, "ratio": trl / ours})
            print(json.dumps(res[-1]), flush=True)
    return res


def sweep(seed: int, steps: int, sft_steps: int) -> list[dict]:
    """Held-out reward accuracy and correct share after `steps` DPO steps for each lr and warmup,
    from the gptforge SFT run and from its HF export."""
    res = []
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        p = prepare(seed, tmp, sft_steps)
        res.append({"source": "sft", "correct": greedy_correct(p["sft"], p["held"]),
                    "pref_acc": pair_scores(p["sft"], p["held_pairs"], None)["pref_acc"]})
        print(json.dumps(res[-1]), flush=True)
        w = steps // 10
        grid = [("run", 3e-6, w), ("run", 1e-5, w), ("run", 3e-5, w), ("run", 1e-4, w), ("run", 3e-4, w),
                ("run", 1e-3, w), ("run", 1e-3, 0), ("run", 3e-3, w), ("hf", 1e-4, w), ("hf", 1e-3, w)]
        for source, lr, warm in grid:
                    out = tmp / f"{source}-{lr}-{warm}"
                    dpo(p["sft"] if source == "run" else p["hf"], p["pairs"], out, steps, lr, warm)
                    s = pair_scores(out, p["held_pairs"], p["sft"])
                    res.append({"source": source, "lr": lr, "warmup": warm, "reward_acc": s["reward_acc"],
                                "correct": greedy_correct(out, p["held"])})
                    print(json.dumps(res[-1]), flush=True)
    return res


def table(res: list[dict], sweep_mode: bool) -> str:
    """The figures as a markdown table (mean over seeds in the last row)."""
    if sweep_mode:
        lines = ["| DPO from | lr | warmup | held-out reward_acc | held-out correct |", "|---|---|---|---|---|"]
        for r in res:
            if r["source"] == "sft":
                lines.append(f"| (SFT model, before) | | | pref_acc {r['pref_acc']:.3f} | {r['correct']:.3f} |")
            else:
                lines.append(f"| {r['source']} | {r['lr']:g} | {r['warmup']} | {r['reward_acc']:.3f} | "
                             f"{r['correct']:.3f} |")
        return "\n".join(lines)
    cols = ["before_correct", "after_correct", "before_pref_acc", "after_pref_acc", "after_reward_acc",
            "ours_step_s", "trl_step_s"]
    lines = ["| seed | lr | warmup | " + " | ".join(cols) + " | TRL / ours | CPU s |",
             "|" + "---|" * (len(cols) + 5)]
    for r in res + [{"seed": "mean", **{k: statistics.mean(x[k] for x in res) for k in [*cols, "cpu_s"]
                                        if all(k in x for x in res)}}]:
        ratio = f"{r['trl_step_s'] / r['ours_step_s']:.2f}x" if "trl_step_s" in r else ""
        lines.append(f"| {r['seed']} | {r.get('lr', '')} | {r.get('warmup', '')} | "
                     + " | ".join(f"{r[k]:.3f}" if k in r else "" for k in cols)
                     + f" | {ratio} | {r.get('cpu_s', 0):.0f} |")
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--steps", type=int, default=120, help="DPO optimizer steps")
    ap.add_argument("--sft-steps", type=int, default=300)
    ap.add_argument("--lr", type=float, default=None, help="DPO lr (default: the objective's default)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--no-trl", action="store_true")
    ap.add_argument("--sweep", action="store_true", help="the lr/warmup sweep instead (first seed)")
    ap.add_argument("--timing", type=int, default=0, metavar="N",
                    help="N back-to-back gptforge/TRL step-time repeats instead (first seed)")
    ap.add_argument("--json", type=Path, default=None, help="also write the raw figures here")
    ap.add_argument("--reuse", type=Path, default=None,
                    help="a folder holding the first seed's base, SFT run and pairs (from an earlier run): no SFT")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    seeds = [int(s) for s in args.seeds.split(",")]
    if args.sweep:
        res = sweep(seeds[0], args.steps, args.sft_steps)
    elif args.timing:
        res = timing(seeds[0], args.steps, args.sft_steps, args.lr, args.timing, args.reuse)
    else:
        res = []
        for s in seeds:
            t0 = time.process_time()
            res.append(run_seed(s, args.steps, args.sft_steps, args.lr, not args.no_trl,
                                args.reuse if s == seeds[0] else None))
            res[-1]["cpu_s"] = time.process_time() - t0
            print(json.dumps(res[-1]), flush=True)
    if not args.timing:
        print(table(res, args.sweep))
    if args.json:
        args.json.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()

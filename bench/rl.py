"""RL with a verifiable reward, measured: chat addition, a small SFT'd model, pass@1 before and after.

Task "chat-addition": a user turn `What is A+B?`, the operands' digit counts drawn uniformly from
--kinds (default 2+2, 2+3, 3+3: two- and three-digit addition; 2+3 in either order), the operands
uniform; the answer `A+B`; the reward is `--reward exact` (gptforge.eval.answers).
Three disjoint sets of problems per seed: SFT rows (the assistant turn is the sum), RL prompts,
held-out prompts.

Per seed: a tiny random Qwen2 (--width, --layers; ChatML, a byte-level BPE that keeps digits one
token each), `gptforge finetune` for --sft-steps (deliberately short, so that the model adds some
problems right and has room to improve), then `gptforge rl` for --rl-steps. Held-out pass@1
(greedy, exact) before RL is measured on the SFT run, after RL on the RL run, with the same code
(gptforge.train.rl.heldout.evaluate_prompts). Printed per seed: pass@1 before / after, the reward
curve (mean training reward per block of steps), generation tokens/s, training tokens/s, the share
of step time spent sampling, wall and CPU minutes.

    nice python bench/rl.py --seeds 0,1,2 --write     # the figures into bench/RESULTS.md

--write appends a section to bench/RESULTS.md (atomically) naming the CPU and load.
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

CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content'] + "
    "'<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}{% endif %}"
)
SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]


def problems(seed: int, n: int, taken: set, kinds: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """`n` distinct (a, b) pairs not in `taken` (which grows); each pair's operand digit counts are
    drawn uniformly from `kinds` (e.g. (2, 3): a two-digit and a three-digit operand, either order)."""
    space = sum(9 * 10 ** (a - 1) * 9 * 10 ** (b - 1) * (1 if a == b else 2) for a, b in set(kinds))
    if len(taken) + n > space:
        raise SystemExit(f"--kinds {kinds}: {space} distinct problems, too few for {len(taken) + n} rows; ask for fewer")
    rng = random.Random(seed)
    out = []
    while len(out) < n:
        da, db = rng.choice(kinds)
        if rng.random() < 0.5:
            da, db = db, da
        p = (rng.randint(10 ** (da - 1), 10 ** da - 1), rng.randint(10 ** (db - 1), 10 ** db - 1))
        if p not in taken:
            taken.add(p)
            out.append(p)
    return out


def parse_kinds(text: str) -> list[tuple[int, int]]:
    """"2+2,2+3" -> [(2, 2), (2, 3)]."""
    return [(int(k.split("+")[0]), int(k.split("+")[1])) for k in text.split(",")]


def write_task(folder: Path, seed: int, n_sft: int, n_rl: int, n_val: int,
               kinds: list[tuple[int, int]]) -> dict[str, Path]:
    """The task's three jsonl files (SFT messages with the answer turn; RL and held-out prompts)."""
    taken: set = set()
    sft, rl, val = (problems(seed * 1000 + k, n, taken, kinds) for k, n in enumerate((n_sft, n_rl, n_val)))

    def user(a, b):
        return {"role": "user", "content": f"What is {a}+{b}?"}
    files = {
        "sft": [{"messages": [user(a, b), {"role": "assistant", "content": str(a + b)}]} for a, b in sft],
        "rl": [{"messages": [user(a, b)], "answer": str(a + b)} for a, b in rl],
        "val": [{"messages": [user(a, b)], "answer": str(a + b)} for a, b in val],
    }
    folder.mkdir(parents=True, exist_ok=True)
    paths = {}
    for name, rows in files.items():
        paths[name] = folder / f"{name}.jsonl"
        paths[name].write_text("".join(json.dumps(r) + "\n" for r in rows))
    return paths


def make_model(folder: Path, seed: int, width: int, layers: int, texts: list[str]) -> Path:
    """A random Qwen2 with a ChatML byte-level BPE (digits split one per token) in `folder`."""
    import torch
    import transformers
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    folder.mkdir(parents=True, exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=True),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False)])
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(vocab_size=320, special_tokens=SPECIALS,
                                                       initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(str(folder / "tokenizer.json"))
    eos = tok.token_to_id("<|im_end|>")
    (folder / "tokenizer_config.json").write_text(json.dumps({
        "tokenizer_class": "PreTrainedTokenizerFast", "eos_token": "<|im_end|>", "bos_token": None,
        "chat_template": CHATML}))
    torch.manual_seed(seed)
    cfg = transformers.Qwen2Config(vocab_size=tok.get_vocab_size(), hidden_size=width, intermediate_size=4 * width,
                                   num_hidden_layers=layers, num_attention_heads=max(1, width // 32),
                                   num_key_value_heads=max(1, width // 32), max_position_embeddings=64,
                                   tie_word_embeddings=True, eos_token_id=eos)
    transformers.AutoModelForCausalLM.from_config(cfg).save_pretrained(folder)
    (folder / "generation_config.json").write_text(json.dumps({"eos_token_id": eos}))
    return folder


def heldout_pass1(run: Path, val: Path) -> float:
    """Greedy exact pass@1 of the model in `run` on the prompts of `val` (as the RL run's evaluation)."""
    import torch

    from gptforge.eval.prompts import read_prompts
    from gptforge.eval.rewards import parse_reward
    from gptforge.runtime.loading import load_pretrained
    from gptforge.train.rl.heldout import evaluate_prompts
    from gptforge.train.workflows.finetune import load_chat_tokenizer

    model, _ = load_pretrained(run, dtype=torch.float32)
    model.eval()
    tok = load_chat_tokenizer(run)
    rewards = [parse_reward("exact")]
    rows = read_prompts(val, tok, rewards)
    m = evaluate_prompts(model, rows, rewards, 8, tok.eos_id,
                         lambda ids: tok.tokenizer.decode(ids, skip_special_tokens=False), batch_size=50)
    return m["pass@1"]


def one_seed(args, seed: int, work: Path) -> dict:
    from gptforge.cli import main as cli
    from gptforge.train.loggers import read_metrics

    paths = write_task(work / "task", seed, args.sft_rows, args.rl_rows, args.val_rows, parse_kinds(args.kinds))
    texts = [line for p in paths.values() for line in p.read_text().splitlines()]
    hf = make_model(work / "init", seed, args.width, args.layers, texts)
    common = ["--train.device", "cpu", "--train.tensorboard", "false", "--train.seed", str(seed), "--quiet"]
    t0, c0 = time.time(), time.process_time()
    sft = work / "sft"
    rc = cli(["finetune", "--from", str(hf), "--data", str(paths["sft"]), "--out", str(sft), *common,
              "--finetune.method", "full", "--train.max_steps", str(args.sft_steps), "--train.lr", str(args.sft_lr),
              "--train.micro_batch_size", "32", "--train.warmup_steps", "20", "--train.eval_interval",
              str(args.sft_steps), "--finetune.val_fraction", "0.02"])
    if rc:
        raise SystemExit(f"seed {seed}: finetune failed ({rc})")
    t_sft, c_sft = time.time() - t0, time.process_time() - c0
    before = heldout_pass1(sft, paths["val"])
    t1, c1 = time.time(), time.process_time()
    run = work / "rl"
    rc = cli(["rl", "--from", str(sft), "--prompts", str(paths["rl"]), "--reward", "exact", "--out", str(run),
              *common, "--rl.samples_per_prompt", str(args.samples), "--rl.prompts_per_step", str(args.prompts),
              "--rl.max_new_tokens", "8", "--rl.temperature", str(args.rl_temperature), "--rl.kl_beta", "0",
              "--rl.eval_prompts", str(paths["val"]), "--train.eval_interval", str(args.eval_interval),
              "--train.max_steps", str(args.rl_steps), "--train.lr", str(args.rl_lr),
              "--finetune.method", args.rl_method, "--train.micro_batch_size", str(args.samples * args.prompts),
              *args.rl_extra])
    if rc:
        raise SystemExit(f"seed {seed}: rl failed ({rc})")
    t_rl, c_rl = time.time() - t1, time.process_time() - c1
    all_rows = read_metrics(run)
    evals = [(r["step"], r["eval/pass@1"]) for r in all_rows if "eval/pass@1" in r]
    after = heldout_pass1(run, paths["val"])  # as `before` (fp32); the run's own evaluations ran under its autocast
    rows = [r for r in all_rows if "rl/reward_mean" in r]
    block = max(1, len(rows) // 5)
    curve = [sum(r["rl/reward_mean"] for r in rows[i:i + block]) / len(rows[i:i + block])
             for i in range(0, len(rows), block)]
    sampled = [r for r in rows if "rl/sampling_seconds" in r]
    sampling_s = sum(r["rl/sampling_seconds"] for r in sampled)
    gen_tps = sum(r["rl/sampled_tokens"] for r in sampled) / max(1e-9, sampling_s)
    train_tps = sorted(r["tokens_per_second"] for r in rows)[len(rows) // 2]
    step_s = sum(r["step_seconds"] for r in rows)
    return {"seed": seed, "before": before, "after": after, "evals": evals,
            "curve": curve, "block": block, "gen_tps": gen_tps, "train_tps": train_tps,
            "sampling_share": sampling_s / max(1e-9, step_s), "sft_min": t_sft / 60, "sft_cpu_min": c_sft / 60,
            "rl_min": t_rl / 60, "rl_cpu_min": c_rl / 60}


def lines(args, results: list[dict], header: str) -> list[str]:
    out = [header, "",
           f"Task chat-addition (A+B, operand digits {args.kinds} (either order) drawn uniformly, `--reward exact`); Qwen2 width {args.width}, "
           f"{args.layers} layers; SFT {args.sft_steps} steps (lr {args.sft_lr}, batch 32, {args.sft_rows} rows); "
           f"RL {args.rl_steps} steps, {args.prompts} prompts x {args.samples} samples, lr {args.rl_lr}, "
           f"max_new_tokens 8, temperature {args.rl_temperature}, {args.rl_method}, kl_beta 0 {' '.join(args.rl_extra)}; "
           f"held-out pass@1 greedy on "
           f"{args.val_rows} problems.", "",
           "| seed | pass@1 before | after | change | held-out pass@1 (step) | train reward (mean per block of steps) | gen tok/s | "
           "train tok/s | sampling share of step time | SFT min (CPU) | RL min (CPU) |",
           "| --- | --- | --- | --- | --- | --- | --- | --- | --- | --- | --- |"]
    for r in results:
        out.append(f"| {r['seed']} | {r['before']:.3f} | {r['after']:.3f} | {100 * (r['after'] - r['before']):+.1f} pts | "
                   f"{', '.join(f'{v:.3f} ({k})' for k, v in r['evals'])} | "
                   f"{' -> '.join(f'{x:.2f}' for x in r['curve'])} ({r['block']} steps) | {r['gen_tps']:.0f} | "
                   f"{r['train_tps']:.0f} | {r['sampling_share']:.2f} | {r['sft_min']:.1f} ({r['sft_cpu_min']:.1f}) | "
                   f"{r['rl_min']:.1f} ({r['rl_cpu_min']:.1f}) |")
    if results:
        d = [100 * (r["after"] - r["before"]) for r in results]
        out.append("")
        out.append(f"Mean change {sum(d) / len(d):+.1f} points over {len(d)} seed(s).")
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="0,1,2")
    ap.add_argument("--kinds", default="1+1,1+2", help="operand digit counts, drawn uniformly per problem")
    ap.add_argument("--width", type=int, default=64)
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--sft-rows", type=int, default=800)
    ap.add_argument("--rl-rows", type=int, default=500)
    ap.add_argument("--val-rows", type=int, default=200)
    ap.add_argument("--sft-steps", type=int, default=600)
    ap.add_argument("--sft-lr", type=float, default=3e-3)
    ap.add_argument("--rl-steps", type=int, default=80)
    ap.add_argument("--rl-lr", type=float, default=2e-3)
    ap.add_argument("--samples", type=int, default=8)
    ap.add_argument("--prompts", type=int, default=16)
    ap.add_argument("--rl-temperature", type=float, default=0.7)
    ap.add_argument("--rl-method", default="lora", choices=["full", "lora"])
    ap.add_argument("--eval-interval", type=int, default=20, help="RL steps between held-out evaluations")
    ap.add_argument("--rl-extra", nargs="*", default=[], help="more gptforge rl flags, e.g. --rl.updates_per_batch 2")
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--work", default=None, help="folder for the runs (default: a temporary one)")
    ap.add_argument("--write", action="store_true", help="append the figures to bench/RESULTS.md")
    args = ap.parse_args()

    import torch

    torch.set_num_threads(args.threads)
    load0 = os.getloadavg()[0]
    header = (f"## RL with a verifiable reward: GRPO/DAPO on chat addition (issue 37)\n\nCPU: {cpu_description()}; torch {torch.__version__}; "
              f"threads {args.threads}; load average at start {load0:.1f}; {time.strftime('%Y-%m-%d', time.gmtime())}.")
    work = Path(args.work or tempfile.mkdtemp(prefix="bench_rl_"))
    results = []
    for seed in (int(s) for s in args.seeds.split(",")):
        r = one_seed(args, seed, work / f"seed{seed}")
        results.append(r)
        print(json.dumps(r), flush=True)
    text = "\n".join(lines(args, results, header)) + "\n"
    print(text)
    if args.write:
        from gptforge.atomic import atomic_write_text

        path = Path(__file__).with_name("RESULTS.md")
        atomic_write_text(path, path.read_text().rstrip("\n") + "\n\n" + text)


if __name__ == "__main__":
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    main()

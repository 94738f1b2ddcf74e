"""train.document_mask on a corpus of short documents: its cost in tokens per CPU second and its
effect on val bits per byte at equal CPU seconds.

    python bench/document_mask.py --seeds 1,2,3 --cpu-seconds 120

Corpus: every docstring (module, class, function) of the Python standard library's source files
(gptforge.data.stdlib_corpus; test suites left out), one docstring one document, exact duplicates
and docstrings under --min-chars dropped: short documents, so a packed window of 256 tokens holds
several and attention crosses document boundaries unless masked. Prepared with
`gptforge.data.prepare` (recipe none, vocabulary 4096, 5% val), in a temporary folder.

Model: the quickstart size (modern-micro: Llama family, 4 layers, d_model 128, block 256), batch
16, AdamW with the size-aware defaults, fp32, one thread, no compile. For each variant (mask off /
on), a probe of --probe-steps bare optimizer steps (twice, alternating, the faster kept) measures
CPU seconds per step; max_steps = --cpu-seconds / that, so both variants get the same CPU budget with a complete
schedule; then `gptforge.train.run.train` runs and its CPU seconds (getrusage user + system of
this process around the call) are printed. Val bits per byte: every val token scored once in
disjoint windows of 256 (`evaluate_tokens`), under the mask and without it, for both variants:
"own" is the evaluation each variant trains for (the masked one for mask on).
"""

from __future__ import annotations

import argparse
import ast
import json
import resource
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from machine import cpu_description  # noqa: E402


def cpu_seconds() -> float:
    """User + system CPU seconds of this process so far."""
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


def docstrings(min_chars: int) -> list[str]:
    """Unique docstrings of the standard library's source files, in file order."""
    from gptforge.data.stdlib_corpus import stdlib_files

    seen, out = set(), []
    for path in stdlib_files():
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError):
            continue
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc) >= min_chars and doc not in seen:
                    seen.add(doc)
                    out.append(doc)
    return out


def prepare_corpus(work: Path, min_chars: int) -> Path:
    from gptforge.data.prepare import PrepareConfig, prepare

    docs = docstrings(min_chars)
    src = work / "docstrings.jsonl"
    src.write_text("".join(json.dumps({"text": d}) + "\n" for d in docs), encoding="utf-8")
    out = work / "data"
    prepare(PrepareConfig(inputs=[str(src)], out=str(out), vocab_size=4096, val_fraction=0.05, recipe="none",
                          seed=1337, workers=1, overwrite=True), show_progress=False)
    return out


def probe_step_seconds(data: Path, cfg, steps: int) -> float:
    """CPU seconds per bare optimizer step (forward, backward, AdamW) of this config's batches."""
    from gptforge.model.gpt import GPT
    from gptforge.runtime.loss import count_targets
    from gptforge.train.sources import ShardSource
    from gptforge.train.step import forward_backward

    torch.manual_seed(0)
    model = GPT(cfg.model.resolved())
    opt = torch.optim.AdamW(model.parameters(), lr=1e-3)
    src = ShardSource(data)
    batches = src.batches(cfg.model.block_size, cfg.train, 0, 1)
    for step in range(steps + 2):
        if step == 2:  # the first steps allocate
            t0 = cpu_seconds()
        micro = batches.micro_batches(step)
        forward_backward(model, micro, count_targets(micro), torch.device("cpu"))
        opt.step()
        opt.zero_grad(set_to_none=True)
    src.close()
    return (cpu_seconds() - t0) / steps


def val_bits_per_byte(run_dir: Path, data: Path) -> dict[str, float]:
    from gptforge.data.loader import TokenStream
    from gptforge.data.shards import load_meta
    from gptforge.eval.perplexity import evaluate_tokens
    from gptforge.runtime.loading import load_for_inference

    meta = load_meta(data)
    val = meta["splits"]["val"]
    stream = TokenStream([data / f for f in val["files"]], meta["dtype"])
    tokens = stream.read(0, stream.num_tokens)
    stream.close()
    model, _ckpt, _doc, _tok = load_for_inference(run_dir, "cpu")
    out = {}
    for name, eos in (("masked", int(meta["eos_id"])), ("unmasked", None)):
        r = evaluate_tokens(model, tokens, n_bytes=val["bytes"], stride=model.config.block_size,
                            document_mask_eos=eos)
        out[name] = r.bits_per_byte
    return out


def run_config(data: Path, seed: int, masked: bool, max_steps: int = 1000):
    from gptforge.config import ModelConfig, RunConfig, TrainConfig
    from gptforge.data.shards import load_meta

    tc = TrainConfig(max_steps=max_steps, micro_batch_size=16, optimizer="adamw", precision="fp32", compile=False,
                     seed=seed, eval_interval=0, checkpoint_interval=0, tensorboard=False, report=False,
                     spike_alarms=False, num_threads=1, document_mask=masked)
    vocab = load_meta(data)["vocab_size"]
    return RunConfig(model=ModelConfig(preset="modern-micro", block_size=256, vocab_size=vocab), train=tc)


def one_run(data: Path, work: Path, seed: int, masked: bool, budget: float, per_step: float) -> dict:
    from gptforge.train.run import train

    steps = max(20, int(budget / per_step))
    cfg = run_config(data, seed, masked, steps)
    run_dir = work / f"run_s{seed}_{'mask' if masked else 'plain'}"
    load0, c0, w0 = Path("/proc/loadavg").read_text().split()[0], cpu_seconds(), time.perf_counter()
    train(cfg, data, run_dir, progress=False, log=lambda m: None)
    cpu, wall = cpu_seconds() - c0, time.perf_counter() - w0
    tokens = steps * 16 * 256
    bpb = val_bits_per_byte(run_dir, data)
    return {"seed": seed, "document_mask": masked, "probe_cpu_s_per_step": per_step, "steps": steps,
            "train_cpu_s": cpu, "train_wall_s": wall, "tokens_per_cpu_second": tokens / cpu,
            "val_bpb_masked_eval": bpb["masked"], "val_bpb_unmasked_eval": bpb["unmasked"],
            "val_bpb_own_eval": bpb["masked" if masked else "unmasked"], "loadavg_1min_at_start": load0}


def summary(rows: list[dict]) -> None:
    print("\n| variant | probe CPU s/step | steps | train CPU s | tokens per CPU s | val bpb (own eval) "
          "| val bpb (masked eval) | val bpb (unmasked eval) |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|")
    for masked in (False, True):
        rs = [r for r in rows if r["document_mask"] == masked]

        def m(key, fmt, rs=rs):
            vals = [r[key] for r in rs]
            spread = f" ± {statistics.stdev(vals):{fmt}}" if len(vals) > 1 else ""
            return f"{statistics.mean(vals):{fmt}}{spread}"

        print(f"| document_mask {'on' if masked else 'off'} | {m('probe_cpu_s_per_step', '.3f')} | "
              f"{m('steps', '.0f')} | {m('train_cpu_s', '.0f')} | {m('tokens_per_cpu_second', ',.0f')} | "
              f"{m('val_bpb_own_eval', '.4f')} | {m('val_bpb_masked_eval', '.4f')} | {m('val_bpb_unmasked_eval', '.4f')} |")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", default="1,2,3")
    ap.add_argument("--cpu-seconds", type=float, default=60.0, help="training CPU budget of each run")
    ap.add_argument("--probe-steps", type=int, default=6)
    ap.add_argument("--min-chars", type=int, default=40)
    args = ap.parse_args()
    torch.set_num_threads(1)
    print(f"machine: {cpu_description()}; torch {torch.__version__}; loadavg {Path('/proc/loadavg').read_text().strip()}")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        data = prepare_corpus(work, args.min_chars)
        meta = json.loads((data / "meta.json").read_text())
        sp = meta["splits"]
        print(f"corpus: {sp['train']['documents']:,} train / {sp['val']['documents']:,} val docstrings, "
              f"{sp['train']['tokens']:,} / {sp['val']['tokens']:,} tokens "
              f"({sp['train']['tokens'] / max(1, sp['train']['documents']):.0f} tokens per document)")
        # One probe per variant, alternated twice (the faster kept), sizes every seed's run.
        probes = {False: [], True: []}
        for _ in range(2):
            for masked in (False, True):
                probes[masked].append(probe_step_seconds(data, run_config(data, 0, masked), args.probe_steps))
        per_step = {k: min(v) for k, v in probes.items()}
        print(f"probe CPU s/step: off {probes[False]}, on {probes[True]}")
        for seed in [int(s) for s in args.seeds.split(",")]:
            for masked in (False, True):
                row = one_run(data, work, seed, masked, args.cpu_seconds, per_step[masked])
                rows.append(row)
                print(json.dumps(row), flush=True)
    summary(rows)
    print(f"loadavg at the end: {Path('/proc/loadavg').read_text().strip()}")


if __name__ == "__main__":
    main()

"""Compression headline (issue 13): prune + distil beats training the same shape from scratch?

On tinyshakespeare (../shared/data; the Python standard library's text when it is missing),
BPE vocabulary 1024:
1. train a teacher (Llama blocks with GQA) with gptforge's trainer;
2. quantize it: int8 and int4 (--group-size, default 64: it must divide d_model) with `gptforge.export.quantize.quantize_run`:
   val perplexity change, bytes, forward time;
3. prune it to about half its parameters (`prune_run --target-params`), then for --student-steps
   steps of the same batches train three students per seed: the pruned model distilled from the
   teacher (`gptforge.train.workflows.distill.distill_loss_sum`, alpha 0, T 1: pure forward KL as Minitron),
   the pruned model with plain cross-entropy, and the same shape from random init with
   cross-entropy;
4. print val loss (nats/token over the first --eval-tokens val tokens) mean and spread over seeds.

The student loop is a plain AdamW loop here (the trainer's distillation wiring is separate).

    python bench/compress.py [--teacher-steps 600] [--student-steps 200] [--seeds 3] [--d-model 64]
"""

from __future__ import annotations

import argparse
import math
import statistics
import sys
import tempfile
import time
from pathlib import Path

from machine import cpu_description  # bench/machine.py

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))




def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--teacher-steps", type=int, default=600)
    ap.add_argument("--student-steps", type=int, default=200)
    ap.add_argument("--seeds", type=int, default=3)
    ap.add_argument("--batch", type=int, default=8)
    ap.add_argument("--lr", type=float, default=2e-3)
    ap.add_argument("--eval-tokens", type=int, default=32768)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--d-model", type=int, default=64)
    ap.add_argument("--d-ff", type=int, default=192)
    ap.add_argument("--block", type=int, default=64)
    ap.add_argument("--group-size", type=int, default=64, help="int4 group size (must divide d_model and d_ff)")
    args = ap.parse_args()

    import numpy as np
    import torch

    from gptforge.config import ModelConfig, RunConfig, TrainConfig
    from gptforge.data.prepare import PrepareConfig, prepare
    from gptforge.eval.perplexity import evaluate_tokens
    from gptforge.export.calibration import read_split
    from gptforge.export.prune import prune_run
    from gptforge.export.quantize import quantize_run
    from gptforge.model.gpt import GPT
    from gptforge.model.quant import QuantSpec
    from gptforge.runtime.loading import load_for_inference
    from gptforge.runtime.loss import token_loss_sum
    from gptforge.train.run import train
    from gptforge.train.workflows.distill import Teacher, distill_loss_sum

    torch.set_num_threads(args.threads)
    t_start = time.time()
    print(f"CPU: {cpu_description()}; torch {torch.__version__}, {args.threads} threads (shared, loaded machine)")
    work = Path(tempfile.mkdtemp(prefix="gptforge-compress-"))
    src = REPO.parent / "shared" / "data" / "tinyshakespeare.txt"
    if src.exists():
        # One document per ~20 kB slice (cut at blank lines), so that prepare's document-level
        # val split has documents to hold out.
        text, parts, cur = src.read_text(), [], []
        for para in text.split("\n\n"):
            cur.append(para)
            if sum(map(len, cur)) > 20000:
                parts.append("\n\n".join(cur))
                cur = []
        parts.append("\n\n".join(cur))
        (work / "docs").mkdir()
        inputs = []
        for i, part in enumerate(parts):
            (work / "docs" / f"{i:03d}.txt").write_text(part)
            inputs.append(str(work / "docs" / f"{i:03d}.txt"))
        corpus = f"tinyshakespeare ({len(parts)} documents)"
    else:
        from gptforge.data.stdlib_corpus import stdlib_files

        inputs, corpus = [str(p) for p in stdlib_files()[:150]], "standard library (150 files)"
    data = work / "data"
    prepare(PrepareConfig(inputs=inputs, out=str(data), vocab_size=1024, val_fraction=0.1, workers=1),
            show_progress=False)
    mc = ModelConfig(arch="llama", n_layer=4, n_head=4, n_kv_head=2, d_model=args.d_model, d_ff=args.d_ff,
                     block_size=args.block)
    tc = TrainConfig(max_steps=args.teacher_steps, micro_batch_size=args.batch, lr=3e-3, min_lr=3e-4,
                     warmup_steps=30, eval_interval=0, checkpoint_interval=0, tensorboard=False, seed=0)
    t0 = time.time()
    train(RunConfig(model=mc, train=tc), data, work / "teacher", progress=False)
    teacher_model, _, doc, _ = load_for_inference(work / "teacher", "cpu")
    val = read_split(data, "val", args.eval_tokens + 1)

    def val_loss(model) -> float:
        return evaluate_tokens(model, val, stride=model.config.block_size, batch_size=8).loss

    t_loss = val_loss(teacher_model)
    print(f"corpus {corpus}; teacher {teacher_model.num_params():,} params, {args.teacher_steps} steps x "
          f"{args.batch}x{mc.block_size} tokens in {time.time() - t0:.0f} s; val loss {t_loss:.4f}")

    for method in ("int8", "int4"):
        r = quantize_run(work / "teacher", QuantSpec(method, group_size=args.group_size), work / f"q_{method}", data,
                         max_eval_tokens=args.eval_tokens)
        print(f"{method}: val ppl {r['before']['eval']['perplexity']:.3f} -> {r['after']['eval']['perplexity']:.3f} "
              f"({r['perplexity_change_percent']:+.2f}%), {r['bits_per_weight_quantized_layers']:.2f} bits/weight in "
              f"the block linears, tensors {r['before']['bytes']:,} -> {r['after']['bytes']:,} B, on disk "
              f"{r['before']['disk_bytes']:,} -> {r['after']['disk_bytes']:,} B, forward "
              f"{r['before']['forward_ms']:.1f} -> {r['after']['forward_ms']:.1f} ms (4x{args.block} tokens)"
              + (f", group size {args.group_size}" if method == "int4" else ""))

    target = teacher_model.num_params() // 2
    rep = prune_run(work / "teacher", work / "pruned", data, target_params=target, num_batches=8)
    pruned_model, *_ = load_for_inference(work / "pruned", "cpu")
    print(f"pruned to {rep['params_after']:,} params (target {target:,}): heads {rep['n_head']} (kv "
          f"{rep['n_kv_head']}), d_ff {rep['d_ff']}, d_model {rep['d_model']}; val loss before any training "
          f"{val_loss(pruned_model):.4f}")
    teacher = Teacher(teacher_model)
    train_tokens = read_split(data, "train", None)
    T = mc.block_size
    n_tokens = args.student_steps * args.batch * T

    def run_student(kind: str, seed: int) -> float:
        torch.manual_seed(seed)
        if kind == "scratch":
            model = GPT(pruned_model.config)
        else:
            model, *_ = load_for_inference(work / "pruned", "cpu")
            model.train()
        opt = torch.optim.AdamW(model.parameters(), lr=args.lr, weight_decay=0.1, betas=(0.9, 0.95))
        rng = np.random.default_rng(seed)
        for step in range(args.student_steps):
            lr = args.lr * min(1.0, (step + 1) / 20) * 0.5 * (1 + math.cos(math.pi * step / args.student_steps))
            for g in opt.param_groups:
                g["lr"] = lr
            starts = rng.integers(0, len(train_tokens) - T - 1, args.batch)
            xy = torch.as_tensor(np.stack([train_tokens[s:s + T + 1] for s in starts]))
            x, y = xy[:, :-1], xy[:, 1:]
            logits = model(x)
            if kind == "distill":
                terms = distill_loss_sum(logits, teacher(x), y, alpha=0.0, temperature=1.0)
                loss = terms.loss / terms.tokens
            else:
                loss = token_loss_sum(logits, y) / y.numel()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            opt.step()
            opt.zero_grad(set_to_none=True)
        return val_loss(model.eval())

    arms = {"pruned + distilled": "distill", "pruned + CE": "ce", "scratch (same shape)": "scratch"}
    results = {label: [] for label in arms}
    for seed in range(args.seeds):
        for label, kind in arms.items():
            results[label].append(run_student(kind, seed))
    print(f"students: {rep['params_after']:,} params, {args.student_steps} steps = {n_tokens:,} tokens each, "
          f"lr {args.lr}, {args.seeds} seeds; val loss over {len(val) - 1:,} tokens (teacher {t_loss:.4f}):")
    for kind, v in results.items():
        spread = statistics.stdev(v) if len(v) > 1 else 0.0
        print(f"  {kind:<21} mean {statistics.mean(v):.4f}  sd {spread:.4f}  [{', '.join(f'{x:.4f}' for x in v)}]")
    # One linear layer at GPT-2 small's MLP shape, where the matmul, not the per-token
    # quantization, dominates: median time of a (256, 768) x (768 -> 3072) forward.
    from gptforge.export.calibration import forward_ms
    from gptforge.model.quant import Int4Linear, Int8Linear

    lin = torch.nn.Linear(768, 3072)
    x = torch.randn(1, 256, 768)
    layers = {"fp32": lin, "int8": Int8Linear.from_linear(lin), "int4": Int4Linear.from_linear(lin, 128)}
    times = {k: forward_ms(m, x, repeats=20) for k, m in layers.items()}
    print("linear 768->3072 on 256 tokens: " + ", ".join(f"{k} {v:.2f} ms" for k, v in times.items())
          + f"; int8 speed-up {times['fp32'] / times['int8']:.2f}x")
    print(f"total {time.time() - t_start:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())

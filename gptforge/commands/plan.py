"""`gptforge plan`: per-GPU memory, speed, time and cost of a training job, before a GPU is booked.

Reads the same config as `pretrain` (`--config recipe.yaml`, dotted `--model.*`, `--train.*`,
`--parallel.*`), so a plan and a run describe the same job, plus planner-only flags.

Examples:
    gptforge plan --model gpt2-small --train.micro_batch_size 8 --train.precision bf16 --gpu a100-40g
    gptforge plan --model llama-3-8b --train.precision bf16 --gpu h100-sxm --num-gpus 8 --recommend
    gptforge plan --model gpt2-small --train.micro_batch_size 8 --measure
    gptforge plan --list-gpus
"""

from __future__ import annotations

import json
import os
import re
import sys

from gptforge.config import ModelConfig, ParallelConfig, TrainConfig, explain_unknown

SECTIONS = {"model": ModelConfig, "train": TrainConfig, "parallel": ParallelConfig}
GiB = 2**30

_SUFFIX = {"k": 1e3, "m": 1e6, "b": 1e9, "g": 1e9, "t": 1e12}


def parse_tokens(text: str) -> float:
    """'2T' -> 2e12, '300B' -> 3e11, '1.5e12' -> 1.5e12, '1_000_000' -> 1e6.

    Raises:
        ValueError: not a positive number with an optional k/M/B/T suffix.
    """
    s = str(text).strip().replace("_", "").replace(",", "")
    m = re.fullmatch(r"([0-9]*\.?[0-9]+(?:e[0-9]+)?)([kKmMbBgGtT]?)", s)
    if not m:
        raise ValueError(f"--tokens: cannot read {text!r}; write e.g. 2T, 300B, 1.5e12")
    value = float(m.group(1)) * _SUFFIX.get(m.group(2).lower(), 1.0)
    if value <= 0:
        raise ValueError("--tokens must be > 0")
    return value


def _rewrite_model_shortcut(argv: list[str]) -> list[str]:
    """`--model NAME` is short for `--model.preset NAME` (a YAML file path keeps jsonargparse's meaning)."""
    out, i = [], 0
    while i < len(argv):
        a = argv[i]
        if a == "--model" and i + 1 < len(argv) and not os.path.exists(argv[i + 1]):
            out += ["--model.preset", argv[i + 1]]
            i += 2
            continue
        if a.startswith("--model=") and not os.path.exists(a.split("=", 1)[1]):
            out.append("--model.preset=" + a.split("=", 1)[1])
        else:
            out.append(a)
        i += 1
    return out


def build_parser(sections: dict[str, type] = SECTIONS, prog: str = "gptforge plan", description: str = ""):
    """A jsonargparse parser with `--config FILE` and one dotted group per config dataclass.

    Field docstrings become the --help text; unknown keys are errors (abbreviations disabled).
    """
    from jsonargparse import ActionConfigFile, ArgumentParser

    parser = ArgumentParser(prog=prog, description=description, exit_on_error=False, allow_abbrev=False)
    parser.add_argument("--config", action=ActionConfigFile, help="YAML recipe with model/train/parallel sections.")
    for name, cls in sections.items():
        parser.add_class_arguments(cls, name)
    return parser


def _parser():
    parser = build_parser(description=(
        "Predict per-GPU memory (weights, gradients, optimizer states, activations, logits/loss, "
        "buffers), FLOPs, tokens/s, MFU, step time, total time and cost of a training job. "
        "--model NAME is short for --model.preset NAME."))
    parser.add_argument("--gpu", type=str, default=None, help="GPU short name (see --list-gpus).")
    parser.add_argument("--num-gpus", type=int, default=None,
                        help="Number of GPUs; those not used by tp*pp become data parallel.")
    parser.add_argument("--tokens", type=str, default=None,
                        help="Training tokens, e.g. 2T or 300B (default: 20 per parameter, Chinchilla).")
    parser.add_argument("--price", type=float, default=None, help="Price per GPU-hour, for the cost estimate.")
    parser.add_argument("--recommend", action="store_true",
                        help="Rank the fastest layouts that fit (needs --gpu; keeps the global batch).")
    parser.add_argument("--top", type=int, default=5, help="How many layouts --recommend prints.")
    parser.add_argument("--json", action="store_true", help="Print one JSON object (bytes, FLOPs, seconds).")
    parser.add_argument("--measure", action="store_true",
                        help="Also run one training step under FakeTensorMode with MemTracker (no real "
                             "memory) and print its tracked peak beside the formula's.")
    parser.add_argument("--list-gpus", action="store_true", help="List known GPUs and exit.")
    parser.add_argument("--table", action="store_true",
                        help="Print the 'How much GPU do I need?' markdown page (with --measure, backed by "
                             "fake-tensor measurements) and exit.")
    return parser


def _gib(n: float) -> str:
    return f"{n / GiB:8.2f}"


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.1f} s"
    if seconds < 7200:
        return f"{seconds / 60:.1f} min"
    if seconds < 3 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.1f} days"


def _fmt_count(x: float) -> str:
    for unit, div in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("k", 1e3)):
        if x >= div:
            return f"{x / div:.2f}{unit}"
    return f"{x:.0f}"


def list_gpus_text() -> str:
    from gptforge.plan.hardware import GPUS

    lines = [f"{'name':<10} {'memory':>8} {'bf16':>8} {'fp16':>8} {'fp8':>8} {'tf32':>8} {'fp32':>7} {'GB/s':>6}  model",
             f"{'':<10} {'GiB':>8} {'TFLOP/s dense':>35}"]
    for g in GPUS.values():
        def f(v):
            return "-" if v is None else f"{v:g}"
        lines.append(f"{g.name:<10} {g.memory_gib:>8g} {f(g.bf16_tflops):>8} {f(g.fp16_tflops):>8} "
                     f"{f(g.fp8_tflops):>8} {f(g.tf32_tflops):>8} {f(g.fp32_tflops):>7} {g.bandwidth_gbs:>6g}  {g.full_name}")
    lines.append("")
    lines.append("Dense tensor-core peaks (not the 2:4 sparsity figures); '-' = not supported. Sources:")
    seen = []
    for g in GPUS.values():
        if g.source not in seen:
            seen.append(g.source)
            lines.append(f"  {g.source}")
    return "\n".join(lines)


_PART_LABELS = [
    ("weights", "weights (fp32 master)"),
    ("gradients", "gradients (fp32)"),
    ("optimizer_states", "optimizer states"),
    ("activations", "activations (blocks)"),
    ("other_activations", "activations (embedding, final norm)"),
    ("autocast_weight_copies", "autocast 16-bit weight copies"),
    ("logits_and_loss", "logits and loss buffers"),
    ("backward_temp", "backward temporaries"),
    ("optimizer_temp", "optimizer step temporaries"),
]


def format_plan(p, measured=None) -> str:
    """Human-readable report of a Plan (and of a fake-tensor measurement beside it)."""
    m, sp = p.memory, p.speed
    mc, tc, pc = p.model, p.train, p.parallel
    name = mc.get("preset") or "custom"
    lines = [
        f"Model {name}: {p.param_count:,} parameters ({mc['arch']}, n_layer {mc['n_layer']}, d_model "
        f"{mc['d_model']}, n_head {mc['n_head']}, n_kv_head {mc['n_kv_head']}, d_ff {mc['d_ff']}, "
        f"block_size {mc['block_size']}, vocab_size {mc['vocab_size']}, attention {mc['attention']})",
        f"Training: micro_batch_size {tc['micro_batch_size']}, gradient_accumulation_steps "
        f"{tc['gradient_accumulation_steps']}, precision {tc['precision']}, optimizer {tc['optimizer']}, "
        f"activation_checkpointing {tc['activation_checkpointing']}",
        f"Layout: {p.num_gpus} GPU(s)" + (f" x {p.gpu['name']} ({p.gpu['full_name']})" if p.gpu else "")
        + f"; dp_replicate {pc['dp_replicate']}, dp_shard {pc['dp_shard']}, tp {pc['tp']}, pp {pc['pp']}, "
        f"zero_stage {pc['zero_stage']}, offload {pc['offload']}",
        "",
        f"Per-GPU memory at the peak ({m.peak_phase})          GiB",
    ]
    for key, label in _PART_LABELS:
        v = m.peak_parts.get(key)
        if v is None:
            continue
        extra = ""
        if key == "activations":
            extra = (f"   ({m.activations_per_layer / GiB:.3f} GiB per layer without recompute, "
                     f"{m.activations_per_layer_stored / GiB:.3f} stored)")
        lines.append(f"  {label:<40} {_gib(v)}{extra}")
    lines.append(f"  {'= tensor peak':<40} {_gib(m.peak_tensor_bytes)}")
    lines.append(f"  {'communication buckets (assumed)':<40} {_gib(m.comm_buckets)}")
    lines.append(f"  {'CUDA context (assumed)':<40} {_gib(m.cuda_context)}")
    lines.append(f"  {'allocator margin (assumed)':<40} {_gib(m.allocator_margin)}")
    lines.append(f"  {'= total':<40} {_gib(m.total)}")
    if m.cpu_offload_bytes:
        lines.append(f"  {'offloaded to CPU memory':<40} {_gib(m.cpu_offload_bytes)}")
    if p.gpu:
        head = m.capacity - m.total
        verdict = "FITS" if p.fits else "DOES NOT FIT"
        lines.append(f"  {verdict} in {m.capacity / GiB:.0f} GiB: headroom {head / GiB:+.2f} GiB")
    lines.append("  other phases: " + ", ".join(f"{k} {v / GiB:.2f} GiB" for k, v in m.phases.items()
                                                 if k != m.peak_phase))
    if measured is not None:
        err = m.peak_tensor_bytes / measured.peak_bytes - 1
        lines += ["", f"Fake-tensor measurement (FakeTensorMode + MemTracker, {measured.seconds:.1f} s on CPU):",
                  f"  tracked peak {measured.peak_bytes / GiB:.3f} GiB vs formula {m.peak_tensor_bytes / GiB:.3f} GiB "
                  f"({err:+.1%})",
                  "  parts at the tracked peak: " + ", ".join(f"{k} {v / GiB:.3f}" for k, v in measured.parts.items()
                                                               if v)]
    if sp:
        lines += [
            "",
            f"Speed (MFU {sp.mfu_low:.1%}-{sp.mfu_high:.1%}, assumed range)",
            f"  FLOPs per token: {sp.flops_per_token / 1e9:.3f} GFLOP (6N + 12*L*H*Q*T, PaLM app. B); "
            f"{sp.flops_per_token_6n / 1e9:.3f} GFLOP (6N)",
            f"  tokens/s: {sp.tokens_per_second_low:,.0f} - {sp.tokens_per_second_high:,.0f} (job), "
            f"{sp.tokens_per_second_low / p.num_gpus:,.0f} - {sp.tokens_per_second_high / p.num_gpus:,.0f} per GPU",
            f"  step time: {sp.step_time_seconds_low:.3f} - {sp.step_time_seconds_high:.3f} s "
            f"({sp.tokens_per_step:,} tokens per step)",
            f"  tokens: {_fmt_count(sp.tokens)}, {p.tokens_source}",
            f"  total time: {_duration(sp.total_time_seconds_low)} - {_duration(sp.total_time_seconds_high)}; "
            f"GPU-hours {sp.gpu_hours_low:,.0f} - {sp.gpu_hours_high:,.0f} (6N+attention convention; "
            f"{sp.gpu_hours_low * sp.flops_per_token_6n / sp.flops_per_token:,.0f} - "
            f"{sp.gpu_hours_high * sp.flops_per_token_6n / sp.flops_per_token:,.0f} counting 6N only)",
        ]
        if sp.cost_low is not None:
            lines.append(f"  cost: {sp.cost_low:,.0f} - {sp.cost_high:,.0f} (at {sp.cost_low / sp.gpu_hours_low:g} per GPU-hour)")
        lines.append("  MFU factors: " + "; ".join(sp.assumptions))
    lines += ["", "Assumptions:"] + [f"  - {a}" for a in m.assumptions + p.notes]
    return "\n".join(lines)


def main(argv: list[str]) -> int:
    from gptforge.plan import plan as make_plan

    parser = _parser()
    argv = _rewrite_model_shortcut(list(argv))
    if any(a in ("-h", "--help") for a in argv):
        parser.print_help()
        return 0
    try:
        ns = parser.parse_args(argv)
    except Exception as e:  # jsonargparse raises argparse.ArgumentError with exit_on_error=False
        print(f"gptforge plan: {explain_unknown(str(e), SECTIONS)}", file=sys.stderr)
        return 2
    if ns.list_gpus:
        print(list_gpus_text())
        return 0
    if ns.table:
        from gptforge.plan.table import how_much_gpu_markdown

        print(how_much_gpu_markdown(measure=ns.measure))
        return 0
    try:
        init = parser.instantiate(ns) if hasattr(parser, "instantiate") else parser.instantiate_classes(ns)
        model, train, parallel = init.model, init.train, init.parallel
        if model.preset is None and model.n_layer is None:
            raise ValueError("no model given: pass --model NAME (e.g. gpt2-small) or model.* fields")
        tokens = parse_tokens(ns.tokens) if ns.tokens is not None else None
        p = make_plan(model, train, parallel, gpu=ns.gpu, num_gpus=ns.num_gpus, tokens=tokens, price=ns.price)
        measured = None
        if ns.measure:
            from rich.console import Console

            from gptforge.plan.measure import measure_step

            with Console(stderr=True).status("running one fake-tensor training step ..."):
                measured = measure_step(model, train, parallel)
        recs = None
        if ns.recommend:
            if p.gpu is None:
                raise ValueError("--recommend needs --gpu (and --num-gpus, default 1)")
            from gptforge.plan.hardware import get_gpu
            from gptforge.plan.search import recommend

            recs = recommend(model, train, get_gpu(ns.gpu), p.num_gpus, top=ns.top,
                             global_batch_sequences=train.micro_batch_size * train.gradient_accumulation_steps
                             * p.num_gpus // (parallel.tp * parallel.pp))
    except ValueError as e:
        print(f"gptforge plan: {e}", file=sys.stderr)
        return 2
    if ns.json:
        d = p.to_dict()
        if measured is not None:
            d["measured"] = measured.to_dict()
        if recs is not None:
            d["recommendations"] = [c.to_dict() for c in recs]
        print(json.dumps(d, indent=2, default=str))
        return 0
    print(format_plan(p, measured))
    if recs is not None:
        print("")
        if not recs:
            print("No layout of these GPUs fits, even with full recomputation, ZeRO-3 and CPU offload: "
                  "use more GPUs or a larger card.")
        else:
            print(f"Fastest layouts that fit ({p.num_gpus} x {ns.gpu}, global batch kept at "
                  f"{recs[0].train.micro_batch_size * recs[0].train.gradient_accumulation_steps * recs[0].parallel.dp} "
                  "sequences):")
            for i, c in enumerate(recs, 1):
                pc, tc = c.parallel, c.train
                print(f"{i}. ~{c.tokens_per_second:,.0f} tokens/s (MFU ~{c.mfu:.0%}), "
                      f"{c.memory.total / GiB:.1f} GiB per GPU, headroom {c.headroom_bytes / GiB:.1f} GiB: "
                      f"micro_batch_size {tc.micro_batch_size} x accumulation {tc.gradient_accumulation_steps}, "
                      f"checkpointing {tc.activation_checkpointing}, ZeRO-{pc.zero_stage}, "
                      f"tp {pc.tp} pp {pc.pp} dp {pc.dp}, offload {pc.offload}")
                print("   " + "\n   ".join(c.recipe_lines()))
    return 0

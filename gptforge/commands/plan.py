"""`gptforge plan`: per-GPU memory, speed, time and cost of a training job, before a GPU is booked.

Reads the same config as `pretrain` (`--config recipe.yaml`, dotted `--model.*`, `--train.*`,
`--parallel.*`), so a plan and a run describe the same job, plus planner-only flags.

Examples:
    gptforge plan --model gpt2-small --train.micro_batch_size 8 --train.precision bf16 --gpu a100-40g
    gptforge plan --model llama-3-8b --train.precision bf16 --gpu h100-sxm --num-gpus 8 --recommend
    gptforge plan --model gpt2-small --train.micro_batch_size 8 --measure
    gptforge plan --list-gpus
    gptforge plan --fit SWEEP_DIR --model 4x128 --tokens 2M --target-loss 3.0 --gpu h100-sxm --price 2.5
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass
from typing import Optional

from gptforge.config import ModelConfig, ParallelConfig, TrainConfig
from gptforge.options import command_parser, parse_command, rewrite_model_shorthand
from gptforge.plan.flops import parse_tokens  # noqa: F401  (re-exported: tests and scripts use it from here)

SECTIONS = {"model": ModelConfig, "train": TrainConfig, "parallel": ParallelConfig}
GiB = 2**30

def _rewrite_model_shortcut(argv: list[str]) -> list[str]:
    """`--model NAME` is short for `--model.preset NAME` (see `gptforge.options.rewrite_model_shorthand`)."""
    return rewrite_model_shorthand(argv)


PLAN_DESCRIPTION = ("Predict per-GPU memory (weights, gradients, optimizer states, activations, logits/loss, "
                    "buffers), FLOPs, tokens/s, MFU, step time, total time and cost of a training job.")


@dataclass
class PlanOptions:
    gpu: Optional[str] = None
    """GPU short name (see --list-gpus; h100, a100, 4090 and the like resolve)."""
    num_gpus: Optional[int] = None
    """Number of GPUs; those not used by tp*pp become data parallel."""
    tokens: Optional[str] = None
    """Training tokens, e.g. 2T or 300B (default: 20 per parameter, Chinchilla)."""
    price: Optional[float] = None
    """Price per GPU-hour, for the cost estimate."""
    recommend: bool = False
    """Rank the fastest layouts that fit (needs --gpu; keeps the global batch)."""
    top: int = 5
    """How many layouts --recommend prints."""
    json: bool = False
    """Print one JSON object (bytes, FLOPs, seconds)."""
    measure: bool = False
    """Also run one training step under FakeTensorMode with MemTracker (no real memory) and print its
    tracked peak beside the formula's."""
    data: Optional[list[str]] = None
    """A mixture (several shard folders, or one prepared with several --source): print the
    tokens and epochs per source of the planned training tokens (gptforge.plan.mixture)."""
    data_weights: Optional[str] = None
    """With --data: NAME=WEIGHT,... (default proportional to train tokens, as pretrain)."""
    list_gpus: bool = False
    """List known GPUs and exit."""
    fit: Optional[list[str]] = None
    """Run or sweep directories: fit L(N, D) = E + A/N^alpha + B/D^beta to their final val losses
    (Hoffmann et al. 2022, approach 3) and predict from it; --model may then be a shape
    LAYERSxD_MODEL in the runs' recipe family."""
    target_loss: Optional[float] = None
    """With --fit: tokens (and, with --gpu, GPU-hours, days, cost) to reach this val loss."""
    flops: Optional[str] = None
    """With --fit: a compute budget in FLOPs (e.g. 1e18) for the compute-optimal N and D (default:
    the compute of --model x --tokens)."""
    bootstrap: int = 100
    """With --fit: bootstrap resamples of the runs for the 90% intervals."""
    plot: Optional[str] = None
    """With --fit: where to write the plot (default: scaling_fit.png in the first --fit directory;
    .html when matplotlib is not installed)."""
    table: bool = False
    """Print the 'How much GPU do I need?' markdown page (with --measure, backed by fake-tensor
    measurements) and exit."""


def _parser():
    from gptforge.config import FinetuneConfig

    parser = command_parser("gptforge plan", PLAN_DESCRIPTION, PlanOptions,
                            sections={**SECTIONS, "finetune": FinetuneConfig})
    parser.set_defaults({"finetune.method": "full"})  # plan pretraining unless --finetune.method lora/qlora
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
        if p.fixes:
            lines.append("  changes predicted to fit, cheapest first:")
            lines += [f"    {text}   (peak {b / GiB:.2f} GiB of tensors)" for text, b in p.fixes[:4]]
        elif not p.fits:
            lines.append("  no single change of micro-batch, activation checkpointing or ZeRO stage fits: try "
                         "--recommend, more GPUs, or fine-tuning with --finetune.method lora / qlora")
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
        ns, init = parse_command(parser, argv)
    except SystemExit as e:  # the error line is printed; keep the exit status as a return value
        return int(e.code or 0)
    if ns.list_gpus:
        print(list_gpus_text())
        return 0
    if ns.fit:
        from gptforge.errors import GptforgeError

        try:
            return _fit_main(ns, init)
        except (GptforgeError, ValueError) as e:
            print(f"gptforge plan: error: {e}", file=sys.stderr)
            return 2
    if ns.table:
        from gptforge.plan.table import how_much_gpu_markdown

        print(how_much_gpu_markdown(measure=ns.measure))
        return 0
    try:
        model, train, parallel = init.model, init.train, init.parallel
        if model.preset is None and model.n_layer is None:
            raise ValueError("no model given: pass --model NAME (e.g. gpt2-small) or model.* fields")
        tokens = parse_tokens(ns.tokens) if ns.tokens is not None else None
        p = make_plan(model, train, parallel, gpu=ns.gpu, num_gpus=ns.num_gpus, tokens=tokens, price=ns.price,
                      finetune=init.finetune)
        measured = None
        if ns.measure:
            from rich.console import Console

            from gptforge.plan.measure import measure_step

            with Console(stderr=True).status("running one fake-tensor training step ..."):
                measured = measure_step(model, train, parallel)
        budget = None
        if ns.data:
            from gptforge.plan.mixture import mixture_budget
            from gptforge.train.mixture_source import parse_data_weights

            weights = parse_data_weights(ns.data_weights) if ns.data_weights else None
            budget = mixture_budget(ns.data if len(ns.data) > 1 else ns.data[0], weights, p.tokens)
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
        if budget is not None:
            d["mixture"] = [vars(r) for r in budget]
        print(json.dumps(d, indent=2, default=str))
        return 0
    print(format_plan(p, measured))
    if budget is not None:
        from gptforge.plan.mixture import format_budget

        print("\n" + format_budget(budget))
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


def _fmt_band(v, lo, hi, fmt="{:.4f}") -> str:
    if v is None:
        return "n/a"
    band = "" if lo is None or hi is None or lo != lo else f" [{fmt.format(lo)} - {fmt.format(hi)}]"
    return fmt.format(v) + band


def _hardware(model_cfg, train, parallel, ns, tokens: float) -> dict | None:
    """The planner's time and cost for `tokens` on --gpu, or None without --gpu."""
    from gptforge.plan import plan as make_plan

    if ns.gpu is None:
        return None
    p = make_plan(model_cfg, train, parallel, gpu=ns.gpu, num_gpus=ns.num_gpus, tokens=tokens, price=ns.price)
    sp = p.speed
    return {"gpu": ns.gpu, "num_gpus": p.num_gpus, "fits": p.fits, "gpu_hours_low": sp.gpu_hours_low,
            "gpu_hours_high": sp.gpu_hours_high, "days_low": sp.total_time_seconds_low / 86400,
            "days_high": sp.total_time_seconds_high / 86400, "cost_low": sp.cost_low, "cost_high": sp.cost_high,
            "mfu_low": sp.mfu_low, "mfu_high": sp.mfu_high, "seconds_low": sp.total_time_seconds_low,
            "seconds_high": sp.total_time_seconds_high}


def _hardware_line(h: dict) -> str:
    line = (f"on {h['num_gpus']} x {h['gpu']} (MFU {h['mfu_low']:.0%}-{h['mfu_high']:.0%}, the planner's time "
            f"model): {h['gpu_hours_low']:,.3g} - {h['gpu_hours_high']:,.3g} GPU-hours, "
            f"{_duration(h['seconds_low'])} - {_duration(h['seconds_high'])} ({h['days_low']:.3g} - "
            f"{h['days_high']:.3g} days)")
    if h["cost_low"] is not None:
        line += f", cost {h['cost_low']:,.3g} - {h['cost_high']:,.3g}"
    if h["fits"] is False:
        line += " (DOES NOT FIT in memory with this train/parallel config: see gptforge plan without --fit)"
    return line


def _fit_main(ns, init) -> int:
    """`gptforge plan --fit ...`: fit the scaling law to runs and answer the questions asked."""
    from pathlib import Path

    from gptforge.plan.fit import find_runs, fit_scaling_law, non_embedding_params, plot_fit, question_model
    from gptforge.plan.params import param_count

    points = find_runs(ns.fit)
    fit = fit_scaling_law(points, bootstrap=ns.bootstrap)
    model_cfg = None
    if init.model.preset is not None:
        model_cfg = question_model(init.model.preset, fit.runs)
    elif init.model.n_layer is not None:
        model_cfg = init.model.resolved()
    out: dict = {"fit": fit.to_dict()}
    n = non_embedding_params(model_cfg) if model_cfg is not None else None
    tokens = parse_tokens(ns.tokens) if ns.tokens is not None else None
    if model_cfg is not None and tokens is None and ns.target_loss is None:
        tokens = 20.0 * param_count(model_cfg)  # Chinchilla's 20 tokens per parameter, as plain `plan`
    question = None
    if model_cfg is not None and tokens is not None:
        question = fit.loss(n, tokens)
        question["model"] = {k: getattr(model_cfg, k) for k in ("arch", "n_layer", "d_model", "n_head",
                                                                 "block_size", "vocab_size")}
        question["hardware"] = _hardware(model_cfg, init.train, init.parallel, ns, tokens)
        out["prediction"] = question
    budget = float(ns.flops) if ns.flops is not None else (question["flops"] if question else None)
    if budget is not None:
        out["compute_optimal"] = fit.compute_optimal(budget)
    if ns.target_loss is not None:
        if model_cfg is not None:
            t = fit.tokens_for_loss(ns.target_loss, n)
            if t.get("tokens") is not None:
                t["hardware"] = _hardware(model_cfg, init.train, init.parallel, ns, t["tokens"])
            out["target"] = t
        out["target_frontier"] = fit.min_compute_for_loss(ns.target_loss)
    plot_path = Path(ns.plot) if ns.plot else Path(ns.fit[0]) / "scaling_fit.png"
    out["plot"] = str(plot_fit(fit, plot_path, question))
    if ns.json:
        print(json.dumps(out, indent=2, default=str))
        return 0
    print(format_fit(out))
    return 0


def format_fit(out: dict) -> str:
    """Human-readable report of `gptforge plan --fit` (the dict --json prints)."""
    f = out["fit"]
    p, lo, hi, s = f["params"], f["params_low"], f["params_high"], f["seen"]
    lines = [f"Scaling law {f['law']}, N = {f['n_convention']}, compute = 6ND",
             f"  fitted on {s['runs']} runs: N {s['n_min']:.3g} - {s['n_max']:.3g}, D {s['d_min']:.3g} - "
             f"{s['d_max']:.3g}, compute {s['c_min']:.3g} - {s['c_max']:.3g} FLOPs; "
             f"{f['bootstrap_resamples']} bootstrap resamples, 90% intervals in brackets"]
    for k in ("E", "A", "alpha", "B", "beta"):
        lines.append(f"  {k:<5} = {_fmt_band(p[k], lo.get(k), hi.get(k), '{:.4g}')}")
    if f["excluded"]:
        lines.append("  excluded runs:")
        lines += [f"    {r['name']}: {r['status']}" for r in f["excluded"]]
    q = out.get("prediction")
    if q:
        m = q["model"]
        lines += ["", f"Prediction for n_layer {m['n_layer']}, d_model {m['d_model']} (N = {q['n_params']:.4g} "
                      f"non-embedding), {_fmt_count(q['tokens'])} tokens ({q['flops']:.3g} FLOPs):",
                  f"  val loss {_fmt_band(q['loss'], q['loss_low'], q['loss_high'])}"]
        if q.get("hardware"):
            lines.append("  " + _hardware_line(q["hardware"]))
        lines += [f"  WARNING: {w}" for w in q["warnings"]]
    c = out.get("compute_optimal")
    if c:
        lines += ["", f"Compute-optimal split of {c['flops']:.3g} FLOPs (Hoffmann et al. 2022, eq. 4):",
                  f"  N {_fmt_band(c['n_params'], c['n_params_low'], c['n_params_high'], '{:.4g}')}, "
                  f"D {_fmt_band(c['tokens'], c['tokens_low'], c['tokens_high'], '{:.4g}')} tokens, "
                  f"val loss {_fmt_band(c['loss'], c['loss_low'], c['loss_high'])}"]
        lines += [f"  WARNING: {w}" for w in c["warnings"]]
    t = out.get("target")
    if t:
        lines += ["", f"Target val loss {t['target_loss']:g} with N = {t['n_params']:.4g}:"]
        if t.get("tokens") is None:
            lines.append(f"  {t['reason']}")
        else:
            lines.append(f"  tokens {_fmt_band(t['tokens'], t['tokens_low'], t['tokens_high'], '{:.4g}')} "
                         f"({t['flops']:.3g} FLOPs)")
            if t.get("hardware"):
                lines.append("  " + _hardware_line(t["hardware"]))
            lines += [f"  WARNING: {w}" for w in t["warnings"]]
    tf = out.get("target_frontier")
    if tf:
        lines += ["", f"Least compute to reach val loss {tf['target_loss']:g} (compute-optimal frontier):"]
        if not tf["reachable"]:
            lines.append(f"  {tf['reason']}")
        else:
            lines.append(f"  {tf['flops']:.3g} FLOPs: N {tf['n_params']:.4g}, D {tf['tokens']:.4g} tokens")
            lines += [f"  WARNING: {w}" for w in tf["warnings"]]
    lines += ["", f"Plot: {out['plot']}"]
    return "\n".join(lines)

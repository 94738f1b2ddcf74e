"""Text of `gptforge plan`: the memory/speed report, the GPU list, recommended layouts and the
scaling-law fit's answers, each a pure function of the planner's results (bytes, FLOPs, seconds)."""

from __future__ import annotations

GiB = 2**30


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
    """The hardware table (memory GiB, dense TFLOP/s per precision, GB/s) with its sources."""
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
    ("reference_weights", "DPO reference model (frozen copy)"),
    ("gradients", "gradients (fp32)"),
    ("optimizer_states", "optimizer states"),
    ("activations", "activations (blocks)"),
    ("other_activations", "activations (embedding, final norm)"),
    ("autocast_weight_copies", "autocast 16-bit weight copies"),
    ("logits_and_loss", "logits and loss buffers"),
    ("backward_temp", "backward temporaries"),
    ("optimizer_temp", "optimizer step temporaries"),
]


def format_plan(p, measured=None, recommending: bool = False) -> str:
    """Human-readable report of a Plan (and of a fake-tensor measurement beside it); `recommending`:
    the ranked layouts of --recommend follow it (the advice for a job that does not fit points there)."""
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
            where = "see the layouts ranked below" if recommending else "try --recommend"
            lines.append(f"  no single change of micro-batch, activation checkpointing or ZeRO stage fits: {where}, "
                         "more GPUs, or fine-tuning with --finetune.method lora / qlora")
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


def format_recommendations(recs: list, num_gpus: int, gpu: str, host_memory_bytes: int | None = None,
                           host_needed_bytes: int | None = None) -> str:
    """The ranked layouts of `plan --recommend` (`gptforge.plan.search.recommend`'s candidates), one
    numbered entry each with tokens/s, MFU, per-GPU GiB, headroom and the recipe lines to run it; an
    offload layout also names the host memory it needs per node (checked when `host_memory_bytes`,
    the node's CPU memory, is given; `host_needed_bytes`: the least an offload layout would need
    when none fits in it)."""
    if not recs:
        host = (f" within {host_memory_bytes / GiB:,.0f} GiB of host memory per node"
                if host_memory_bytes is not None else "")
        need = (f" (the least an offload layout needs: {host_needed_bytes / GiB:,.1f} GiB per node)"
                if host_needed_bytes else "")
        return ("No layout of these GPUs fits, even with full recomputation, ZeRO-3 and CPU offload"
                f"{host}{need}: use more GPUs, a larger card" + (", or a node with more memory." if need else "."))
    first = recs[0]
    global_batch = first.train.micro_batch_size * first.train.gradient_accumulation_steps * first.parallel.dp
    lines = [f"Fastest layouts that fit ({num_gpus} x {gpu}, global batch kept at {global_batch} sequences):"]
    for i, c in enumerate(recs, 1):
        pc, tc = c.parallel, c.train
        lines.append(f"{i}. ~{c.tokens_per_second:,.0f} tokens/s (MFU ~{c.mfu:.0%}), "
                     f"{c.memory.total / GiB:.1f} GiB per GPU, headroom {c.headroom_bytes / GiB:.1f} GiB: "
                     f"micro_batch_size {tc.micro_batch_size} x accumulation {tc.gradient_accumulation_steps}, "
                     f"checkpointing {tc.activation_checkpointing}, ZeRO-{pc.zero_stage}, "
                     f"tp {pc.tp} pp {pc.pp} dp {pc.dp}, offload {pc.offload}")
        if c.host_bytes_per_node:
            checked = ("fits the given --host-memory-gb" if host_memory_bytes is not None
                       else "not checked: give --host-memory-gb")
            lines.append(f"   host memory for the offloaded states: {c.host_bytes_per_node / GiB:,.1f} GiB per node "
                         f"({checked})")
        lines.append("   " + "\n   ".join(c.recipe_lines()))
    return "\n".join(lines)


def _fmt_band(v, lo, hi, fmt="{:.4f}") -> str:
    if v is None:
        return "n/a"
    band = "" if lo is None or hi is None or lo != lo else f" [{fmt.format(lo)} - {fmt.format(hi)}]"
    return fmt.format(v) + band


def hardware_line(h: dict) -> str:
    """One line of GPU-hours, wall time, days and cost from `gptforge.plan.answer.hardware_summary`."""
    line = (f"on {h['num_gpus']} x {h['gpu']} (MFU {h['mfu_low']:.0%}-{h['mfu_high']:.0%}, the planner's time "
            f"model): {h['gpu_hours_low']:,.3g} - {h['gpu_hours_high']:,.3g} GPU-hours, "
            f"{_duration(h['seconds_low'])} - {_duration(h['seconds_high'])} ({h['days_low']:.3g} - "
            f"{h['days_high']:.3g} days)")
    if h["cost_low"] is not None:
        line += f", cost {h['cost_low']:,.3g} - {h['cost_high']:,.3g}"
    if h["fits"] is False:
        line += " (DOES NOT FIT in memory with this train/parallel config: see gptforge plan without --fit)"
    return line


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
            lines.append("  " + hardware_line(q["hardware"]))
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
                lines.append("  " + hardware_line(t["hardware"]))
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

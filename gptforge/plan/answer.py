"""What `gptforge plan` computes for one call: the plan with an optional fake-tensor measurement
and layout ranking, or the answers of a scaling-law fit to finished runs."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from gptforge.config import FinetuneConfig, ModelConfig, ParallelConfig, TrainConfig
from gptforge.plan.flops import parse_tokens


@dataclass
class PlanAnswer:
    """A `gptforge.plan.Plan`, the `measure_step` result beside it (or None) and the ranked
    layouts of `--recommend` (or None); host_memory_bytes: the CPU memory per node they were
    checked against (None: not given)."""

    plan: Any
    measured: Any = None
    recommendations: list | None = None
    host_memory_bytes: int | None = None
    host_needed_bytes: int | None = None
    """When no layout fits in host_memory_bytes: the least host memory per node an offload layout needs."""

    def to_dict(self) -> dict:
        """The JSON object `plan --json` prints (bytes, FLOPs, seconds)."""
        d = self.plan.to_dict()
        if self.measured is not None:
            d["measured"] = self.measured.to_dict()
        if self.recommendations is not None:
            d["recommendations"] = [c.to_dict() for c in self.recommendations]
        return d


def plan_job(model: ModelConfig, train: TrainConfig, parallel: ParallelConfig, finetune: FinetuneConfig | None,
             *, gpu: str | None = None, num_gpus: int | None = None, tokens: str | None = None,
             price: float | None = None, measure: bool = False, recommend: bool = False, top: int = 5,
             host_memory_gb: float | None = None) -> PlanAnswer:
    """Plan one job; with `measure`, run one training step under FakeTensorMode beside the formula;
    with `recommend`, rank the `top` fastest layouts of `num_gpus` x `gpu` that fit, keeping the
    global batch in sequences (offload layouts only within `host_memory_gb` GiB of CPU memory per node, when given).

    Raises:
        ValueError: no model given, a shape LAYERSxD_MODEL (that needs --fit), a bad token count,
            or `recommend` without `gpu`.
        InputError (a ValueError): a train.* value `pretrain` refuses too (TrainConfig.check_values).
    """
    from gptforge.errors import InputError
    from gptforge.plan import plan as make_plan
    from gptforge.plan.fit import model_shape

    if model.preset is None and model.n_layer is None:
        raise ValueError("no model given: pass --model NAME (e.g. gpt2-small) or model.* fields")
    shape = model_shape(model.preset) if model.preset is not None else None
    if shape is not None:
        raise InputError(f"--model {model.preset}: a shape LAYERSxD_MODEL is read with --fit RUN_OR_SWEEP_DIR only "
                         "(the fitted runs give the rest of the recipe); without --fit give a preset name or the "
                         f"shape's keys: --model.n_layer {shape[0]} --model.d_model {shape[1]}")
    train.check_values()
    n_tokens = parse_tokens(tokens) if tokens is not None else None
    p = make_plan(model, train, parallel, gpu=gpu, num_gpus=num_gpus, tokens=n_tokens, price=price, finetune=finetune)
    answer = PlanAnswer(plan=p, host_memory_bytes=None if host_memory_gb is None else int(host_memory_gb * 2**30))
    if measure:
        from rich.console import Console

        from gptforge.plan.measure import measure_step

        with Console(stderr=True).status("running one fake-tensor training step ..."):
            answer.measured = measure_step(model, train, parallel)
    if recommend:
        if p.gpu is None:
            raise ValueError("--recommend needs --gpu (and --num-gpus, default 1)")
        from gptforge.plan.hardware import get_gpu
        from gptforge.plan.search import recommend as rank_layouts

        sequences = train.micro_batch_size * train.gradient_accumulation_steps * p.num_gpus // (parallel.tp * parallel.pp)
        answer.recommendations = rank_layouts(model, train, get_gpu(gpu), p.num_gpus, top=top,
                                              global_batch_sequences=sequences,
                                              host_memory_bytes=answer.host_memory_bytes)
        if not answer.recommendations and answer.host_memory_bytes is not None:
            unbounded = rank_layouts(model, train, get_gpu(gpu), p.num_gpus, top=1000, global_batch_sequences=sequences)
            answer.host_needed_bytes = min((c.host_bytes_per_node for c in unbounded), default=None)
    return answer


def hardware_summary(model_cfg: ModelConfig, train: TrainConfig, parallel: ParallelConfig, tokens: float,
                     gpu: str | None, num_gpus: int | None, price: float | None) -> dict | None:
    """The planner's GPU-hours, seconds, days and cost for `tokens` on `gpu`, or None without a GPU."""
    from gptforge.plan import plan as make_plan

    if gpu is None:
        return None
    p = make_plan(model_cfg, train, parallel, gpu=gpu, num_gpus=num_gpus, tokens=tokens, price=price)
    sp = p.speed
    return {"gpu": gpu, "num_gpus": p.num_gpus, "fits": p.fits, "gpu_hours_low": sp.gpu_hours_low,
            "gpu_hours_high": sp.gpu_hours_high, "days_low": sp.total_time_seconds_low / 86400,
            "days_high": sp.total_time_seconds_high / 86400, "cost_low": sp.cost_low, "cost_high": sp.cost_high,
            "mfu_low": sp.mfu_low, "mfu_high": sp.mfu_high, "seconds_low": sp.total_time_seconds_low,
            "seconds_high": sp.total_time_seconds_high}


def answer_fit(fit_dirs: list[str], model: ModelConfig, train: TrainConfig, parallel: ParallelConfig, *,
               tokens: str | None = None, target_loss: float | None = None, flops: str | None = None,
               bootstrap: int = 100, plot: str | None = None, gpu: str | None = None,
               num_gpus: int | None = None, price: float | None = None) -> dict:
    """Fit L(N, D) = E + A/N^alpha + B/D^beta to the runs under `fit_dirs` (Hoffmann et al. 2022,
    approach 3) and answer: the val loss of `model` at `tokens` (default 20 tokens per parameter,
    Chinchilla), the compute-optimal split of `flops` (default that prediction's compute), and the
    tokens and least compute to reach `target_loss`; with `gpu`, hardware time and cost for each.

    Returns the dict `plan --fit --json` prints, with the written plot's path under "plot".

    Raises:
        GptforgeError or ValueError: no usable runs, a bad model shape or a bad count, or a
            train.* value `pretrain` refuses too (TrainConfig.check_values).
    """
    from gptforge.plan.fit import find_runs, fit_scaling_law, non_embedding_params, plot_fit, question_model
    from gptforge.plan.params import param_count

    train.check_values()
    fit = fit_scaling_law(find_runs(fit_dirs), bootstrap=bootstrap)
    model_cfg = None
    if model.preset is not None:
        model_cfg = question_model(model.preset, fit.runs)
    elif model.n_layer is not None:
        model_cfg = model.resolved()
    out: dict = {"fit": fit.to_dict()}
    n = non_embedding_params(model_cfg) if model_cfg is not None else None
    n_tokens = parse_tokens(tokens) if tokens is not None else None
    if model_cfg is not None and n_tokens is None and target_loss is None:
        n_tokens = 20.0 * param_count(model_cfg)  # Chinchilla's 20 tokens per parameter, as plain `plan`
    question = None
    if model_cfg is not None and n_tokens is not None:
        question = fit.loss(n, n_tokens)
        question["model"] = {k: getattr(model_cfg, k) for k in ("arch", "n_layer", "d_model", "n_head",
                                                                 "block_size", "vocab_size")}
        question["hardware"] = hardware_summary(model_cfg, train, parallel, n_tokens, gpu, num_gpus, price)
        out["prediction"] = question
    budget = float(flops) if flops is not None else (question["flops"] if question else None)
    if budget is not None:
        out["compute_optimal"] = fit.compute_optimal(budget)
    if target_loss is not None:
        if model_cfg is not None:
            t = fit.tokens_for_loss(target_loss, n)
            if t.get("tokens") is not None:
                t["hardware"] = hardware_summary(model_cfg, train, parallel, t["tokens"], gpu, num_gpus, price)
            out["target"] = t
        out["target_frontier"] = fit.min_compute_for_loss(target_loss)
    plot_path = Path(plot) if plot else Path(fit_dirs[0]) / "scaling_fit.png"
    out["plot"] = str(plot_fit(fit, plot_path, question))
    return out

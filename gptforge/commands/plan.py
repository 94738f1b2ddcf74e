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
from gptforge.options import bounded, command_parser, parse_command, rewrite_model_shorthand
from gptforge.plan.flops import parse_tokens  # noqa: F401  (re-exported: tests and scripts use it from here)

SECTIONS = {"model": ModelConfig, "train": TrainConfig, "parallel": ParallelConfig}

# One description: `gptforge --help` lists SUMMARY (read from this file unimported); DESCRIPTION begins with it.
SUMMARY = "Predict per-GPU memory, speed, time and cost of a training job (and check it on fake tensors)."

DESCRIPTION = SUMMARY + ("\n\nMemory per GPU as weights, gradients, optimizer states, activations, logits/loss and "
                         "buffers; speed as FLOPs, tokens/s, MFU and step time; then total time and cost.")


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
    host_memory_gb: Optional[float] = bounded(None, low=0, low_open=True)
    """With --recommend: CPU memory of one node in GiB; offload layouts that need more are dropped."""
    json: bool = False
    """Print one JSON object (bytes, FLOPs, seconds)."""
    measure: bool = False
    """Also run one training step under FakeTensorMode with MemTracker (no real memory) and print its
    tracked peak beside the formula's."""
    data: Optional[list[str]] = None
    """A mixture (several shard folders, or one prepared with several --source): print the
    tokens and epochs per source of the planned training tokens (gptforge.plan.mixture)."""
    data_weights: Optional[str] = None
    """With --data: shortcut for --train.data_weights, NAME=WEIGHT,... (default: by train tokens)."""
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

    parser = command_parser("gptforge plan", DESCRIPTION, PlanOptions,
                            sections={**SECTIONS, "finetune": FinetuneConfig})
    parser.set_defaults({"finetune.method": "full"})  # plan pretraining unless --finetune.method lora/qlora
    return parser


def main(argv: list[str]) -> int:
    from gptforge.errors import FAILURE_EXIT, USAGE_EXIT, GptforgeError, OptionError
    from gptforge.plan import format as text
    from gptforge.plan.answer import answer_fit, plan_job

    parser = _parser()
    argv = rewrite_model_shorthand(list(argv))  # --model NAME is short for --model.preset NAME
    if any(a in ("-h", "--help") for a in argv):
        parser.print_help()
        return 0
    try:
        ns, init = parse_command(parser, argv)
    except SystemExit as e:  # the error line is printed; keep the exit status (USAGE_EXIT) as a return value
        return int(e.code or 0)
    if ns.list_gpus:
        print(text.list_gpus_text())
        return 0
    if ns.fit:
        try:
            out = answer_fit(ns.fit, init.model, init.train, init.parallel, tokens=ns.tokens,
                             target_loss=ns.target_loss, flops=ns.flops, bootstrap=ns.bootstrap, plot=ns.plot,
                             gpu=ns.gpu, num_gpus=ns.num_gpus, price=ns.price)
        except (GptforgeError, ValueError) as e:  # the sweep folders are input: FAILURE_EXIT, unless an option
            print(f"gptforge plan: error: {e}", file=sys.stderr)
            return USAGE_EXIT if isinstance(e, OptionError) else FAILURE_EXIT
        print(json.dumps(out, indent=2, default=str) if ns.json else text.format_fit(out))
        return 0
    if ns.table:
        from gptforge.plan.table import how_much_gpu_markdown

        print(how_much_gpu_markdown(measure=ns.measure))
        return 0
    try:
        answer = plan_job(init.model, init.train, init.parallel, init.finetune, gpu=ns.gpu, num_gpus=ns.num_gpus,
                          tokens=ns.tokens, price=ns.price, measure=ns.measure, recommend=ns.recommend, top=ns.top,
                          host_memory_gb=ns.host_memory_gb)
    except ValueError as e:  # every value plan_job refuses came from an option or recipe key
        print(f"gptforge plan: error: {e}", file=sys.stderr)
        return USAGE_EXIT
    budget = None
    if ns.data:  # the shard folders are input: the error wrapper's FAILURE_EXIT, unless an option
        from gptforge.plan.mixture import mixture_budget
        from gptforge.train.sources.mixture import parse_data_weights

        weights = parse_data_weights(ns.data_weights) if ns.data_weights else init.train.data_weights
        budget = mixture_budget(ns.data if len(ns.data) > 1 else ns.data[0], weights, answer.plan.tokens)
    if ns.json:
        d = answer.to_dict()
        if budget is not None:
            d["mixture"] = [vars(r) for r in budget]
        print(json.dumps(d, indent=2, default=str))
        return 0
    print(text.format_plan(answer.plan, answer.measured, recommending=ns.recommend))
    if budget is not None:
        from gptforge.plan.mixture import format_budget

        print("\n" + format_budget(budget))
    if answer.recommendations is not None:
        print("\n" + text.format_recommendations(answer.recommendations, answer.plan.num_gpus, ns.gpu,
                                                answer.host_memory_bytes, answer.host_needed_bytes))
    return 0

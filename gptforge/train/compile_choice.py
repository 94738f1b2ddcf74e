"""`train.compile auto`: compile when it is faster for this shape on this machine.

On CUDA auto means compile (Inductor's Triton kernels pay for every transformer shape worth a GPU).
On a CPU, Inductor generates C++/OpenMP kernels that fuse the elementwise work (LayerNorm, GELU,
residual adds) around the matmuls; whether that beats eager depends on the shape, the precision and
the CPU, so auto measures both for a few steps at start (`measure_compile`) and keeps the faster.
The caller freezes the choice (a bool) in config.yaml, so a resume never measures again.
"""

from __future__ import annotations

import os
import shutil
import statistics
import time
from dataclasses import dataclass
from typing import Callable

import torch

from gptforge.config import ModelConfig, TrainConfig
from gptforge.runtime.host_memory import keep_freed_memory

AUTO_COMPILE_ENV = "GPTFORGE_AUTO_COMPILE"
"""Environment variable that pins what `train.compile auto` resolves to (true or false), skipping
the measurement."""

PROBE_STEPS = 3
"""Timed optimizer steps per side in the CPU probe (after one warm-up step each)."""

PROBE_SECONDS = 10.0
"""Timed steps per side are cut (down to 1) so that each side's timed steps take about this long
at the eager warm-up step's pace: the probe's timed part stays near 2 * PROBE_SECONDS however
large the model."""

MIN_GAIN = 0.05
"""auto compiles on a CPU only when the compiled step is at least this share faster than eager:
within the step-to-step noise of a loaded machine eager is kept (no compile time, no C++ build)."""


@dataclass
class CompileProbe:
    """What the CPU probe measured: median step seconds of each side, and its own cost.

    eager_s, compiled_s: median seconds of one optimizer step (forward, backward, clip, update).
    warmup_s: seconds of the compiled side's first step (tracing and the C++ build).
    total_s: wall seconds the whole probe took.
    """

    eager_s: float
    compiled_s: float
    warmup_s: float
    total_s: float


def cpp_compiler() -> str | None:
    """The C++ compiler Inductor's CPU backend would find ($CXX, then c++, g++, clang++), or None."""
    for name in (os.environ.get("CXX"), "c++", "g++", "clang++"):
        if name and shutil.which(name):
            return shutil.which(name)
    return None


def measure_compile(model_cfg: ModelConfig, train_cfg: TrainConfig, precision: str, device: torch.device,
                    steps: int = PROBE_STEPS, whole: bool = True) -> CompileProbe:
    """Median optimizer-step seconds of the run's shape, eager against compiled as the run will
    compile (`gptforge.train.parallel.parallelize.apply_compile`: the whole model when `whole`, as a
    single process does; per block otherwise, as the parallel layouts do), on random tokens.

    One model and optimizer serve both sides: the eager steps run the same compiled model under
    `torch.compiler.set_stance("force_eager")`, so the probe holds one copy of the weights; eager
    and compiled steps alternate, so a change in the machine's load lands on both. Cost: 2 warm-up
    steps (the compiled one includes compilation, typically 5-30 s on a CPU, less from Inductor's
    on-disk cache) plus 2 * `steps` timed steps, fewer (at least 1 per side) where `steps` of them
    would take over PROBE_SECONDS per side. The compilation is not wasted: the run's own compile of
    the same graphs hits the cache. On a CPU glibc's allocator policy is set first, as the CPU run
    sets it (`gptforge.runtime.host_memory.keep_freed_memory`, process-wide and idempotent).
    train_cfg: pre-resolved (train.lr set: gptforge.train.resolve.pre_resolve); ValueError otherwise.
    """
    from gptforge.model.gpt import GPT
    from gptforge.train.optim import build_optimizer
    from gptforge.train.parallel.parallelize import apply_compile
    from gptforge.train.step import forward_backward, onednn_linear_for

    t_start = time.perf_counter()
    keep_freed_memory(device_type=device.type)  # as gptforge.train.run.train does before the first step
    cfg = model_cfg.resolved()
    model = GPT(cfg).to(device)
    model.train()
    opt = build_optimizer(model, train_cfg, device.type)
    g = torch.Generator().manual_seed(0)
    shape = (train_cfg.micro_batch_size, cfg.block_size)
    micro = [(torch.randint(0, cfg.vocab_size, shape, generator=g), torch.randint(0, cfg.vocab_size, shape, generator=g))
             for _ in range(train_cfg.gradient_accumulation_steps)]
    divisor = float(micro[0][1].numel() * len(micro))
    apply_compile(model, whole=whole)

    def step(compiled: bool) -> float:
        t0 = time.perf_counter()
        with torch.compiler.set_stance("default" if compiled else "force_eager"):
            forward_backward(model, micro, divisor, device, precision,
                             use_onednn_linear=onednn_linear_for(train_cfg.onednn_linear, device, precision, compiled))
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        if device.type == "cuda":
            torch.cuda.synchronize(device)
        return time.perf_counter() - t0

    first = step(False)
    warmup = step(True)
    times: dict[bool, list[float]] = {False: [], True: []}
    for _ in range(max(1, min(steps, int(PROBE_SECONDS / max(first, 1e-9))))):
        for side in (False, True):
            times[side].append(step(side))
    return CompileProbe(statistics.median(times[False]), statistics.median(times[True]), warmup,
                        time.perf_counter() - t_start)


def resolve_compile(value: bool | str, model_cfg: ModelConfig, train_cfg: TrainConfig, precision: str,
                    device: torch.device, log: Callable[[str], None] | None = None,
                    measure: Callable[..., CompileProbe] | None = None,
                    agree: Callable[[list[float]], list[float]] | None = None,
                    on_probe: Callable[[CompileProbe], None] | None = None, whole: bool = True) -> bool:
    """What `train.compile` means for this run: a bool as given; `auto` -> compile on CUDA, on a CPU
    compile when `measure` finds the compiled step at least MIN_GAIN faster, eager elsewhere (MPS) and
    on a CPU without a C++ compiler. The choice and the measured figures are passed to `log`.
    `measure(model_cfg, train_cfg, precision, device, whole=whole) -> CompileProbe` defaults to
    `measure_compile`; whole: the run compiles the whole model (a single process) rather than per block.

    `agree(values) -> values` sums the probe's two step times over processes (an all-reduce), so
    every rank takes the same decision. GPTFORGE_AUTO_COMPILE=true/false pins auto's result.
    `on_probe(probe)` is called with this process's CompileProbe when one was measured (the
    trainer's time budget reuses the chosen side's step time and counts the probe's cost).

    Raises:
        ValueError: a value that is neither a bool nor "auto".
    """
    say = log or (lambda m: None)
    if isinstance(value, bool):
        return value
    if value != "auto":
        raise ValueError(f"train.compile={value!r}: use true, false or auto")
    pinned = os.environ.get(AUTO_COMPILE_ENV)
    if pinned:
        return pinned.strip().lower() in ("1", "true", "yes", "on")
    if device.type == "cuda":
        say("train.compile auto -> true (CUDA)")
        return True
    if device.type != "cpu":
        say(f"train.compile auto -> false (torch.compile is not used on {device.type})")
        return False
    if cpp_compiler() is None:
        say("train.compile auto -> false: no C++ compiler (c++, g++ or clang++) on PATH for Inductor's CPU kernels")
        return False
    probe = (measure or measure_compile)(model_cfg, train_cfg, precision, device, whole=whole)
    if on_probe is not None:
        on_probe(probe)
    eager, compiled = probe.eager_s, probe.compiled_s
    if agree is not None:
        eager, compiled = agree([eager, compiled])
    chosen = compiled < (1 - MIN_GAIN) * eager
    how = "whole model" if whole else "per block"
    say(f"train.compile auto -> {str(chosen).lower()}: step {compiled * 1000:,.0f} ms compiled ({how}) vs "
        f"{eager * 1000:,.0f} ms eager ({precision}; probe {probe.total_s:.1f} s, of which "
        f"{probe.warmup_s:.1f} s compiling)")
    return chosen

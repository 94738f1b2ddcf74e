"""`train()`: start the processes' layout, build the data source and the Trainer, and run it.

The loop itself is `gptforge.train.trainer.Trainer.train`; this module is the library entry point
that `gptforge pretrain`, `gptforge finetune` and the quickstart call.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable

import torch

from gptforge.config import ModelConfig, RunConfig
from gptforge.errors import TrainingError
from gptforge.runtime.device import pick_device
from gptforge.train.objectives import Objective
from gptforge.train.parallel import distributed as D
from gptforge.train.sources import BatchSource, open_source
from gptforge.train.trainer import Trainer, TrainResult

if TYPE_CHECKING:
    from gptforge.train.resolve import ResolvedRun

__all__ = ["TrainResult", "start_processes", "train"]


def start_processes(cfg: RunConfig) -> tuple[RunConfig, D.DistEnv, dict | None]:
    """Join the process group the layout needs (or none), and resolve the DeepSpeed config.

    Returns: (the config as run, this process's DistEnv, the DeepSpeed config dict or None).

    Raises:
        InputError: a layout that does not fit the number of processes (see ParallelConfig.validate).
    """
    tc, pc = cfg.train, cfg.parallel
    if pc.backend == "deepspeed":
        from gptforge.train.parallel.deepspeed_config import deepspeed_run_config

        # Conflicts between the file and gptforge's config are reported before anything starts.
        cfg, ds_config, env_pc = deepspeed_run_config(cfg, int(os.environ.get("WORLD_SIZE", 1)))
        return cfg, D.init_distributed(env_pc, tc.device, force_group=True), ds_config
    world = int(os.environ.get("WORLD_SIZE", 1)) if D.launched_by_torchrun() else 1
    pc = pc.resolved(world)
    cfg = RunConfig(model=cfg.model, train=tc, parallel=pc)
    if D.launched_by_torchrun() or D.needs_process_group(pc):
        return cfg, D.init_distributed(pc, tc.device), None
    return cfg, D.DistEnv(device=pick_device(tc.device)), None


def train(cfg: RunConfig, data_dir: str | Path | list, run_dir: str | Path, resume: bool = False,
          progress: bool = True, log: Callable[[str], None] | None = None, *,
          model_factory: Callable[[ModelConfig], torch.nn.Module] | None = None,
          data: BatchSource | None = None, config_extra: dict[str, Any] | None = None,
          on_save: Callable[[int, Path], None] | None = None,
          objective: Objective | None = None) -> TrainResult:
    """Train a GPT on the token shards in `data_dir` (or on `data`), writing the run to `run_dir`.

    Args:
        cfg: model/train/parallel config; `model.vocab_size` defaults to the data's vocabulary.
            Parallel degrees of -1 take the rest of the world (see ParallelConfig.resolved).
        data_dir: a `gptforge prepare` output folder (meta.json + *.bin + tokenizer.json), or a
            list of them sharing a tokenizer (a mixture: gptforge.train.sources.mixture); ignored
            when `data` is given.
        run_dir: output folder (config.yaml, metrics.jsonl, tb/, checkpoints/).
        resume: continue from run_dir/checkpoints/latest (same config).
        model_factory: builds the model from the resolved ModelConfig in place of `GPT(cfg)`.
        data: a BatchSource (gptforge.train.sources) used instead of the shard folder.
        config_extra: extra top-level sections written into config.yaml (e.g. `finetune`).
        on_save: called on rank 0 as on_save(step, checkpoint_folder) after each checkpoint.
        objective: what a training step minimises (gptforge.train.objectives; default the
            summed next-token loss, e.g. gptforge.train.objectives.distill.Distillation).

    Returns: a TrainResult with the final step and losses.

    Raises:
        FileNotFoundError: missing data, or --resume without a complete checkpoint.
        FolderLockedError: another live process writes into run_dir (named in the message).
        InputError (a ValueError): inconsistent config or data.
        TrainingError (a RuntimeError): too many consecutive non-finite steps, or out of memory
            (the message gives the planner's fixes).
    """
    tc, requested = cfg.train, cfg.parallel
    tc.check_trainable()
    if tc.num_threads:
        torch.set_num_threads(tc.num_threads)
    cfg, env, ds_config = start_processes(cfg)
    from gptforge.runtime.host_memory import keep_freed_memory

    keep_freed_memory(device_type=env.device.type)  # no page faults on every step's buffers on a CPU
    lock = None
    advice_cfg: RunConfig | ResolvedRun = cfg
    try:
        if env.is_main:  # one writer per run directory: a second run or resume is refused, naming this one
            from gptforge.runtime.checkpoint import remove_partial_files
            from gptforge.runtime.lock import FolderLock

            lock = FolderLock(Path(run_dir), command=" ".join(["gptforge", "train", str(run_dir)])).acquire()
            remove_partial_files(Path(run_dir) / "checkpoints")
        log_main = log if env.is_main else None
        source = data if data is not None else open_source(data_dir, tc.eval_steps, tc.micro_batch_size, log_main)
        try:
            trainer = Trainer(cfg, env, source, Path(run_dir), resume, progress, log, model_factory=model_factory,
                              config_extra=config_extra, on_save=on_save, ds_config=ds_config,
                              requested_parallel=requested, objective=objective)
        except BaseException:
            source.close()
            raise
        advice_cfg = trainer.cfg  # resolved: vocabulary from the data, shape from the preset
        return trainer.train()
    except torch.OutOfMemoryError as e:
        raise TrainingError(out_of_memory_advice(advice_cfg, env.device)) from e
    finally:
        if lock is not None:
            lock.release()
        D.shutdown(env)


def out_of_memory_advice(cfg: RunConfig | ResolvedRun, device: torch.device) -> str:
    """The planner's predicted peak, the measured one and the cheapest changes that would fit."""
    from gptforge.plan.advice import out_of_memory_message

    capacity = measured = None
    if device.type == "cuda":
        capacity = torch.cuda.get_device_properties(device).total_memory
        measured = torch.cuda.max_memory_allocated(device)
    return out_of_memory_message(cfg.model, cfg.train, cfg.parallel, capacity, measured)

"""Reinforcement learning with verifiable rewards (`gptforge rl`): GRPO / DAPO on the one trainer.

What this module adds to `gptforge.train.run.train`: the starting model as fine-tuning loads it
(a Hugging Face folder or a gptforge run; full or LoRA, gptforge.train.workflows.finetune), the
rewards (gptforge.eval.rewards), the prompt rows rendered as fine-tuning renders them
(gptforge.eval.prompts), a `RolloutSource` that samples each rollout batch from the current
weights (gptforge.train.rl.source) and the `PolicyGradient` objective (gptforge.train.rl.objective).

Layouts: one process, or data parallel (DDP through torchrun: parallel.dp_replicate -1, dp_shard 1,
`gptforge rl`'s defaults); FSDP2, tensor and pipeline parallel and DeepSpeed are refused (sampling
runs on each rank's whole model).
The KL reference (rl.kl_beta > 0) is the starting model: with LoRA the base with the adapters
switched off (no second copy), with full fine-tuning a second, frozen copy loaded from --from.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path

import torch
import yaml

from gptforge.config import FinetuneConfig, RLConfig, RunConfig
from gptforge.errors import InputError, OptionError


def check_layout(cfg: RunConfig, fc: FinetuneConfig) -> None:
    """Refuse layouts RL does not run under, and qlora (one line each).

    Raises:
        InputError: FSDP2, tensor / pipeline / context parallel, DeepSpeed or finetune.method qlora.
    """
    pc = cfg.parallel.resolved(int(os.environ.get("WORLD_SIZE", "1")))
    if pc.uses_fsdp() or pc.tp > 1 or pc.pp > 1 or pc.backend == "deepspeed":
        raise OptionError("gptforge rl runs in one process or with DDP (parallel.dp_replicate, dp_shard 1, the default); FSDP2, "
                         "tensor and pipeline parallel and DeepSpeed are not supported for RL")
    if fc.method == "qlora":
        raise OptionError("finetune.method=qlora is not supported by gptforge rl; use full or lora")


def load_rewards(reward: str | None, rc: RLConfig):
    """The run's rewards from --reward SPEC or --rl.rewards FILE (exactly one of them).

    Raises:
        InputError: neither or both given, or a bad spec / file (gptforge.eval.rewards).
    """
    from gptforge.eval.rewards import load_rewards_file, parse_reward

    if (reward is None) == (rc.rewards is None):
        raise OptionError("give one of --reward SPEC (exact, regex:PATTERN, json_schema:FILE, python:FILE:FUNCTION) "
                         "or --rl.rewards FILE.yaml")
    return [parse_reward(reward)] if reward is not None else load_rewards_file(rc.rewards)


def _saved(run_dir: Path) -> dict:
    """The `rl_data` section of a run's config.yaml (prompts and reward of the first start)."""
    doc = yaml.safe_load((run_dir / "config.yaml").read_text()) if (run_dir / "config.yaml").is_file() else {}
    return (doc or {}).get("rl_data") or {}


def rl(rc: RLConfig, fc: FinetuneConfig, cfg: RunConfig, source: str | Path | None, prompts: str | Path | None,
       reward: str | None, run_dir: str | Path, resume: bool = False, progress: bool = True, log=None):
    """Train `source` by RL on `prompts` scored by `reward` into `run_dir`; returns the TrainResult.

    Raises:
        FileNotFoundError / InputError: missing or bad model, prompts, rewards or options (one line).
    """
    from gptforge.config import to_dict
    from gptforge.runtime.device import pick_device, resolve_precision
    from gptforge.train.run import train
    from gptforge.train.workflows.finetune import (
        _base_model,
        check_method,
        empty_model,
        load_chat_tokenizer,
        prepare_model,
        write_builtin_template,
    )

    say = log or (lambda m: None)
    run_dir = Path(run_dir)
    rc.check_values()
    check_layout(cfg, fc)
    saved = _saved(run_dir) if resume else {}
    prompts = prompts or saved.get("prompts")
    reward = reward if reward is not None or rc.rewards is not None else saved.get("reward")
    if prompts is None:
        raise OptionError("--prompts is required: a .jsonl of {\"prompt\", \"answer\"} or {\"messages\", \"answer\"} rows")
    rewards = load_rewards(reward, rc)
    device = pick_device(cfg.train.device)
    precision = resolve_precision(cfg.train.precision, device, say)
    cfg = RunConfig(model=cfg.model, train=dataclasses.replace(cfg.train, precision=precision), parallel=cfg.parallel)
    check_method(fc, device, precision, cfg.parallel)
    chat_template = None if rc.chat_template in ("auto", "default") else Path(rc.chat_template)
    if chat_template is not None and not chat_template.is_file():
        raise FileNotFoundError(f"rl.chat_template {chat_template}: no such file (or use auto / default)")
    model, mc, tok_dir, source = _base_model(run_dir, source, resume, chat_template, say)
    if tok_dir is None:
        raise FileNotFoundError(f"{source}: no tokenizer.json beside the model; RL prompts need the model's tokenizer")
    tok = load_chat_tokenizer(Path(tok_dir), chat_template if not resume else None)
    if not resume and int(os.environ.get("RANK", "0")) == 0:
        write_builtin_template(run_dir, tok, dataclasses.replace(fc, chat_template=rc.chat_template))
    source_data = _rollout_source(rc, fc, cfg, tok, mc, rewards, Path(prompts), run_dir, source)

    def model_factory(_mc):
        m = empty_model(mc) if model is None else model
        prepare_model(m, fc, device, precision, progress=progress)
        return m

    from gptforge.train.rl.objective import PolicyGradient

    base = str(Path(source).resolve()) if source is not None else None
    extra = {"rl": to_dict(rc), "finetune": to_dict(fc), "base_model": {"path": base},
             "rl_data": {"prompts": str(Path(prompts).resolve()), "reward": reward}}
    say(f"RL ({fc.method}, {rc.loss_unit}-level loss) on {len(source_data.prompts)} prompts")
    return train(RunConfig(model=mc, train=cfg.train, parallel=cfg.parallel), Path(prompts), run_dir, resume=resume,
                 progress=progress, log=log, model_factory=model_factory, data=source_data, config_extra=extra,
                 objective=PolicyGradient(rc))


def _rollout_source(rc: RLConfig, fc: FinetuneConfig, cfg: RunConfig, tok, mc, rewards, prompts: Path,
                    run_dir: Path, base):
    """The RolloutSource of a run: prompts (and held-out prompts) read and checked, the decoder,
    and the KL reference when rl.kl_beta > 0."""
    from gptforge.data.chat import DEFAULT_TEMPLATE
    from gptforge.eval.prompts import read_prompts
    from gptforge.train.rl.source import RolloutSource

    template = DEFAULT_TEMPLATE if rc.chat_template == "default" else None
    if not Path(prompts).is_file():  # said first: a missing file is the mistake, not the options
        raise InputError(f"--prompts {prompts}: no such file (a .jsonl of rows with 'prompt' or 'messages', "
                         "and what the reward needs, e.g. 'answer')")
    room = mc.block_size - rc.max_new_tokens
    if room < 1:
        raise OptionError(f"rl.max_new_tokens={rc.max_new_tokens} leaves no room for a prompt in the model's "
                         f"block_size {mc.block_size}")
    rows = read_prompts(prompts, tok, rewards, template, room)
    held = read_prompts(rc.eval_prompts, tok, rewards, template, room) if rc.eval_prompts else None
    vocab = tok.tokenizer.get_vocab_size(with_added_tokens=True)

    def decode(ids: list[int]) -> str:
        return tok.tokenizer.decode(ids, skip_special_tokens=False)

    reference = _reference(rc, fc, base) if rc.kl_beta else None
    return RolloutSource(rows, held, rewards, rc, cfg.train.seed, tok.eos_id, decode, vocab, prompts, run_dir,
                         reference)


def _reference(rc: RLConfig, fc: FinetuneConfig, base):
    """reference(handle) -> (input_ids, P) -> log pi_ref (G, T) of the KL penalty (module docstring)."""
    from gptforge.train.rl.batch import adapters_off
    from gptforge.train.rl.rollout import completion_logprobs

    if fc.method != "full":
        def lora_reference(handle):
            def logprobs(ids: torch.Tensor, P: int) -> torch.Tensor:
                with adapters_off(handle.core):
                    return completion_logprobs(handle.core, ids, P, rc.temperature)
            return logprobs
        return lora_reference
    if base is None:
        raise InputError("rl.kl_beta > 0 with finetune.method full needs the starting model: give --from")
    from gptforge.runtime.loading import load_pretrained

    frozen, _ = load_pretrained(Path(base), dtype=torch.float32)
    frozen.eval().requires_grad_(False)

    def full_reference(handle):
        ref = frozen.to(handle.device)

        def logprobs(ids: torch.Tensor, P: int) -> torch.Tensor:
            return completion_logprobs(ref, ids, P, rc.temperature)
        return logprobs
    return full_reference

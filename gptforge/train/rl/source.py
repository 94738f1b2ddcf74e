"""Rollouts as the trainer's batch source: given the model, each step's batches are sampled from it.

`RolloutSource.bind` keeps the laid-out policy; `batches` builds a `RolloutSampler`
(gptforge.train.rl.sampler) over the prompts; each optimizer step's micro-batches are its
mini-batch cut into micro-batches of train.micro_batch_size completions. Sampling runs on the
policy's core module (the GPT itself, no data-parallel wrapper: generation syncs no gradients),
in eval mode, under the run's autocast.

Held-out evaluation (`evaluate`, every train.eval_interval steps when rl.eval_prompts is given):
greedy pass@1 over the held-out prompts (gptforge.train.rl.heldout), the samples written to
RUN_DIR/samples/step_N.jsonl. The trainer's `val_loss` of an RL run is the negated mean held-out
reward (lower is better, so train.best_metric val_loss keeps the checkpoint with the highest
reward); `val_metrics` adds eval/pass@1 and eval/reward/NAME, which train.best_metric may also
name (`val_metric_names`, higher is better).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch

from gptforge.config.rl import RLConfig
from gptforge.eval.prompts import PromptRow
from gptforge.eval.rewards import Reward
from gptforge.runtime.device import autocast_context
from gptforge.train.provenance import data_provenance
from gptforge.train.rl.batch import split_rows
from gptforge.train.rl.heldout import evaluate_prompts
from gptforge.train.rl.sampler import RolloutSampler
from gptforge.train.sources.base import BatchesBase, ModelHandle, SourceBase


class RolloutBatches(BatchesBase):
    """One rank's rollout micro-batches (module docstring). tokens_per_step counts prompt +
    max_new_tokens per completion (an upper bound: the real figure is in the step's rl/ metrics)."""

    def __init__(self, sampler: RolloutSampler, handle: ModelHandle, micro_batch_size: int, seq_len: int):
        self.sampler, self.handle, self.micro_batch_size = sampler, handle, micro_batch_size
        c = sampler.cfg
        self.global_batch_size = max(1, c.prompts_per_step * c.samples_per_prompt // c.updates_per_batch)
        self.seq_len = seq_len
        self.tokens_per_step = self.global_batch_size * seq_len
        self.sampled_at: int | None = None
        self.last_step: int | None = None

    def micro_batches(self, step: int) -> list:
        self.last_step = step
        held = self.sampler.batch_index
        core = self.handle.core
        with autocast_context(self.handle.device, self.handle.precision):
            rows = self.sampler.mini_batch(core, step)
        self.sampled_at = step if self.sampler.batch_index != held else None
        n = rows["advantages"].size(0)
        return split_rows(rows, max(1, math.ceil(n / self.micro_batch_size)))

    def step_metrics(self, step: int) -> dict[str, Any]:
        m = {f"rl/{k}": v for k, v in self.sampler.metrics.items() if k != "sampling_seconds"}
        seconds = self.sampler.metrics.get("sampling_seconds", 0.0) if self.sampled_at == step else 0.0
        m["rl/sampling_seconds"] = seconds
        if seconds > 0:
            m["rl/generation_tokens_per_second"] = self.sampler.metrics.get("sampled_tokens", 0.0) / seconds
        return m


class RolloutSource(SourceBase):
    """Prompts and rewards as a `BatchSource` whose batches are sampled from the bound model.

    reference(input_ids (G, P+T), P) -> (G, T): the KL reference's log-probs (rl.kl_beta > 0),
    given the model handle (e.g. LoRA adapters switched off on handle.core); None without KL.
    """

    def __init__(self, prompts: Sequence[PromptRow], eval_prompts: Sequence[PromptRow] | None,
                 rewards: Sequence[Reward], cfg: RLConfig, seed: int, eos_id: int,
                 decode: Callable[[list[int]], str], vocab_size: int, prompts_path: Path, run_dir: Path,
                 reference: Callable[[ModelHandle], Callable[[torch.Tensor, int], torch.Tensor]] | None = None):
        self.prompts, self.eval_prompts, self.rewards, self.cfg = list(prompts), eval_prompts, list(rewards), cfg
        self.seed, self.eos_id, self.decode, self.vocab_size = seed, eos_id, decode, vocab_size
        self.prompts_path, self.run_dir, self.reference = Path(prompts_path), Path(run_dir), reference
        self.has_val = bool(eval_prompts)
        self.val_metric_names = (("eval/pass@1", *(f"eval/reward/{r.name}" for r in self.rewards)) if eval_prompts
                                 else ())
        self.tokenizer_file: Path | None = None  # the run directory already holds the model's tokenizer
        longest = max(len(p.ids) for p in self.prompts)
        self.seq_len = longest + cfg.max_new_tokens
        held = f", {len(eval_prompts)} held-out prompts" if eval_prompts else ""
        self.description = (f"{self.prompts_path.name}: {len(self.prompts):,} prompts (longest {longest} tokens){held}; "
                            f"{cfg.prompts_per_step} prompts x {cfg.samples_per_prompt} samples per rollout batch, "
                            f"rewards {', '.join(f'{r.weight:g} x {r.name}' for r in self.rewards)}")
        self.handle: ModelHandle | None = None
        self.batches_: RolloutBatches | None = None
        self.pending_state: dict[str, Any] | None = None
        self.last_eval: dict[str, float] = {}

    def check_window(self, block_size: int) -> None:
        from gptforge.errors import InputError

        if self.seq_len > block_size:
            raise InputError(f"{self.prompts_path}: the longest prompt + rl.max_new_tokens is {self.seq_len} tokens, "
                             f"more than the model's block_size {block_size}; lower rl.max_new_tokens")

    def bind(self, model: ModelHandle) -> None:
        self.handle = model

    def extra_memory_bytes(self) -> int:
        """The KV cache of one group's sampling (gptforge.infer.slots.kv_cache_bytes): G rows of the
        longest prompt + rl.max_new_tokens positions (groups are sampled one at a time)."""
        from gptforge.infer.slots import kv_cache_bytes

        assert self.handle is not None, "the trainer binds the model before asking for its memory"
        core: Any = self.handle.core  # the GPT itself (module docstring)
        return kv_cache_bytes(core, self.cfg.samples_per_prompt, self.seq_len)

    def batches(self, block_size: int, tc, dp_rank: int, dp_size: int) -> RolloutBatches:
        assert self.handle is not None, "the trainer binds the model before asking for batches"
        env = self.handle.env
        sampler = RolloutSampler(self.prompts, self.rewards, self.cfg, self.seed, self.eos_id, self.decode,
                                 dp_rank, dp_size, all_reduce_sum=env.all_reduce_sum, gather=env.gather_stats,
                                 reference=self.reference(self.handle) if self.reference is not None else None)
        if self.pending_state is not None:
            sampler.load_state_dict(self.pending_state)
        self.batches_ = RolloutBatches(sampler, self.handle, tc.micro_batch_size, self.seq_len)
        return self.batches_

    @torch.no_grad()
    def evaluate(self, model: torch.nn.Module, device: torch.device, precision: str,
                 should_stop: Callable[[], bool] | None = None) -> float | None:
        if not self.eval_prompts or self.handle is None:
            return None
        last = self.batches_.last_step if self.batches_ is not None else None
        done = 0 if last is None else last + 1
        out = self.run_dir / "samples" / f"step_{done}.jsonl" if self.handle.env.is_main else None
        core = self.handle.core
        with autocast_context(device, precision):
            m = evaluate_prompts(core, self.eval_prompts, self.rewards, self.cfg.max_new_tokens, self.eos_id,
                                 self.decode, out)
        self.last_eval = {f"eval/{k}": v for k, v in m.items()}
        return -m["pass@1"]

    def val_metrics(self) -> dict[str, float]:
        return dict(self.last_eval)

    def provenance(self) -> dict:
        prov = data_provenance(self.prompts_path)
        prov["rewards"] = [{"reward": r.name, "weight": r.weight} for r in self.rewards]
        return prov

    def check_resume(self, saved: dict, checkpoint: Path) -> None:
        """Nothing to compare: the prompts' hash is in the run's provenance, the tokenizer is the run's own."""

    def state_dict(self) -> dict[str, Any]:
        """Every rank's held rollout batch ({"per_rank": [rank 0's, rank 1's, ...]}): the checkpoint
        keeps rank 0's trainer state, so the ranks' states are gathered there (a collective: the
        trainer saves on every rank)."""
        mine = self.batches_.sampler.state_dict() if self.batches_ is not None else {}
        env = self.handle.env if self.handle is not None else None
        if env is None or env.dp_size == 1:
            return {"per_rank": [mine]}
        import torch.distributed as dist

        mine = {k: ([{n: t.cpu() for n, t in m.items()} for m in v] if k == "minis" else v) for k, v in mine.items()}
        gathered: list[Any] = [None] * env.world_size
        dist.all_gather_object(gathered, mine)
        return {"per_rank": gathered}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        per_rank = state.get("per_rank") or [{}]
        rank = self.handle.env.dp_rank if self.handle is not None else 0
        state = per_rank[rank] if rank < len(per_rank) else {}
        if self.batches_ is not None:
            self.batches_.sampler.load_state_dict(state)
        else:
            self.pending_state = state


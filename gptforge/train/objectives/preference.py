"""Preference tuning as an `Objective`: DPO and its relatives on pair batches (`gptforge finetune
--finetune.objective dpo`).

The losses, rewards and log-probs are `gptforge.runtime.preference.PreferenceLoss`'s (TRL's
definitions, checked against TRL 1.16 in tests/runtime/test_preference_trl.py). The unit is the
pair: a micro-batch of b pairs (2b rows, `gptforge.data.preference.PairDataset.batch`) counts b,
so a step's loss is the mean over its pairs whatever the micro-batches and ranks, as TRL's batch
mean. Metrics (TRL's names, means over the step's pairs): rewards/chosen, rewards/rejected,
rewards/accuracies, rewards/margins, logps/chosen, logps/rejected.

The reference (sigmoid, ipo) is a `Reference`:
- adapters_off (LoRA/QLoRA): the policy itself with its adapters disabled
  (`gptforge.model.lora.adapters_disabled`), no extra weights;
- copy (full fine-tuning): the base model loaded again and laid out like the policy
  (`Layout.place`: device, tensor parallel, FSDP2 sharding), frozen;
- precomputed (`finetune.precompute_ref`): every pair's reference log-probs computed once at
  set-up with one of the above (the copy is then freed), written to RUN_DIR/ref_logps.pt and
  carried in every checkpoint, so --resume reads them back instead of recomputing.
No divergence ceiling: the loss has no ln V bound (the absolute spike ceiling is off; the
relative spike alarm and rollback watch this loss like any other).
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any, Callable, Literal

import numpy as np
import torch

from gptforge.runtime.preference import METRIC_NAMES, PreferenceLoss, pair_logps
from gptforge.train.objectives.base import Forward, Layout, ObjectiveBase, ObjectiveLoss

REF_FILE = "ref_logps.pt"
"""Precomputed reference log-probs in the run folder: {"fingerprint", "train", "val"} (N, 2) float64."""

ReferenceMode = Literal["none", "adapters_off", "copy", "precomputed"]


class Reference:
    """The reference log-probs of pair batches (see the module docstring for the modes).

    datasets: {"train": PairDataset, "val": PairDataset} (val optional), for `precomputed`;
    factory: builds the base model (CPU, fp32) for `copy` and a full-fine-tuning `precomputed`;
    fingerprint: names the data and base model the precomputed table belongs to.
    """

    def __init__(self, mode: ReferenceMode, factory: Callable[[], torch.nn.Module] | None = None,
                 datasets: dict | None = None, fingerprint: str = "", lora: bool = False):
        self.mode, self.factory, self.lora = mode, factory, lora
        self.datasets = datasets or {}
        self.fingerprint = fingerprint
        self.tables: dict[str, torch.Tensor] = {}
        self._module: torch.nn.Module | None = None
        self._policy: torch.nn.Module | None = None

    def setup(self, layout: Layout) -> None:
        """Place the reference (or read / compute the precomputed table) once the policy is laid out."""
        if self.mode == "none":
            return
        self._policy = layout.policy.core
        if self.mode == "copy" or (self.mode == "precomputed" and not self.lora):
            self._module = layout.place(self._build())
        if self.mode == "precomputed":
            self._precompute(layout)
            self._module = None  # the copy served its purpose: free it before training

    def _build(self) -> torch.nn.Module:
        from gptforge.errors import InputError

        if self.factory is None:
            raise InputError("the DPO reference needs the base model (--from); none is known for this run")
        return self.factory()

    @torch.no_grad()
    def module_logps(self, batch: dict, autocast: Callable) -> tuple[torch.Tensor, torch.Tensor]:
        """(chosen, rejected) reference log-probs (b,) fp32 of `batch` (on the device) by a forward."""
        from gptforge.model.lora import adapters_disabled

        if self._module is not None:
            return pair_logps(self._module, batch, autocast=autocast)
        assert self._policy is not None, "Reference.setup was not called"
        was = self._policy.training
        self._policy.eval()  # no dropout in the reference
        try:
            with adapters_disabled(self._policy):
                return pair_logps(self._policy, batch, autocast=autocast)
        finally:
            self._policy.train(was)

    def logps(self, batch: dict, split: str, autocast: Callable) -> tuple[torch.Tensor, torch.Tensor]:
        """(chosen, rejected) reference log-probs (b,) of `batch`: from the table or a forward."""
        if self.mode == "precomputed":
            ref = self.tables[split][batch["index"].cpu()].to(batch["input_ids"].device, torch.float32)
            return ref[:, 0], ref[:, 1]
        return self.module_logps(batch, autocast)

    def _precompute(self, layout: Layout) -> None:
        from gptforge.atomic import atomic_path
        from gptforge.runtime.device import autocast_context

        path = Path(layout.run_dir) / REF_FILE
        if path.is_file():
            saved = torch.load(path, map_location="cpu", weights_only=True)
            if saved.get("fingerprint") == self.fingerprint:
                self.tables = {k: v for k, v in saved.items() if k != "fingerprint"}
                return
        device = layout.policy.device

        def autocast():
            return autocast_context(device, layout.policy.precision)

        for split, ds in self.datasets.items():
            rows = []
            for start in range(0, len(ds), 8):
                batch = {k: v.to(device) for k, v in ds.batch(range(start, min(start + 8, len(ds)))).items()}
                c, r = self.module_logps(batch, autocast)
                rows.append(torch.stack([c, r], 1).double().cpu())
            self.tables[split] = torch.cat(rows)
        if layout.policy.env.rank == 0:
            with atomic_path(path) as tmp:
                torch.save({"fingerprint": self.fingerprint, **self.tables}, tmp)

    def state_dict(self) -> dict[str, Any]:
        return {"fingerprint": self.fingerprint, **self.tables} if self.mode == "precomputed" else {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if self.mode == "precomputed" and state.get("fingerprint") == self.fingerprint:
            self.tables = {k: v for k, v in state.items() if k != "fingerprint"}


class Preference(ObjectiveBase):
    """`PreferenceLoss` summed over a micro-batch's pairs; unit: pairs (module docstring)."""

    name = "preference loss (dpo)"
    unit = "pairs"
    metric_names = METRIC_NAMES

    def __init__(self, loss: PreferenceLoss, reference: Reference):
        self.loss_fn, self.reference = loss, reference

    def setup(self, layout: Layout) -> None:
        self.reference.setup(layout)

    def count(self, micro_batch: Any) -> int:
        return int(micro_batch["index"].numel())

    def pair_loss(self, logits: torch.Tensor, batch: dict, split: str, autocast: Callable
                  ) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """(summed loss, per-pair metrics) of `batch` given the policy's logits (2b, T, V)."""
        ref_c = ref_r = None
        if self.loss_fn.needs_reference:
            ref_c, ref_r = self.reference.logps(batch, split, autocast)
        return self.loss_fn(logits, batch, ref_c, ref_r)

    def loss(self, forward: Forward, micro_batch: Any) -> ObjectiveLoss:
        logits = forward(micro_batch["input_ids"])
        total, metrics = self.pair_loss(logits, micro_batch, "train", forward.autocast)
        b = self.count(micro_batch)
        return ObjectiveLoss(total, {k: (v.sum(), b) for k, v in metrics.items()})

    def state_dict(self) -> dict[str, Any]:
        return self.reference.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.reference.load_state_dict(state)


def fingerprint(data: Path, base: str | None, tokenizer_json: Path | None, block_size: int) -> str:
    """Names the precomputed reference table: the pair file's bytes, the base model path, the
    tokenizer and the length bound (any change computes it again)."""
    h = hashlib.sha256()
    for f in (data, tokenizer_json):
        if f is not None and Path(f).is_file():
            h.update(Path(f).read_bytes())
    h.update(f"{base}|{block_size}".encode())
    return h.hexdigest()[:16]


def split_pairs(n: int, val_fraction: float, seed: int) -> tuple[list[int], list[int]]:
    """(train, val) pair indices, sorted: a Philox permutation keyed on `seed` holds out
    int(n * val_fraction) pairs (at most n - 1), as instruction data is split."""
    n_val = min(int(n * val_fraction) if val_fraction > 0 else 0, n - 1)
    order = np.random.Generator(np.random.Philox(key=[seed & (2**64 - 1), 0x5EED])).permutation(n)
    return sorted(order[n_val:].tolist()), sorted(order[:n_val].tolist())

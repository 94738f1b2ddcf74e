"""The preference-tuning parts of `gptforge finetune --finetune.objective dpo`: the pair source,
the loss and where its reference comes from (gptforge.train.objectives.preference)."""

from __future__ import annotations

import dataclasses
from pathlib import Path

from gptforge.config import FinetuneConfig, TrainConfig

# The DPO objective's default peak lr, by model width (train.lr unset; see `dpo_default_lr`).
# DPO_LR_AT_64 is the best of bench/preference.py --sweep (a d_model 64 model SFT'd by gptforge,
# and its Hugging Face export; 40 steps, lr 1e-5 .. 3e-3): every lr from 1e-5 up gets the held-out
# implicit reward right (97-100% of pairs), but only 1e-5 also raised the share of correct greedy
# answers (50% -> 63%); 1e-4 and above push the chosen answers down with the rejected ones and
# the greedy answers fall (to 16% and 6%) (bench/RESULTS.md "Preference tuning"). The exponent
# makes d_model 4096 (7B models) land on TRL's 1e-6, the value DPOTrainer's default was set for.
DPO_LR_AT_64, DPO_LR_AT_4096 = 1e-5, 1e-6
DPO_WARMUP_FRACTION = 0.1


def dpo_default_lr(d_model: int) -> float:
    """The DPO objective's peak lr when train.lr is unset: DPO_LR_AT_64 * (64 / d_model)^k, k =
    log(DPO_LR_AT_64 / DPO_LR_AT_4096) / log(64) (about 0.55, next to the 0.6 of the pretraining
    rule `gptforge.train.optim.default_lr`), two significant digits (d_model 64: 1e-05; 768:
    2.5e-06; 2048: 1.5e-06; 4096: 1e-06). finetune's 2e-4 is 20x past what kept a small model's
    greedy answers; TRL's 1e-6 is for 7B models."""
    import math

    k = math.log(DPO_LR_AT_64 / DPO_LR_AT_4096) / math.log(64)
    return float(f"{DPO_LR_AT_64 * (64 / d_model) ** k:.2g}")


def dpo_train_defaults(tc: TrainConfig, d_model: int) -> TrainConfig:
    """`tc` with the DPO objective's defaults for what is unset: lr (`dpo_default_lr`), min_lr
    (lr / 10) and warmup_steps (DPO_WARMUP_FRACTION of max_steps, at least 1, as TRL's DPO
    recipes' warmup_ratio 0.1). `gptforge finetune` leaves these unset for --finetune.objective
    dpo unless given (a resumed run has its saved values)."""
    lr = tc.lr if tc.lr is not None else dpo_default_lr(d_model)
    warmup = tc.warmup_steps if tc.warmup_steps is not None else max(1, round(DPO_WARMUP_FRACTION * tc.max_steps))
    return dataclasses.replace(tc, lr=lr, min_lr=tc.min_lr if tc.min_lr is not None else lr / 10,
                               warmup_steps=min(warmup, tc.max_steps))


def reference_mode(fc: FinetuneConfig) -> str:
    """none (simpo, orpo), precomputed (finetune.precompute_ref), adapters_off (LoRA/QLoRA) or copy."""
    from gptforge.runtime.preference import REFERENCE_FREE

    if fc.dpo_loss in REFERENCE_FREE:
        return "none"
    if fc.precompute_ref:
        return "precomputed"
    return "copy" if fc.method == "full" else "adapters_off"


def preference_parts(fc: FinetuneConfig, data: Path, tok, seq_len: int, seed: int, base: str | None,
                     tokenizer_json: Path | None):
    """(PairSource, Preference objective) of a DPO run on the pair file `data`.

    base: the base model's folder (the reference copy is loaded from it again, so a resumed run
    has it too); tokenizer_json: fingerprints the precomputed reference table.

    Raises:
        OptionError: a bad dpo option (see `PreferenceLoss`). InputError: data that is not a .jsonl file, bad
            rows (see `gptforge.data.preference.load_pairs`).
    """
    from gptforge.errors import InputError
    from gptforge.runtime.preference import PreferenceLoss
    from gptforge.train.objectives.preference import Preference, Reference, fingerprint
    from gptforge.train.sources.pairs import PairSource

    if not data.is_file():
        raise InputError(f"--data {data}: finetune.objective dpo takes a .jsonl of prompt/chosen/rejected pairs, "
                         "not a shard folder")
    loss = PreferenceLoss(fc.dpo_loss, fc.dpo_beta, fc.simpo_gamma, fc.rpo_alpha)  # OptionError on a bad value
    mode = reference_mode(fc)

    def load_base():
        import torch

        from gptforge.runtime.loading import load_pretrained

        return load_pretrained(Path(base), dtype=torch.float32)[0]

    reference = Reference(mode, load_base if base is not None else None,  # type: ignore[arg-type]
                          fingerprint=fingerprint(data, base, tokenizer_json, seq_len), lora=fc.method != "full")
    objective = Preference(loss, reference)
    source = PairSource(data, tok, seq_len, fc, seed, objective)
    reference.datasets = source.datasets()
    return source, objective

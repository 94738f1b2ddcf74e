"""The preference-tuning parts of `gptforge finetune --finetune.objective dpo`: the pair source,
the loss and where its reference comes from (gptforge.train.objectives.preference)."""

from __future__ import annotations

from pathlib import Path

from gptforge.config import FinetuneConfig


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
        InputError: a bad dpo option (see `PreferenceLoss`), data that is not a .jsonl file, bad
            rows (see `gptforge.data.preference.load_pairs`).
    """
    from gptforge.errors import InputError
    from gptforge.runtime.preference import PreferenceLoss
    from gptforge.train.objectives.preference import Preference, Reference, fingerprint
    from gptforge.train.sources.pairs import PairSource

    if not data.is_file():
        raise InputError(f"--data {data}: finetune.objective dpo takes a .jsonl of prompt/chosen/rejected pairs, "
                         "not a shard folder")
    try:
        loss = PreferenceLoss(fc.dpo_loss, fc.dpo_beta, fc.simpo_gamma, fc.rpo_alpha)
    except ValueError as e:
        raise InputError(str(e)) from None
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

"""Write a gptforge model as a Hugging Face folder that transformers and vLLM load.

The folder holds `config.json`, `model.safetensors` (or `model-0000i-of-0000n.safetensors` shards
with `model.safetensors.index.json` above `max_shard_bytes`), `generation_config.json`, and the
tokenizer: Hugging Face tokenizer files are copied as they are; a bare `tokenizer.json` (gptforge's
own byte-level BPE) gets a `tokenizer_config.json` naming `PreTrainedTokenizerFast` and its
special tokens, so `AutoTokenizer.from_pretrained` loads it.

The folder is written next to its destination under a temporary name, every file fsynced, then
renamed into place: a killed export leaves either the previous folder or none, never half of one.
"""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import torch

from gptforge.atomic import atomic_write_bytes, default_mode, fsync_dir, fsync_file, replace_dir
from gptforge.config import ModelConfig
from gptforge.model.hf import config_to_hf, state_dict_to_hf

# Tokenizer files of a Hugging Face folder, copied verbatim when present.
TOKENIZER_FILES = (
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "tokenizer.model",
    "vocab.json", "merges.txt", "added_tokens.json", "chat_template.jinja", "chat_template.json",
)

EOS_CANDIDATES = ("<|endoftext|>", "</s>", "<|end_of_text|>", "<|eot_id|>", "<|im_end|>")
"""Special tokens taken as end-of-sequence for a bare tokenizer.json, in this order of preference."""


def _json_bytes(obj) -> bytes:
    return (json.dumps(obj, indent=2, sort_keys=True) + "\n").encode()


def tokenizer_special_ids(tokenizer_json: Path) -> dict[str, int]:
    """Special (added) tokens of a tokenizer.json: {content: id}."""
    data = json.loads(Path(tokenizer_json).read_text())
    return {t["content"]: t["id"] for t in data.get("added_tokens", []) if t.get("special", False)}


def carry_chat_template(files: dict[str, bytes]) -> dict[str, bytes]:
    """{name: bytes} of tokenizer files with tokenizer_config.json's `chat_template` set to the text
    of chat_template.jinja when both are there (readers that look only at tokenizer_config.json,
    older transformers and vLLM among them, then see the template the folder's jinja file holds)."""
    if "chat_template.jinja" not in files or "tokenizer_config.json" not in files:
        return files
    config = json.loads(files["tokenizer_config.json"])
    config["chat_template"] = files["chat_template.jinja"].decode()
    return {**files, "tokenizer_config.json": _json_bytes(config)}


def bare_tokenizer_config(tokenizer_json: Path, model_max_length: int) -> tuple[dict, dict]:
    """(tokenizer_config.json, special_tokens_map.json) for a tokenizer.json that has neither.

    The end-of-text token (first of `EOS_CANDIDATES` among its special tokens) serves as BOS, EOS
    and UNK, as GPT-2's tokenizer does; no BOS is prepended on encode (gptforge trains without one).

    Raises:
        ValueError: the tokenizer has none of the `EOS_CANDIDATES` special tokens.
    """
    specials = tokenizer_special_ids(tokenizer_json)
    eos = next((t for t in EOS_CANDIDATES if t in specials), None)
    if eos is None:
        raise ValueError(
            f"{tokenizer_json}: no end-of-text special token (one of {', '.join(EOS_CANDIDATES)}); "
            "add one when training the tokenizer, or provide a tokenizer_config.json beside it"
        )
    special_map = {"bos_token": eos, "eos_token": eos, "unk_token": eos}
    config = {
        "tokenizer_class": "PreTrainedTokenizerFast",
        **special_map,
        "add_bos_token": False,
        "add_eos_token": False,
        "clean_up_tokenization_spaces": False,
        "model_max_length": model_max_length,
    }
    return config, special_map


def save_hf(
    model: torch.nn.Module | dict[str, torch.Tensor],
    cfg: ModelConfig,
    out_dir: str | Path,
    tokenizer_dir: str | Path | None = None,
    base_config: dict | None = None,
    generation_config: dict | None = None,
    dtype: torch.dtype | None = None,
    max_shard_bytes: int = 5 * 2**30,
    overwrite: bool = False,
) -> Path:
    """Write `model` (a gptforge GPT or its state dict) as a Hugging Face folder at `out_dir`.

    tokenizer_dir: folder whose tokenizer files are copied (see `TOKENIZER_FILES`); a bare
        tokenizer.json gets a generated tokenizer_config.json. None: no tokenizer is written.
    base_config: the config.json the model was converted from (kept when shapes match, see
        `config_to_hf`). generation_config: written as generation_config.json (default: BOS/EOS
        ids from the tokenizer or base config).
    dtype: tensor dtype written (default: the model's). max_shard_bytes: shard size limit (bytes).

    Returns the folder path.

    Raises:
        FileExistsError: out_dir exists and overwrite is False.
        ValueError: a tokenizer without an end-of-text token (see `bare_tokenizer_config`).
    """
    from safetensors.torch import save_file

    out_dir = Path(out_dir)
    if out_dir.exists() and not overwrite:
        raise FileExistsError(f"{out_dir} exists; choose another --out or pass --overwrite")
    sd = model.state_dict() if isinstance(model, torch.nn.Module) else dict(model)
    hf_sd = state_dict_to_hf(sd, cfg)
    dtype = dtype or sd["wte.weight"].dtype
    hf_sd = {k: (v.to(dtype) if v.is_floating_point() else v) for k, v in hf_sd.items()}

    tok_files: dict[str, bytes] = {}
    bos = eos = None
    if base_config is not None:
        bos, eos = base_config.get("bos_token_id"), base_config.get("eos_token_id")
    if tokenizer_dir is not None:
        tokenizer_dir = Path(tokenizer_dir)
        for name in TOKENIZER_FILES:
            if (tokenizer_dir / name).is_file():
                tok_files[name] = (tokenizer_dir / name).read_bytes()
        if not tok_files:
            raise FileNotFoundError(f"{tokenizer_dir}: no tokenizer files ({', '.join(TOKENIZER_FILES[:4])}, ...)")
        if "tokenizer.json" in tok_files and "tokenizer_config.json" not in tok_files:
            tcfg, smap = bare_tokenizer_config(tokenizer_dir / "tokenizer.json", cfg.block_size)
            tok_files["tokenizer_config.json"] = _json_bytes(tcfg)
            tok_files["special_tokens_map.json"] = _json_bytes(smap)
            specials = tokenizer_special_ids(tokenizer_dir / "tokenizer.json")
            bos = bos if bos is not None else specials[tcfg["bos_token"]]
            eos = eos if eos is not None else specials[tcfg["eos_token"]]
        tok_files = carry_chat_template(tok_files)
    hf_config = config_to_hf(cfg, dtype=dtype, bos_token_id=bos, eos_token_id=eos, base=base_config)
    if generation_config is None:
        generation_config = {
            k: v for k, v in (("bos_token_id", hf_config.get("bos_token_id")),
                              ("eos_token_id", hf_config.get("eos_token_id"))) if v is not None
        }

    out_dir.parent.mkdir(parents=True, exist_ok=True)
    tmp = out_dir.parent / f".{out_dir.name}.tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    tmp.mkdir()
    try:
        _write_weights(hf_sd, tmp, max_shard_bytes, save_file)
        atomic_write_bytes(tmp / "config.json", _json_bytes(hf_config))
        atomic_write_bytes(tmp / "generation_config.json", _json_bytes(generation_config))
        for name, data in tok_files.items():
            atomic_write_bytes(tmp / name, data)
        fsync_dir(tmp)
        replace_dir(tmp, out_dir)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return out_dir


def _write_weights(hf_sd: dict[str, torch.Tensor], folder: Path, max_shard_bytes: int, save_file) -> None:
    """model.safetensors, or shards + model.safetensors.index.json when over max_shard_bytes."""
    total = sum(t.numel() * t.element_size() for t in hf_sd.values())
    meta = {"format": "pt"}
    if total <= max_shard_bytes:
        save_file(hf_sd, str(folder / "model.safetensors"), metadata=meta)
        default_mode(folder / "model.safetensors")
        fsync_file(folder / "model.safetensors")
        return
    shards: list[dict[str, torch.Tensor]] = [{}]
    size = 0
    for name, t in hf_sd.items():
        nbytes = t.numel() * t.element_size()
        if shards[-1] and size + nbytes > max_shard_bytes:
            shards.append({})
            size = 0
        shards[-1][name] = t
        size += nbytes
    weight_map = {}
    for i, shard in enumerate(shards, 1):
        fname = f"model-{i:05d}-of-{len(shards):05d}.safetensors"
        save_file(shard, str(folder / fname), metadata=meta)
        default_mode(folder / fname)
        fsync_file(folder / fname)
        weight_map.update({name: fname for name in shard})
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    atomic_write_bytes(folder / "model.safetensors.index.json", _json_bytes(index))


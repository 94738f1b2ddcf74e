"""The model-loading API: checkpoints and Hugging Face folders -> GPT, and a run -> Hugging Face.

- `load_pretrained(path)`: a Hugging Face folder or a gptforge run / checkpoint -> (GPT, sources).
- `load_model_checkpoint(path)`: a run or checkpoint -> plain GPT (LoRA merged), weights only.
- `load_for_inference(path, device)`: the same, in eval mode, with its config and tokenizer path.
- `from_hf(hf_dir, out)` / `to_hf(ckpt, out)`: a Hugging Face folder <-> a gptforge run directory.
"""

from __future__ import annotations

import json
import shutil
import warnings
from pathlib import Path

import torch

from gptforge.atomic import atomic_write_text, staged_dir
from gptforge.runtime.checkpoint import find_checkpoint, load_model_weights, refuse_quantized, save_checkpoint
from gptforge.runtime.consolidated import read_consolidated


class _SkipRandomInit(torch.overrides.TorchFunctionMode):
    """Turns the random initializers (`torch.nn.init.normal_/uniform_/kaiming_*/xavier_*/...`,
    `Tensor.normal_/uniform_`) into no-ops: for a model whose every tensor is loaded next."""

    def __torch_function__(self, func, types, args=(), kwargs=None):
        kwargs = kwargs or {}
        if func in _RANDOM_INIT:
            return args[0] if args else kwargs.get("tensor", kwargs.get("self"))
        return func(*args, **kwargs)


_RANDOM_INIT = {torch.Tensor.normal_, torch.Tensor.uniform_, *(
    getattr(torch.nn.init, f) for f in ("normal_", "uniform_", "trunc_normal_", "kaiming_uniform_",
                                        "kaiming_normal_", "xavier_uniform_", "xavier_normal_", "orthogonal_"))}


def skip_random_init():
    """A context that builds modules on the CPU without drawing their initial values (their
    memory is left as allocated): `with skip_random_init(): model = GPT(cfg)`, then load every
    weight. Used instead of the meta device where start-up time counts: several meta-device
    kernels (normal_, arange, empty_like under `to_empty`) are Python decompositions whose first
    call imports sympy and torch._dynamo (about 1 s)."""
    return _SkipRandomInit()


def from_hf(hf_dir: Path, out: Path, dtype: torch.dtype | None = None, block_size: int | None = None,
            overwrite: bool = False) -> Path:
    """Convert the Hugging Face folder `hf_dir` into the gptforge run directory `out`.

    Raises:
        FileExistsError: `out` exists and not overwrite. UnsupportedHFConfig (a ValueError),
        FileNotFoundError: see `gptforge.model.hf.load_hf_model`.
    """
    import yaml
    from rich.console import Console

    from gptforge.config import to_dict
    from gptforge.model.hf import load_hf_model, read_hf_config
    from gptforge.model.hf_save import TOKENIZER_FILES

    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} exists; choose another --out or pass --overwrite")
    with Console(stderr=True).status(f"reading {hf_dir}"):
        model = load_hf_model(hf_dir, dtype=dtype, block_size=block_size)
    cfg = model.config
    with staged_dir(out, overwrite=True) as tmp:  # replaces `out` only once complete
        config_yaml = yaml.safe_dump({"model": to_dict(cfg)}, sort_keys=False)
        with Console(stderr=True).status(f"writing {out}"):
            save_checkpoint(tmp / "checkpoints", 0, model, None,
                            {"step": 0, "tokens_seen": 0, "converted_from": "hf"}, config_yaml, keep=1)
        atomic_write_text(tmp / "config.yaml", config_yaml)
        atomic_write_text(tmp / "hf_config.json", json.dumps(read_hf_config(hf_dir), indent=2) + "\n")
        for name in TOKENIZER_FILES + ("generation_config.json",):
            if (hf_dir / name).is_file():
                shutil.copyfile(hf_dir / name, tmp / name)
    return out


def load_model_checkpoint(path: Path, dtype: torch.dtype | None = None, which: str = "latest"):
    """(GPT, checkpoint folder) from a gptforge run dir or checkpoint (see
    `gptforge.runtime.checkpoint.find_checkpoint`).

    The model config comes from the checkpoint's config.yaml (`model` section). Parameter names
    are found in the checkpoint's metadata under whatever prefix holds `wte.weight` (`model.`,
    and wrappers such as `_orig_mod.` or `module.`). A LoRA fine-tune's adapters are merged into
    the base weights (W += alpha/r * B @ A), so the model returned is a plain GPT; a QLoRA
    fine-tune's 4-bit base is dequantized first (needs bitsandbytes), so its weights are
    dequant(W4) + alpha/r * B @ A, not the original full-precision weights plus the adapters.

    The weights come from the checkpoint's consolidated model.safetensors when it is sound
    (`gptforge.runtime.checkpoint.read_consolidated`; then torch.distributed.checkpoint is not
    imported), else from its DCP files: the same tensors either way.

    Raises:
        FileNotFoundError: no config.yaml or checkpoint. ValueError: no model weights in it, or
            tensors missing. DamagedFileError: a consolidated tensor's shape is not the config's.
    """
    from gptforge.config import ModelConfig, from_dict
    from gptforge.model.gpt import GPT
    from gptforge.runtime.adapters import load_lora_for_export, merge_for_export

    step = find_checkpoint(path, which, weights_only=True)
    cfg_path = next((p / "config.yaml" for p in (step, step.parent.parent) if (p / "config.yaml").is_file()), None)
    if cfg_path is None:
        raise FileNotFoundError(f"{step}: no config.yaml with the model config in the checkpoint or its run directory")
    raw = _read_yaml(cfg_path)
    if "model" not in raw:
        raise ValueError(f"{cfg_path}: no `model` section")
    refuse_quantized(raw, cfg_path)
    model_cfg = from_dict(ModelConfig, {k: v for k, v in raw["model"].items() if v is not None}, "model.")
    cfg = model_cfg.resolved()
    consolidated = read_consolidated(step)
    if consolidated is not None:
        meta = consolidated.names  # name -> stored dtype
    else:
        import torch.distributed.checkpoint as dcp

        meta = {k: getattr(getattr(v, "properties", None), "dtype", None)
                for k, v in dcp.FileSystemReader(str(step)).read_metadata().state_dict_metadata.items()}
    prefix = next((k[: -len("wte.weight")] for k in meta if k.endswith("wte.weight")), None)
    if prefix is None:
        raise ValueError(f"{step}: no model weights (no tensor named *wte.weight)")
    stored = dtype or meta[prefix + "wte.weight"]
    if consolidated is not None or stored == torch.float32:
        # On the CPU without random init, then cast (a bf16 model read from safetensors under
        # --dtype auto passes through fp32 once): the meta device would import sympy and
        # torch._dynamo (see skip_random_init).
        with skip_random_init():
            model = GPT(cfg)
        model = model.to(stored)
    else:
        # Built on the meta device and allocated once in the stored dtype (bf16 stays bf16 under
        # --dtype auto): no random init, no fp32 copy of a large model.
        with torch.device("meta"):
            model = GPT(cfg)
        model = model.to(stored).to_empty(device="cpu")
        if cfg.tie_embeddings:
            model.lm_head.weight = model.wte.weight
    # A LoRA fine-tune's checkpoint holds base weights plus adapters: load both, then merge.
    n_lora = load_lora_for_export(model, step, [k[len(prefix):] for k in meta if k.startswith(prefix)])
    own = model.state_dict()
    missing = [k for k in own if prefix + k not in meta and not (cfg.tie_embeddings and k == "lm_head.weight")]
    if missing:
        raise ValueError(f"{step}: checkpoint lacks model tensors {missing[:8]}")
    # Filled in place; flat keys with the checkpoint's own prefix.
    target = {prefix + k: v for k, v in own.items() if prefix + k in meta}
    if consolidated is not None:
        consolidated.fill(target)
    else:
        with warnings.catch_warnings():
            warnings.filterwarnings("ignore", message=".*single process.*")
            dcp.load(target, checkpoint_id=str(step))
    model.reset_rope()  # the RoPE tables stay fp32 whatever the weights' dtype
    if n_lora:
        merge_for_export(model)
    return model, step


def checkpoint_sources(step: Path) -> dict:
    """What an export of checkpoint folder `step` needs besides weights, looked for in the
    checkpoint, then its run directory, then the data folder its config.yaml names:
    `tokenizer_dir` (first folder holding tokenizer files, or None), `hf_config` and
    `generation_config` (dicts from hf_config.json / generation_config.json, or None)."""
    import yaml

    from gptforge.model.hf_save import TOKENIZER_FILES

    folders = [step, step.parent.parent]
    doc = yaml.safe_load((step / "config.yaml").read_text()) if (step / "config.yaml").is_file() else None
    data_path = ((doc or {}).get("data") or {}).get("path")
    if data_path:
        folders.append(Path(data_path))

    def first_json(name):
        f = next((d / name for d in folders if (d / name).is_file()), None)
        return json.loads(f.read_text()) if f is not None else None

    return {
        "tokenizer_dir": next((d for d in folders if any((d / n).is_file() for n in TOKENIZER_FILES)), None),
        "hf_config": first_json("hf_config.json"),
        "generation_config": first_json("generation_config.json"),
    }


def to_hf(ckpt: Path, out: Path, dtype: torch.dtype | None = None, tokenizer: Path | None = None,
          max_shard_bytes: int = 5 * 2**30, overwrite: bool = False) -> Path:
    """Export a gptforge run dir / checkpoint as a Hugging Face folder at `out`.

    The tokenizer: `tokenizer` (a tokenizer.json or a folder of tokenizer files), else the one
    `checkpoint_sources` finds. A run converted from Hugging Face keeps its hf_config.json
    (model_type, special-token ids) and generation_config.json.

    Raises:
        FileNotFoundError: no checkpoint, or no tokenizer anywhere (pass --tokenizer).
        FileExistsError: `out` exists and not overwrite.
        InputError: `out` is `ckpt` or a folder above it (replacing it would delete the source).
    """
    from rich.console import Console

    from gptforge.atomic import check_not_inside
    from gptforge.model.hf_save import save_hf

    check_not_inside(out, [ckpt])
    if out.exists() and not overwrite:
        raise FileExistsError(f"{out} exists; choose another --out or pass --overwrite")
    with Console(stderr=True).status(f"reading {ckpt}"):
        model, step = load_model_checkpoint(ckpt, dtype)
    src = checkpoint_sources(step)
    tok_dir = src["tokenizer_dir"]
    if tokenizer is not None:
        tokenizer = Path(tokenizer)
        if not tokenizer.exists():
            raise FileNotFoundError(f"--tokenizer {tokenizer}: no such file or folder")
        if tokenizer.is_file() and tokenizer.name != "tokenizer.json":
            raise ValueError(f"--tokenizer {tokenizer}: expected a tokenizer.json or a folder of tokenizer files")
        tok_dir = tokenizer if tokenizer.is_dir() else tokenizer.parent
    elif tok_dir is None:
        raise FileNotFoundError(
            f"{step}: no tokenizer in the checkpoint, its run directory or its data folder; "
            "pass --tokenizer path/to/tokenizer.json"
        )
    with Console(stderr=True).status(f"writing {out}"):
        return save_hf(model, model.config, out, tokenizer_dir=tok_dir, base_config=src["hf_config"],
                       generation_config=src["generation_config"], dtype=dtype, max_shard_bytes=max_shard_bytes,
                       overwrite=overwrite)


def load_pretrained(path: Path, dtype: torch.dtype | None = None, block_size: int | None = None):
    """(GPT, source) from a Hugging Face folder (config.json) or a gptforge run dir / checkpoint.

    The entry point for fine-tuning (`--from DIR_or_HF_DIR`). `source` holds what an export needs
    later: `tokenizer_dir` (folder with the tokenizer files, or None), `hf_config` (the original
    config.json dict, or None) and `generation_config` (dict or None); a fine-tuning run should
    copy these into its run directory (tokenizer files, hf_config.json, generation_config.json) so
    that `convert --to-hf` of the result gives the same kind of Hugging Face folder.

    Raises:
        FileNotFoundError: neither kind of folder. See `load_hf_model` and `load_model_checkpoint`.
    """
    from gptforge.model.hf import load_hf_model, read_hf_config
    from gptforge.model.hf_save import TOKENIZER_FILES

    path = Path(path)
    if (path / "config.json").is_file():
        model = load_hf_model(path, dtype=dtype, block_size=block_size)
        gen = path / "generation_config.json"
        return model, {
            "tokenizer_dir": path if any((path / n).is_file() for n in TOKENIZER_FILES) else None,
            "hf_config": read_hf_config(path),
            "generation_config": json.loads(gen.read_text()) if gen.is_file() else None,
        }
    if block_size is not None:
        raise ValueError("block_size applies to Hugging Face folders; a gptforge checkpoint keeps its own")
    model, step = load_model_checkpoint(path, dtype)
    return model, checkpoint_sources(step)


def load_for_inference(path: str | Path, device: str | torch.device = "cpu", which: str = "latest"):
    """Build the model of a run directory or checkpoint folder and load its weights.

    Returns: (model in eval mode on `device`, checkpoint folder, saved config dict, tokenizer.json
    path or None). The tokenizer is looked for in the checkpoint folder, then the run directory,
    then the data folder the run was trained on. A quantized run (config.yaml has a
    `quantization` section, written by `gptforge quantize`) gets its quantized layers
    (`gptforge.model.quant.quantize_model(..., allocate_only=True)`) before its weights load.

    Raises:
        FileNotFoundError: no complete checkpoint at `path` (see `find_checkpoint`).
    """
    ckpt = find_checkpoint(path, which, weights_only=True)
    doc = _read_yaml(ckpt / "config.yaml")
    if doc.get("quantization"):
        return _load_quantized(ckpt, doc, device)
    # fp32 for inference whatever the stored dtype; a (Q)LoRA fine-tune comes back merged.
    model, _ = load_model_checkpoint(ckpt, torch.float32)
    model.to(device).eval()
    return model, ckpt, doc, _find_tokenizer(ckpt, doc)


def _read_yaml(path: Path) -> dict:
    """A config.yaml as a dict ({} when empty), through libyaml's parser when PyYAML has it (7x
    faster than the pure-Python one; the same result)."""
    import yaml

    return yaml.load(path.read_text(), Loader=getattr(yaml, "CSafeLoader", yaml.SafeLoader)) or {}


def _find_tokenizer(ckpt: Path, doc: dict) -> Path | None:
    tok = None
    candidates = [ckpt / "tokenizer.json", ckpt.parent.parent / "tokenizer.json"]
    if doc.get("data", {}).get("path"):
        candidates.append(Path(doc["data"]["path"]) / "tokenizer.json")
    for c in candidates:
        if c.exists():
            tok = c
            break
    return tok


def _load_quantized(ckpt: Path, doc: dict, device):
    """load_for_inference for a quantized run: the GPT built on the meta device, its layers
    replaced by empty quantized ones, allocated on the CPU once, filled from the checkpoint."""
    from gptforge.config import ModelConfig
    from gptforge.model.gpt import GPT
    from gptforge.model.quant import QuantSpec, quantize_model

    spec = QuantSpec(**doc["quantization"]["spec"])
    cfg = ModelConfig(**doc["model"]).resolved()
    with torch.device("meta"):
        model = GPT(cfg)
        quantize_model(model, spec, allocate_only=True)
    model = model.to_empty(device="cpu")
    if cfg.tie_embeddings and not spec.quantize_embeddings:
        model.lm_head.weight = model.wte.weight
    load_model_weights(ckpt, model)
    model.reset_rope()
    model.to(device).eval()
    return model, ckpt, doc, _find_tokenizer(ckpt, doc)

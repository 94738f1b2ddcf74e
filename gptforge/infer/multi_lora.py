"""Several LoRA adapters over one base model, chosen per batch row (serving adapters by name).

`enable_multi_lora(model)` turns the base's adaptable linear layers (q/k/v/o, gate/up/down
projections) into `MultiLoRALinear`s, in place: the same parameters, the same state_dict, the same
output while no adapter is bound. Before a forward pass the engine binds each batch row's adapter
(`RowAdapters.bind`; None for the base); each layer then computes the base product for the whole
batch and adds, for the rows of each adapter present, scaling * (x A^T) B^T (Hu et al. 2021) with
that adapter's A (r, in) and B (out, r). Rows of the base get exactly the base's output; rows of
different adapters share one continuous batch (one extra pair of small products per adapter
present and layer), so a request never waits for another adapter's batch.

`load_adapter` reads the adapters of a gptforge LoRA fine-tune (its run directory or checkpoint)
without merging them, and refuses one whose frozen base weights are not the served model's.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn as nn
import torch.nn.functional as F

from gptforge.model.lora import LORA_TARGETS


@dataclass(eq=False)
class Adapter:
    """One loaded LoRA adapter: `weights` maps a module path of the base ("blocks.0.attn.q_proj")
    to (A (r, in), B (out, r)); the layer adds scaling * x A^T B^T. `base`: the base model its
    run was fine-tuned from (config.yaml's base_model.path), as recorded."""

    name: str
    path: str
    scaling: float
    weights: dict[str, tuple[torch.Tensor, torch.Tensor]] = field(default_factory=dict)
    base: str | None = None


class RowAdapters:
    """The adapters of the rows of the next forward pass, shared by every `MultiLoRALinear`."""

    def __init__(self):
        self.groups: list[tuple[Adapter, torch.Tensor]] = []

    def bind(self, adapters: list[Adapter | None], device=None) -> None:
        """Row b of the next pass uses adapters[b] (None: the base alone)."""
        rows: dict[int, list[int]] = {}
        by_id: dict[int, Adapter] = {}
        for b, a in enumerate(adapters):
            if a is not None:
                rows.setdefault(id(a), []).append(b)
                by_id[id(a)] = a
        self.groups = [(by_id[k], torch.tensor(v, device=device)) for k, v in rows.items()]


class MultiLoRALinear(nn.Linear):
    """An `nn.Linear` of the base that adds the bound rows' adapters (see the module docstring).
    x (B, T, in) -> (B, T, out)."""

    path: str
    binding: RowAdapters

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        y = F.linear(x, self.weight, self.bias)
        for adapter, rows in self.binding.groups:
            w = adapter.weights.get(self.path)
            if w is not None:
                a, b = w
                y[rows] += adapter.scaling * F.linear(F.linear(x[rows], a), b)
        return y


def enable_multi_lora(model: nn.Module) -> RowAdapters:
    """Make every adaptable `nn.Linear` of `model` a `MultiLoRALinear` (in place; idempotent) and
    return the binding they share."""
    binding = getattr(model, "_row_adapters", None)
    if binding is not None:
        return binding
    binding = RowAdapters()
    for name, m in model.named_modules():
        if name.rsplit(".", 1)[-1] in LORA_TARGETS and type(m) is nn.Linear:
            m.__class__ = MultiLoRALinear
            m.path, m.binding = name, binding  # type: ignore[assignment]
    object.__setattr__(model, "_row_adapters", binding)  # not a submodule: never in the state_dict
    return binding


def _checkpoint_tensors(step: Path, wanted) -> dict[str, torch.Tensor]:
    """The tensors of checkpoint folder `step` whose names satisfy `wanted`, by stored name."""
    from gptforge.runtime.consolidated import CONSOLIDATED_FILE, read_consolidated

    if read_consolidated(step) is not None:
        from safetensors import safe_open

        with safe_open(str(step / CONSOLIDATED_FILE), "pt") as f:
            return {k: f.get_tensor(k) for k in f.keys() if wanted(k)}
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    from gptforge.runtime.adapters import _read_tensors

    meta = dcp.FileSystemReader(str(step)).read_metadata().state_dict_metadata
    names = {k: (tuple(v.size), v.properties.dtype) for k, v in meta.items()
             if wanted(k) and isinstance(v, TensorStorageMetadata)}
    return _read_tensors(step, names)


def load_adapter(name: str, run: str | Path, model: nn.Module, served: str) -> Adapter:
    """The LoRA adapters of the fine-tune at `run` (a run directory or checkpoint folder), on the
    device and in the dtype of `model`, named `name`.

    Raises:
        FileNotFoundError: no checkpoint at `run`.
        ValueError: the checkpoint holds no LoRA adapters, or QLoRA ones (a 4-bit base), or its
            base weights (shapes or values) are not those of `model`: names the adapter's base and
            `served` (the served model).
    """
    from gptforge.runtime.adapters import _checkpoint_doc, checkpoint_lora
    from gptforge.runtime.checkpoint import find_checkpoint

    step = find_checkpoint(run, "latest")
    tensors = _checkpoint_tensors(step, lambda k: k.endswith((".lora_A", ".lora_B", ".weight", ".weight_4bit")))
    lc = checkpoint_lora(step, list(tensors))
    if lc is None:
        raise ValueError(f"--lora {name}={run}: {step} holds no LoRA adapters (a full fine-tune: serve it as a model)")
    if any(k.endswith(".weight_4bit") for k in tensors):
        raise ValueError(f"--lora {name}={run}: a QLoRA fine-tune (4-bit base) cannot be served as an adapter of "
                         f"`{served}`; serve the run itself (its adapters merged)")
    base = (_checkpoint_doc(step).get("base_model") or {}).get("path")
    own = dict(model.named_parameters())
    p0 = next(iter(own.values()))
    adapter = Adapter(name, str(run), lc.scaling, base=base)
    for key, a in tensors.items():
        if not key.endswith(".lora_A"):
            continue
        stem = key[: -len(".lora_A")]
        path = stem[stem.index("blocks."):]
        w_own, w_run = own.get(path + ".weight"), tensors.get(stem + ".weight")
        if w_own is None or w_run is None or w_own.shape != w_run.shape or not _same(w_own, w_run):
            raise ValueError(f"--lora {name}={run}: the adapter was fine-tuned from base {base or 'unknown'}, whose "
                             f"weights ({path}) are not those of the served model `{served}`: serve that base, "
                             "or fine-tune the adapter on this one")
        b = tensors[stem + ".lora_B"]
        adapter.weights[path] = (a.to(p0.device, p0.dtype), b.to(p0.device, p0.dtype))
    return adapter


def _same(served: torch.Tensor, stored: torch.Tensor) -> bool:
    """Whether a served weight is the stored base weight, up to the rounding of a lower serving
    precision (bf16 keeps 8 bits of mantissa: relative error <= 2^-8)."""
    a, b = served.detach().float().cpu(), stored.float()
    return bool((a - b).abs().max() <= 2**-7 * b.abs().max().clamp_min(1e-12))

"""The consolidated `model.safetensors` of a checkpoint folder: whole weights that inference reads
without torch.distributed.checkpoint, bound to the trainer_state.pt written beside them (see
`gptforge.runtime.checkpoint`'s module docstring for when it is written and who reads it)."""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

import torch

from gptforge.atomic import file_sha256

log = logging.getLogger("gptforge")

STATE_FILE = "trainer_state.pt"
"""The trainer state file of a checkpoint folder; the consolidated file records its SHA-256."""
CONSOLIDATED_FILE = "model.safetensors"
CONSOLIDATED_FORMAT = "gptforge.consolidated/1"


def tensor_bytes(sd: dict[str, Any]) -> int:
    """Bytes of the plain tensors among `sd`'s values."""
    return sum(t.numel() * t.element_size() for t in sd.values() if isinstance(t, torch.Tensor))


def whole_signature(model_sd: dict[str, Any]) -> tuple | None:
    """(name, shape, dtype) of every tensor when all are plain whole tensors, else None.

    None for an empty state dict (DeepSpeed's other ranks), a DTensor (FSDP2, tensor parallel),
    a tensor subclass or non-tensor value (4-bit or quantized layers with their own state).
    """
    if not model_sd:
        return None
    sig = []
    for name, t in model_sd.items():
        if type(t) not in (torch.Tensor, torch.nn.Parameter) or name.endswith(".weight_4bit"):
            return None
        sig.append((name, tuple(t.shape), str(t.dtype)))
    return tuple(sorted(sig))


def write_consolidated(path: Path, model_sd: dict[str, torch.Tensor], step: int, trainer_state_sha256: str) -> None:
    """Write whole weights `model_sd` (name -> tensor, any device) to the safetensors file `path`.

    Names that alias an earlier tensor (tied embeddings: the same storage, offset, shape and
    strides) are stored once and listed in the metadata's `aliases` (JSON {name: stored name}).
    Metadata: `format` (CONSOLIDATED_FORMAT), `step`, `trainer_state_sha256` (of the
    trainer_state.pt saved with it). The caller makes the write atomic (save_checkpoint writes it
    inside the temp folder that is renamed into place).
    """
    import json

    from safetensors.torch import save_file

    tensors: dict[str, torch.Tensor] = {}
    aliases: dict[str, str] = {}
    seen: dict[tuple, str] = {}
    storages: set[int] = set()
    for name, t in model_sd.items():
        t = t.detach()
        key = (t.untyped_storage().data_ptr(), t.storage_offset(), tuple(t.shape), t.stride(), t.dtype) \
            if t.numel() else None
        if key is not None and key in seen:
            aliases[name] = seen[key]
            continue
        if key is not None:
            seen[key] = name
        shared = t.numel() and t.untyped_storage().data_ptr() in storages
        if t.numel():
            storages.add(t.untyped_storage().data_ptr())
        # safetensors refuses tensors that share memory: a view into another tensor's storage is copied.
        tensors[name] = t.to("cpu").contiguous() if not shared else t.to("cpu").clone()
    meta = {"format": CONSOLIDATED_FORMAT, "step": str(int(step)), "trainer_state_sha256": trainer_state_sha256,
            "aliases": json.dumps(aliases, sort_keys=True)}
    save_file(tensors, str(path), metadata=meta)


_SAFETENSORS_DTYPES = {"F64": torch.float64, "F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16,
                       "I64": torch.int64, "I32": torch.int32, "I16": torch.int16, "I8": torch.int8,
                       "U8": torch.uint8, "BOOL": torch.bool}


def consolidated_header(path: Path) -> tuple[dict, str | None]:
    """(safetensors header dict, problem or None) of `path`, read without loading a tensor."""
    import json
    import struct

    size = path.stat().st_size
    with open(path, "rb") as f:
        raw = f.read(8)
        if len(raw) < 8:
            return {}, f"{size} bytes, shorter than a safetensors header"
        n = struct.unpack("<Q", raw)[0]
        if 8 + n > size:
            return {}, f"its header claims {n:,} bytes but the file is {size:,} bytes (truncated)"
        try:
            header = json.loads(f.read(n))
        except (UnicodeDecodeError, ValueError) as e:
            return {}, f"its header does not read ({e})"
    if not isinstance(header, dict):
        return {}, "its header is not a JSON object"
    try:
        end = max((int(v["data_offsets"][1]) for k, v in header.items() if k != "__metadata__"), default=0)
    except (KeyError, IndexError, TypeError, ValueError):
        return {}, "its header lists a tensor without data offsets"
    if 8 + n + end != size:
        return header, f"{size:,} bytes where its header describes {8 + n + end:,} (truncated or changed)"
    return header, None


def consolidated_problem(ckpt: str | Path) -> str | None:
    """What makes checkpoint folder `ckpt`'s model.safetensors unusable, or None when it is sound.

    Checks, reading only its header and trainer_state.pt: the file exists; its header reads and
    describes exactly the file's length; its metadata has gptforge's `format`, a `step` equal to
    the folder's (step_N), and the `trainer_state_sha256` of the trainer_state.pt beside it (so it
    was written by the same save as the DCP files, not copied in from another checkpoint).
    """
    ckpt = Path(ckpt)
    path = ckpt / CONSOLIDATED_FILE
    if not path.is_file():
        return "missing"
    header, problem = consolidated_header(path)
    if problem is not None:
        return problem
    meta = header.get("__metadata__") or {}
    if meta.get("format") != CONSOLIDATED_FORMAT:
        return f"not a gptforge consolidated file (format {meta.get('format')!r})"
    if ckpt.name.startswith("step_") and ckpt.name[5:].isdigit() and meta.get("step") != str(int(ckpt.name[5:])):
        return f"written at step {meta.get('step')}, in the folder of step {int(ckpt.name[5:])}"
    if not (ckpt / STATE_FILE).is_file() or file_sha256(ckpt / STATE_FILE) != meta.get("trainer_state_sha256"):
        return f"written with another {STATE_FILE} than the one beside it"
    return None


class ConsolidatedWeights:
    """The tensor names and dtypes of a sound consolidated file (`read_consolidated`), and `fill`.

    names: stored name -> torch dtype, aliases included (a tied name maps to its target's dtype).
    aliases: name -> the stored name holding its values.
    """

    def __init__(self, path: Path, header: dict):
        import json

        self.path = path
        meta = header.get("__metadata__") or {}
        self.aliases: dict[str, str] = json.loads(meta.get("aliases") or "{}")
        self._shapes = {k: tuple(v["shape"]) for k, v in header.items() if k != "__metadata__"}
        self.names: dict[str, torch.dtype] = {k: _SAFETENSORS_DTYPES.get(v["dtype"], torch.uint8)
                                              for k, v in header.items() if k != "__metadata__"}
        for name, target in self.aliases.items():
            self.names[name] = self.names[target]
            self._shapes[name] = self._shapes[target]

    def fill(self, target: dict[str, torch.Tensor]) -> None:
        """Copy the stored tensor of each name (or of the name it aliases) into `target[name]` in
        place, converting dtype.

        Raises:
            DamagedFileError: a stored shape differs from the target's (the model config and
                the weights disagree), naming the tensor.
        """
        from safetensors import safe_open

        from gptforge.errors import DamagedFileError

        with safe_open(str(self.path), framework="pt") as f:
            for name, t in target.items():
                stored = self.aliases.get(name, name)
                if self._shapes[stored] != tuple(t.shape):
                    raise DamagedFileError(f"{self.path}: tensor {stored} has shape {list(self._shapes[stored])}, "
                                           f"the model built from config.yaml expects {list(t.shape)}")
                with torch.no_grad():
                    t.copy_(f.get_tensor(stored))


def read_consolidated(ckpt: str | Path) -> ConsolidatedWeights | None:
    """The consolidated weights of checkpoint folder `ckpt` when sound (`consolidated_problem`);
    None when there is none or it is unusable (a warning says why; callers then read DCP)."""
    ckpt = Path(ckpt)
    path = ckpt / CONSOLIDATED_FILE
    if not path.is_file():
        return None
    problem = consolidated_problem(ckpt)
    if problem is not None:
        log.warning(f"{path}: {problem}; reading the weights from the DCP files instead")
        return None
    return ConsolidatedWeights(path, consolidated_header(path)[0])



"""A Triton Inference Server model repository around the ONNX decoder graph.

    OUT/
      README.md                how to start tritonserver on this repository
      <name>/
        config.pbtxt           onnxruntime backend: inputs/outputs with dims, dynamic batching,
                               instance group
        1/model.onnx           the graph of gptforge.export.onnx (plus onnx_io.json, tokenizer files)

`config.pbtxt` is Triton's ModelConfig protobuf in text format. With `max_batch_size` > 0 Triton
owns the first (batch) dimension, so the `dims` listed leave it out; -1 marks the sequence and
past lengths. The dynamic batcher groups requests whose other dims agree (e.g. decoding steps
at the same past length).
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING

import torch

from gptforge.errors import InputError

if TYPE_CHECKING:
    from gptforge.model.gpt import GPT

TRITON_TYPES = {"int64": "TYPE_INT64", "float32": "TYPE_FP32", "float16": "TYPE_FP16"}
INSTANCE_KINDS = ("KIND_AUTO", "KIND_CPU", "KIND_GPU")


def triton_dims(dims: list) -> list[int]:
    """onnx_io.json dims without the batch dim, symbolic ones as -1."""
    return [d if isinstance(d, int) else -1 for d in dims[1:]]


def config_pbtxt(spec: dict, name: str, max_batch_size: int = 8, instances: int = 1,
                 kind: str = "KIND_AUTO", max_queue_delay_us: int = 100) -> str:
    """The config.pbtxt text for the ONNX graph described by `spec` (an onnx_io.json dict).

    Raises:
        InputError: max_batch_size < 1, instances < 1 or an unknown instance kind.
    """
    if max_batch_size < 1 or instances < 1:
        raise InputError("--max-batch-size and --instances must be >= 1")
    if kind not in INSTANCE_KINDS:
        raise InputError(f"--instance-kind {kind}: choose one of {', '.join(INSTANCE_KINDS)}")

    def tensor(entry: dict) -> str:
        dims = ", ".join(str(d) for d in triton_dims(entry["dims"]))
        return (f'  {{\n    name: "{entry["name"]}"\n    data_type: {TRITON_TYPES[entry["dtype"]]}\n'
                f"    dims: [ {dims} ]\n  }}")

    lines = [
        f'name: "{name}"',
        'backend: "onnxruntime"',
        f"max_batch_size: {max_batch_size}",
        "input [\n" + ",\n".join(tensor(e) for e in spec["inputs"]) + "\n]",
        "output [\n" + ",\n".join(tensor(e) for e in spec["outputs"]) + "\n]",
        f"dynamic_batching {{\n  max_queue_delay_microseconds: {max_queue_delay_us}\n}}",
        f"instance_group [\n  {{\n    count: {instances}\n    kind: {kind}\n  }}\n]",
    ]
    return "\n".join(lines) + "\n"


def _readme(name: str, spec: dict) -> str:
    n_layer = spec["model"]["n_layer"]
    return f"""# Triton model repository: {name}

`{name}/1/model.onnx` is a gptforge decoder with a KV cache, served by Triton's onnxruntime
backend as `{name}/config.pbtxt` describes. Start the server on this folder:

    docker run --rm -p 8000:8000 -p 8001:8001 -p 8002:8002 -v "$PWD":/models \\
        nvcr.io/nvidia/tritonserver:<yy.mm>-py3 tritonserver --model-repository=/models

(add `--gpus all` for GPU instances). Each request sends `input_ids`, `attention_mask`,
`position_ids` and the `past_key_values.{{i}}.key/.value` of its {n_layer} layers (length 0 for
the first call) and gets `logits` and the `present.{{i}}.key/.value` to send back on the next
step; `{name}/1/onnx_io.json` lists every tensor with its dims. Check the model is ready:

    curl -s localhost:8000/v2/models/{name}/ready -o /dev/null -w "%{{http_code}}\\n"
"""


def export_triton(model: GPT, sources: dict, out: str | Path, name: str = "gptforge",
                  dtype: torch.dtype = torch.float32, quantize: str | None = None, overwrite: bool = False,
                  max_batch_size: int = 8, instances: int = 1, kind: str = "KIND_AUTO") -> Path:
    """Write a Triton model repository at `out` (staged, then renamed into place).

    Raises:
        InputError: a bad model name, `out` exists without overwrite, and see
            `gptforge.export.onnx.write_onnx_folder` and `config_pbtxt`.
    """
    from gptforge.atomic import staged_dir
    from gptforge.export.onnx import write_onnx_folder

    if not name or not all(c.isalnum() or c in "-_." for c in name) or name.startswith("."):
        raise InputError(f"--name {name!r}: a Triton model name is letters, digits, '-', '_' and '.'")
    config_pbtxt({"inputs": [], "outputs": []}, name, max_batch_size, instances, kind)  # validate options first
    with staged_dir(out, overwrite) as tmp:
        version = tmp / name / "1"
        version.mkdir(parents=True)
        spec = write_onnx_folder(model, sources, version, dtype, quantize)
        (tmp / name / "config.pbtxt").write_text(config_pbtxt(spec, name, max_batch_size, instances, kind))
        (tmp / "README.md").write_text(_readme(name, spec))
    return Path(out)

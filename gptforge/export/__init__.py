"""Other model formats, each checked by the runtime that loads it (the Hugging Face writer lives in
gptforge.model.hf_save; `gptforge export --format hf` calls it through runtime.loading.to_hf).

- `onnx`: one decoder graph with KV-cache inputs/outputs for onnxruntime (`export_onnx`,
  `OnnxDecoder`), optional int8 dynamic quantization.
- `gguf`: one GGUF file for llama.cpp / ollama (`write_gguf`), f32/f16/bf16, q8_0/q4_0.
- `triton`: a Triton Inference Server model repository around the ONNX graph (`export_triton`).
- `common`: loading the source model, tokenizer files, the staged output folder.
- `formats`: the registry of those formats (`FORMATS`: the dtypes and quantizations each holds,
  its default dtype, its writer) and `export_model`, which `gptforge export` calls.
- `consolidate`: one safetensors / torch file from a sharded training checkpoint
  (`gptforge export-checkpoint`).
"""

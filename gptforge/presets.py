"""Named model shapes. Presets are data: a dict of `ModelConfig` field values per name.

| preset        | arch  | n_layer | n_head | n_kv_head | d_model | d_ff   | block_size | vocab  | params (vocab as listed)   |
|---------------|-------|---------|--------|-----------|---------|--------|------------|--------|----------------------------|
| gpt2-nano     | gpt2  | 2       | 2      | 2         | 64      | 256    | 128        | data   | 172,288 at vocab 1000      |
| gpt2-micro    | gpt2  | 4       | 4      | 4         | 128     | 512    | 256        | data   | 954,112 at vocab 1000      |
| gpt2-mini     | gpt2  | 6       | 6      | 6         | 384     | 1536   | 256        | data   | 11,129,856 at vocab 1000   |
| gpt2-small    | gpt2  | 12      | 12     | 12        | 768     | 3072   | 1024       | 50257  | 124,439,808                |
| gpt2-medium   | gpt2  | 24      | 16     | 16        | 1024    | 4096   | 1024       | 50257  | 354,823,168                |
| gpt2-large    | gpt2  | 36      | 20     | 20        | 1280    | 5120   | 1024       | 50257  | 774,030,080                |
| gpt2-xl       | gpt2  | 48      | 25     | 25        | 1600    | 6400   | 1024       | 50257  | 1,557,611,200              |
| modern-nano   | llama | 2       | 2      | 2         | 64      | 256    | 128        | data   | 226,752 at vocab 1000      |
| modern-micro  | llama | 4       | 4      | 4         | 128     | 512    | 256        | data   | 1,043,840 at vocab 1000    |
| modern-mini   | llama | 6       | 6      | 6         | 384     | 1536   | 256        | data   | 11,390,592 at vocab 1000   |
| modern-small  | llama | 12      | 12     | 12        | 768     | 3072   | 1024       | 50257  | 162,150,144                |
| qwen3-nano    | llama | 2       | 2      | 2         | 64      | 176    | 128        | data   | 228,800 at vocab 1000      |
| qwen3-micro   | llama | 4       | 4      | 4         | 128     | 352    | 256        | data   | 1,060,224 at vocab 1000    |
| qwen3-mini    | llama | 6       | 6      | 6         | 384     | 1024   | 256        | data   | 11,390,592 at vocab 1000   |
| qwen3-small   | llama | 12      | 12     | 12        | 768     | 2048   | 1024       | 50257  | 162,150,144                |
| llama-nano    | llama | 2       | 4      | 2         | 64      | 176    | 128        | data   | 220,480 at vocab 1000      |
| llama-micro   | llama | 4       | 4      | 2         | 128     | 352    | 256        | data   | 994,432 at vocab 1000      |
| llama-60m     | llama | 8       | 8      | 8         | 512     | 1376   | 1024       | 32000  | 58,073,600                 |
| llama-160m    | llama | 12      | 12     | 12        | 768     | 3072   | 2048       | 32000  | 162,417,408                |
| llama-2-7b    | llama | 32      | 32     | 32        | 4096    | 11008  | 4096       | 32000  | 6,738,415,616              |
| llama-2-13b   | llama | 40      | 40     | 40        | 5120    | 13824  | 4096       | 32000  | 13,015,864,320             |
| llama-2-70b   | llama | 80      | 64     | 8         | 8192    | 28672  | 4096       | 32000  | 68,976,648,192             |
| llama-3-8b    | llama | 32      | 32     | 8         | 4096    | 14336  | 8192       | 128256 | 8,030,261,248              |
| llama-3-70b   | llama | 80      | 64     | 8         | 8192    | 28672  | 8192       | 128256 | 70,553,706,496             |

GPT-2 shapes: Radford et al. 2019, table 2 (the released checkpoints). modern-*: the GPT-2 shapes
with Llama blocks, untied head, relu2 MLP (d_ff 4*d_model), QK-norm, zero-initialised output
projections and logit soft cap 15 (see `ModelConfig` for each option's source). qwen3-*: the
same shapes as Qwen3 blocks (Yang et al. 2025, Qwen3 technical report, section 2): Llama blocks
with QK-norm and SwiGLU (d_ff 8/3*d_model, as many MLP parameters as relu2's 4*d_model), untied
head, RMSNorm eps 1e-6, zero-initialised output projections and no logit cap, so they export
exactly to Hugging Face (`Qwen3ForCausalLM`), GGUF (llama.cpp's `qwen3`) and ONNX. llama-60m: the 60M shape of
Zhao et al. 2024 (GaLore), table 2; llama-160m: the shape of the public "llama-160m" draft model.
Llama 2: Touvron et al. 2023, table 1 and the released configs; Llama 3: the released
`config.json` files (GQA with 8 KV heads, RoPE theta 500000). Parameter counts are what
`GPT(config).num_params()` returns; tied embeddings are counted once.
"""

from __future__ import annotations

_GPT2 = dict(arch="gpt2", bias=True, tie_embeddings=True, norm_eps=1e-5)
_LLAMA = dict(arch="llama", bias=False, tie_embeddings=False, norm_eps=1e-5, rope_theta=10000.0)
# The modern family: Llama blocks (RoPE, RMSNorm) with the speedrun changes that paid at GPT-2-small
# scale (modded-nanogpt record log, nanochat): squared-ReLU MLP, QK-norm, zero-initialised output
# projections, an untied head and a logit soft cap of 15. Value embeddings stay opt-in.
_MODERN = dict(arch="llama", bias=False, tie_embeddings=False, norm_eps=1e-5, rope_theta=10000.0,
               activation="relu2", qk_norm=True, zero_init_proj=True, logit_softcap=15.0, value_embeddings=False)
# Qwen3 blocks: the modern family without the two options no deployment target computes (the
# logit soft cap, relu2 on Llama blocks). zero_init_proj changes only the initialisation.
_QWEN3 = dict(arch="llama", bias=False, tie_embeddings=False, norm_eps=1e-6, rope_theta=10000.0,
              qk_norm=True, zero_init_proj=True, logit_softcap=0.0, value_embeddings=False)

PRESETS: dict[str, dict] = {
    # CPU-sized shapes for laptops, tests and the quickstart. vocab_size comes from the data.
    "gpt2-nano": dict(_GPT2, n_layer=2, n_head=2, d_model=64, block_size=128),
    "gpt2-micro": dict(_GPT2, n_layer=4, n_head=4, d_model=128, block_size=256),
    "gpt2-mini": dict(_GPT2, n_layer=6, n_head=6, d_model=384, block_size=256),
    # GPT-2 family (vocab 50257, context 1024).
    "gpt2-small": dict(_GPT2, n_layer=12, n_head=12, d_model=768, block_size=1024, vocab_size=50257),
    "gpt2-medium": dict(_GPT2, n_layer=24, n_head=16, d_model=1024, block_size=1024, vocab_size=50257),
    "gpt2-large": dict(_GPT2, n_layer=36, n_head=20, d_model=1280, block_size=1024, vocab_size=50257),
    "gpt2-xl": dict(_GPT2, n_layer=48, n_head=25, d_model=1600, block_size=1024, vocab_size=50257),
    # Modern family (opt-in, not exportable: the logit soft cap and the relu2 Llama MLP have no
    # counterpart in transformers or llama.cpp, so export refuses by option name; gptforge's own
    # checkpoints, generation, evaluation and serving work).
    "modern-nano": dict(_MODERN, n_layer=2, n_head=2, d_model=64, block_size=128),
    "modern-micro": dict(_MODERN, n_layer=4, n_head=4, d_model=128, block_size=256),
    "modern-mini": dict(_MODERN, n_layer=6, n_head=6, d_model=384, block_size=256),
    "modern-small": dict(_MODERN, n_layer=12, n_head=12, d_model=768, block_size=1024, vocab_size=50257),
    # Qwen3-shaped family: the recommended recipe (pair with --train.optimizer muon). Every option
    # has a counterpart in transformers, vLLM and llama.cpp, so hf, gguf and onnx exports are exact.
    "qwen3-nano": dict(_QWEN3, n_layer=2, n_head=2, d_model=64, block_size=128),
    "qwen3-micro": dict(_QWEN3, n_layer=4, n_head=4, d_model=128, block_size=256),
    "qwen3-mini": dict(_QWEN3, n_layer=6, n_head=6, d_model=384, block_size=256),
    "qwen3-small": dict(_QWEN3, n_layer=12, n_head=12, d_model=768, block_size=1024, vocab_size=50257),
    # Llama family.
    "llama-nano": dict(_LLAMA, n_layer=2, n_head=4, n_kv_head=2, d_model=64, d_ff=176, block_size=128),
    "llama-micro": dict(_LLAMA, n_layer=4, n_head=4, n_kv_head=2, d_model=128, d_ff=352, block_size=256),
    "llama-60m": dict(_LLAMA, n_layer=8, n_head=8, d_model=512, d_ff=1376, block_size=1024, vocab_size=32000),
    "llama-160m": dict(_LLAMA, n_layer=12, n_head=12, d_model=768, d_ff=3072, block_size=2048, vocab_size=32000),
    "llama-2-7b": dict(_LLAMA, n_layer=32, n_head=32, d_model=4096, d_ff=11008, block_size=4096, vocab_size=32000),
    "llama-2-13b": dict(_LLAMA, n_layer=40, n_head=40, d_model=5120, d_ff=13824, block_size=4096, vocab_size=32000),
    "llama-2-70b": dict(
        _LLAMA, n_layer=80, n_head=64, n_kv_head=8, d_model=8192, d_ff=28672, block_size=4096, vocab_size=32000
    ),
    "llama-3-8b": dict(
        _LLAMA, n_layer=32, n_head=32, n_kv_head=8, d_model=4096, d_ff=14336, block_size=8192,
        vocab_size=128256, rope_theta=500000.0,
    ),
    "llama-3-70b": dict(
        _LLAMA, n_layer=80, n_head=64, n_kv_head=8, d_model=8192, d_ff=28672, block_size=8192,
        vocab_size=128256, rope_theta=500000.0,
    ),
}

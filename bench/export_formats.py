"""Export times and file sizes per format for gpt2-small-shaped random weights, decode speed of the
runtimes that load them, and the perplexity change of ONNX int8 on a briefly trained small model.

    python bench/export_formats.py [--skip-train] [--skip-export] [--out DIR]

Prints one table; the figures of a run go to bench/RESULTS.md by hand with the machine named.
llama.cpp figures need llama-cpp-python (skipped when it is not importable).
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
import time
from pathlib import Path

import numpy as np
import torch
from machine import cpu_description  # bench/machine.py

STEPS = 200
"""Training steps of the model whose int8 perplexity is measured (batch 8 x 128 tokens)."""




def _size(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file()) if path.is_dir() else path.stat().st_size


def _tokenizer_dir(root: Path) -> Path:
    from gptforge.data.stdlib_corpus import stdlib_files
    from gptforge.data.tokenizer import train_bpe

    files = stdlib_files()[::20][:40]
    tok = train_bpe((f.read_text(errors="replace") for f in files), 1024)
    d = root / "tok"
    d.mkdir(parents=True, exist_ok=True)
    tok.save(d / "tokenizer.json")
    return d


def _decode_ms(prefill, step, n: int = 32) -> float:
    """Milliseconds per decoded token: `prefill()` once (untimed), then `step()` n times."""
    prefill()
    t = time.perf_counter()
    for _ in range(n):
        step()
    return (time.perf_counter() - t) / n * 1000


def export_table(root: Path) -> None:
    from gptforge.config import ModelConfig
    from gptforge.export.gguf import write_gguf
    from gptforge.export.onnx import OnnxDecoder, export_onnx
    from gptforge.model.gpt import GPT
    from gptforge.model.hf_save import save_hf

    tok_dir = _tokenizer_dir(root)
    torch.manual_seed(0)
    model = GPT(ModelConfig(preset="gpt2-small", activation="gelu_tanh").resolved()).eval()
    sources = {"tokenizer_dir": tok_dir, "hf_config": None, "generation_config": None}
    rows = []

    def timed(label, fn, path):
        t = time.perf_counter()
        fn()
        rows.append((label, time.perf_counter() - t, _size(path)))
        print(f"  {label}: {rows[-1][1]:.1f} s, {rows[-1][2] / 2**20:.1f} MiB", flush=True)

    timed("hf f32 (safetensors)", lambda: save_hf(model, model.config, root / "hf", tokenizer_dir=tok_dir,
                                                   overwrite=True), root / "hf")
    timed("onnx f32", lambda: export_onnx(model, sources, root / "onnx", overwrite=True), root / "onnx")
    timed("onnx int8", lambda: export_onnx(model, sources, root / "onnx8", quantize="int8", overwrite=True),
          root / "onnx8")
    for q in ("f16", "q8_0", "q4_0"):
        f = root / f"m-{q}.gguf"
        timed(f"gguf {q}", lambda q=q, f=f: write_gguf(model, tok_dir, f, dtype="f16" if q == "f16" else "f32",
                                                      quantize=None if q == "f16" else q), f)
    print("\n| export | seconds | MiB |\n|---|---:|---:|")
    for label, s, b in rows:
        print(f"| {label} | {s:.1f} | {b / 2**20:.1f} |")

    # Decode speed: 32 tokens, one at a time, after a 64-token prompt, batch 1 (past 64..95).
    ids = torch.randint(0, 1024, (1, 64))
    tok = int(ids[0, -1])
    state = {}

    def torch_prefill():
        state["caches"] = model.make_caches(1, 128)
        with torch.no_grad():
            model(ids, caches=state["caches"])

    def torch_step():
        with torch.no_grad():
            model(torch.tensor([[tok]]), caches=state["caches"])

    speeds = [("gptforge torch f32", _decode_ms(torch_prefill, torch_step))]
    for label, folder in (("onnxruntime f32", root / "onnx"), ("onnxruntime int8", root / "onnx8")):
        dec = OnnxDecoder(folder)

        def ort_prefill(dec=dec):
            state["past"] = dec.run(ids.numpy())[1]

        def ort_step(dec=dec):
            state["past"] = dec.run(np.array([[tok]]), state["past"])[1]

        speeds.append((label, _decode_ms(ort_prefill, ort_step)))
    try:
        import llama_cpp
    except ImportError:
        llama_cpp = None
    if llama_cpp is not None:
        for q in ("f16", "q8_0", "q4_0"):
            llm = llama_cpp.Llama(str(root / f"m-{q}.gguf"), n_ctx=128, verbose=False,
                                  n_threads=torch.get_num_threads())
            speeds.append((f"llama.cpp {q}", _decode_ms(lambda llm=llm: (llm.reset(), llm.eval(ids[0].tolist())),
                                                         lambda llm=llm: llm.eval([tok]))))
            llm.close()
    base = speeds[0][1]
    print("\n| runtime | ms / token (past 64, batch 1) | vs torch |\n|---|---:|---:|")
    for label, ms in speeds:
        print(f"| {label} | {ms:.2f} | {base / ms:.2f}x |")


def int8_perplexity(root: Path) -> None:
    from gptforge.config import ModelConfig, RunConfig, TrainConfig
    from gptforge.data.prepare import PrepareConfig, prepare
    from gptforge.data.shards import load_meta
    from gptforge.data.stdlib_corpus import stdlib_files
    from gptforge.export.common import load_source
    from gptforge.export.onnx import OnnxDecoder, export_onnx
    from gptforge.train.run import train

    data = root / "data"
    shutil.rmtree(data, ignore_errors=True)
    prepare(PrepareConfig(inputs=[str(p) for p in stdlib_files()[::8][:100]], out=str(data), vocab_size=1024,
                          val_fraction=0.1, workers=1), show_progress=False)
    run = root / "run"
    shutil.rmtree(run, ignore_errors=True)
    cfg = RunConfig(model=ModelConfig(preset="gpt2-micro", block_size=128),
                    train=TrainConfig(max_steps=STEPS, micro_batch_size=8, lr=3e-3, warmup_steps=20, eval_interval=0,
                                      checkpoint_interval=0, tensorboard=False))
    t = time.perf_counter()
    train(cfg, data, run, progress=False)
    print(f"\ntrained gpt2-micro {STEPS} steps in {time.perf_counter() - t:.0f} s")
    model, sources = load_source(run)
    export_onnx(model, sources, root / "p32", overwrite=True)
    export_onnx(model, sources, root / "p8", quantize="int8", overwrite=True)
    meta = load_meta(data)
    toks = np.fromfile(sorted(data.glob("val_*.bin"))[0], dtype=meta["dtype"]).astype(np.int64)
    n = (min(len(toks), 16 * 128) // 128) * 128
    ids = toks[:n].reshape(-1, 128)

    def nll(logits):
        lp = torch.log_softmax(torch.from_numpy(logits[:, :-1].astype(np.float32)), -1)
        return float(-lp.gather(-1, torch.from_numpy(ids[:, 1:])[..., None]).mean())

    with torch.no_grad():
        ref = nll(model(torch.from_numpy(ids)).numpy())
    got = {k: nll(OnnxDecoder(root / k).run(ids)[0]) for k in ("p32", "p8")}
    print(f"perplexity on {ids.size} val tokens: torch {np.exp(ref):.3f}, onnx f32 {np.exp(got['p32']):.3f}, "
          f"onnx int8 {np.exp(got['p8']):.3f} ({100 * (np.exp(got['p8'] - ref) - 1):+.2f}%)")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--out", type=Path, default=Path(tempfile.gettempdir()) / "gptforge-export-bench")
    p.add_argument("--skip-train", action="store_true", help="skip the int8 perplexity part")
    p.add_argument("--skip-export", action="store_true", help="skip the gpt2-small export and speed part")
    args = p.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    print(f"CPU: {cpu_description()}, {torch.get_num_threads()} torch threads")
    if not args.skip_export:
        export_table(args.out)
    if not args.skip_train:
        int8_perplexity(args.out)


if __name__ == "__main__":
    main()

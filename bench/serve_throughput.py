"""Generation and serving speed: gptforge against transformers on the same model, in one run.

    python bench/serve_throughput.py [--new-tokens 128] [--prompt-tokens 32] [--threads 1] [--write]

For a gpt2-mini-shaped and a llama-micro-shaped model (random weights, fp32, vocabulary 1000 from
a BPE trained on the standard library), exported as a Hugging Face folder and loaded back with
`AutoModelForCausalLM`:
1. single-stream greedy decode tokens/s: `gptforge.infer.generate.generate` vs transformers'
   `generate` (KV cache on both, same prompt, same dtype, exactly --new-tokens tokens), best of 3;
2. aggregate tokens/s of the continuous-batching engine with 8 concurrent streams vs 1
   (in process), and transformers' `generate` on a batch of 8 as a reference;
3. through HTTP (`gptforge serve`'s app on 127.0.0.1, max batch 8; --clients streaming clients x
   --per-client requests, default 8 x 3): time to first token p50/p99 and aggregate tokens/s.
Prints a Markdown table; --write appends it to bench/RESULTS.md with the command line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
from machine import cpu_description  # bench/machine.py

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))




def build(preset: str, tok_dir: Path, out: Path):
    from transformers import AutoModelForCausalLM

    from gptforge.config import ModelConfig
    from gptforge.model.gpt import GPT
    from gptforge.model.hf_save import save_hf

    torch.manual_seed(0)
    cfg = ModelConfig(preset=preset, vocab_size=1000).resolved()
    model = GPT(cfg).eval()
    save_hf(model, cfg, out, tokenizer_dir=tok_dir)
    hf = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    hf.generation_config.eos_token_id = None
    hf.generation_config.pad_token_id = 0
    return model, hf


def best_of(fn, n=3) -> float:
    times = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return min(times)


def single_stream(model, hf, prompt, n):
    from gptforge.infer.generate import generate

    idx = torch.tensor([prompt])
    with torch.no_grad():
        ours = best_of(lambda: generate(model, idx, n, temperature=0))
        theirs = best_of(lambda: hf.generate(idx, attention_mask=torch.ones_like(idx), max_new_tokens=n,
                                             min_new_tokens=n, do_sample=False, use_cache=True))
    return n / ours, n / theirs


def engine_rate(model, decode, prompts, n, batch):
    from gptforge.infer.engine import Engine, SamplingParams

    eng = Engine(model, decode, max_batch_size=batch)
    for p in prompts:
        eng.submit(p, SamplingParams(max_tokens=n, temperature=0), lambda ev: None)
    t = time.perf_counter()
    while eng.step():
        pass
    return len(prompts) * n / (time.perf_counter() - t)


def hf_batch_rate(hf, prompts, n):
    idx = torch.tensor(prompts)
    with torch.no_grad():
        dt = best_of(lambda: hf.generate(idx, attention_mask=torch.ones_like(idx), max_new_tokens=n,
                                         min_new_tokens=n, do_sample=False, use_cache=True), 1)
    return len(prompts) * n / dt


def http_load(model, tok_file, prompts, n, clients=8, per_client=3):
    import socket

    import httpx
    import uvicorn

    from gptforge.serve.app import ServeConfig, create_app

    app = create_app(model, tok_file, ServeConfig(model_name="bench", max_batch_size=min(clients, 8)))
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    th = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    th.start()
    while not server.started:
        time.sleep(0.02)
    url = f"http://127.0.0.1:{sock.getsockname()[1]}/v1/completions"
    ttfts, tokens = [], []

    def client(c):
        with httpx.Client(timeout=300) as h:
            for k in range(per_client):
                body = {"model": "bench", "prompt": prompts[(c + k) % len(prompts)], "max_tokens": n,
                        "temperature": 0, "stream": True, "stream_options": {"include_usage": True}}
                t0 = time.perf_counter()
                first = None
                with h.stream("POST", url, json=body) as r:
                    for line in r.iter_lines():
                        if not line.startswith("data: {"):
                            continue
                        chunk = json.loads(line[6:])
                        if chunk["choices"] and first is None:
                            first = time.perf_counter() - t0
                        if chunk.get("usage"):
                            tokens.append(chunk["usage"]["completion_tokens"])
                ttfts.append(first)

    t = time.perf_counter()
    threads = [threading.Thread(target=client, args=(c,)) for c in range(clients)]
    for x in threads:
        x.start()
    for x in threads:
        x.join()
    wall = time.perf_counter() - t
    server.should_exit = True
    th.join(10)
    ttfts.sort()
    p99 = ttfts[min(len(ttfts) - 1, int(round(0.99 * (len(ttfts) - 1))))]
    if len(tokens) != clients * per_client:
        raise RuntimeError(f"only {len(tokens)} of {clients * per_client} streamed requests completed")
    return statistics.median(ttfts), p99, sum(tokens) / wall


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1, help="torch threads (default 1: the machine is shared)")
    ap.add_argument("--presets", nargs="+", default=["gpt2-mini", "llama-micro"])
    ap.add_argument("--clients", type=int, default=8, help="concurrent HTTP streaming clients (issue's full load: 32)")
    ap.add_argument("--per-client", type=int, default=3, help="requests per client (issue's full load: 10)")
    ap.add_argument("--write", action="store_true", help="append the table to bench/RESULTS.md")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    import transformers

    from gptforge.data.stdlib_corpus import stdlib_files
    from gptforge.data.tokenizer import train_bpe

    texts = [p.read_text(errors="replace") for p in stdlib_files()[:60]]
    tok = train_bpe(texts, vocab_size=1000)
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tok.save(tmp / "tok" / "tokenizer.json")
        for preset in args.presets:
            model, hf = build(preset, tmp / "tok", tmp / preset)
            g = torch.Generator().manual_seed(1)
            prompts = [torch.randint(1, 1000, (args.prompt_tokens,), generator=g).tolist() for _ in range(8)]
            ours1, hf1 = single_stream(model, hf, prompts[0], args.new_tokens)
            agg1 = engine_rate(model, tok.decode, prompts[:1], args.new_tokens, 1)
            agg8 = engine_rate(model, tok.decode, prompts, args.new_tokens, 8)
            hf8 = hf_batch_rate(hf, prompts, args.new_tokens)
            p50, p99, http = http_load(model, tmp / "tok" / "tokenizer.json", prompts, args.new_tokens,
                                       args.clients, args.per_client)
            rows.append((preset, ours1, hf1, agg1, agg8, hf8, p50, p99, http))
            print(f"{preset}: single {ours1:.0f} vs {hf1:.0f} tok/s; engine 1={agg1:.0f} 8={agg8:.0f}; "
                  f"HF batch 8={hf8:.0f}; HTTP TTFT p50 {p50 * 1e3:.0f} ms p99 {p99 * 1e3:.0f} ms, {http:.0f} tok/s",
                  flush=True)
    head = (f"Machine: {cpu_description()}, torch {torch.__version__} ({args.threads} thread(s)), transformers "
            f"{transformers.__version__}; shared and loaded by other jobs. Prompt {args.prompt_tokens} tokens, "
            f"{args.new_tokens} new tokens, greedy, fp32, random weights, vocabulary 1000. Every one of the "
            f"{args.clients * args.per_client} HTTP requests completed.")
    table = ["| model | gptforge generate | transformers generate | ratio | engine 1 stream | engine 8 streams | "
             f"8 / 1 | transformers batch 8 | HTTP {args.clients}x{args.per_client} streams | TTFT p50 / p99 |",
             "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for preset, ours1, hf1, agg1, agg8, hf8, p50, p99, http in rows:
        table.append(f"| {preset} | {ours1:.0f} tok/s | {hf1:.0f} tok/s | {ours1 / hf1:.2f}x | {agg1:.0f} tok/s | "
                     f"{agg8:.0f} tok/s | {agg8 / agg1:.2f}x | {hf8:.0f} tok/s | {http:.0f} tok/s | "
                     f"{p50 * 1e3:.0f} / {p99 * 1e3:.0f} ms |")
    text = head + "\n\n" + "\n".join(table) + "\n"
    print("\n" + text)
    if args.write:
        cmd = "python bench/serve_throughput.py " + " ".join(sys.argv[1:])
        with open(REPO / "bench" / "RESULTS.md", "a") as f:
            f.write(f"\n## Generation and serving (issue: serve)\n\nCommand: `{cmd.strip()}`. {text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Generation and serving speed: gptforge against transformers, onnxruntime and llama.cpp on the
same weights, in one run.

    python bench/serve_throughput.py [--new-tokens 128] [--prompt-tokens 32] [--threads 1] [--grammar]
        [--dtypes fp32,bf16] [--presets gpt2-mini llama-micro] [--serving-only] [--rounds 3]
        [--uvicorn-loop auto|asyncio] [--uvicorn-http auto|h11] [--switch-interval S] [--engine-process]
        [--write]

For each preset (random weights, vocabulary 1000 from a BPE trained on the standard library; GPT-2
shapes with the tanh GELU that GPT-2 and llama.cpp's gpt2 graph use), exported as a Hugging Face
folder (loaded back with `AutoModelForCausalLM`), an ONNX folder and GGUF files:
1. single-stream greedy decode tokens/s, exactly --new-tokens tokens after the same prompt, best
   of 3 rounds that run each variant in turn: `gptforge.infer.generate.generate` against
   transformers' `generate` (KV cache on both,
   each --dtypes entry on both sides; gptforge also with `generate(compile=True)`, timed after its
   compiling first call), onnxruntime f32 (`OnnxDecoder.greedy`) and llama.cpp
   (llama-cpp-python, GGUF f32 and q8_0, greedy: top_k 1), each at --threads threads;
2. aggregate tokens/s of the continuous-batching engine with 8 concurrent streams vs 1
   (in process), and transformers' `generate` on a batch of 8 as a reference;
3. through HTTP (`gptforge serve`'s app on 127.0.0.1 in this process, max batch 8; with
   --engine-process its engine in a child process, whose CPU counts as the server's) with the load
   generator in its own process (--clients streaming clients x --per-client requests, default
   8 x 3): aggregate tokens/s against the in-process engine running the same closed-loop workload
   (`engine_clients`: same clients, requests, prompts, max batch and stop id: the server's
   completions stop at the tokenizer's end-of-text id), the two alternating for
   --rounds rounds; time to first token p50/p99, the CPU seconds of the load generator and of the
   server process, and where the server's time went (`EngineStats`: share of the wall time in engine
   steps, the engine thread's CPU and the rest of the process's, ms per decode pass, sequences per
   decode and prefill pass, prefill share, time in the event callbacks), in process and under HTTP.
4. with --grammar (--grammar-only: this alone): the grammar's cost per token, the engine's aggregate
   tokens/s with 8 streams sampled free, under a JSON schema (gptforge.infer.grammar, llguidance),
   and half of each in one batch (`engine_grammar_rates`).
Prints Markdown tables; --write appends them to bench/RESULTS.md with the command line.
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import torch
from machine import cpu_description  # bench/machine.py

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))




DTYPES = {"fp32": torch.float32, "bf16": torch.bfloat16}


def build(preset: str, tok_dir: Path, out: Path):
    """(gptforge GPT, the same weights in transformers, its ModelConfig), fp32, eval mode."""
    from transformers import AutoModelForCausalLM

    from gptforge.config import ModelConfig
    from gptforge.model.gpt import GPT
    from gptforge.model.hf_save import save_hf

    torch.manual_seed(0)
    extra = {"activation": "gelu_tanh"} if preset.startswith("gpt2") else {}
    cfg = ModelConfig(preset=preset, vocab_size=1000, **extra).resolved()
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


def single_stream(model, hf, prompt, n, dtype: torch.dtype, compiled: bool, rounds: int = 3):
    """(gptforge, transformers, gptforge with `generate(compile=True)` or None) greedy tokens/s for
    one prompt, all in `dtype`: the best of `rounds` rounds, each round running every variant once
    in turn (so a change of the machine's load hits all of them alike). The compiled variant's
    compiling first call comes before the rounds."""
    from gptforge.infer.generate import generate

    model, hf = copy.deepcopy(model).to(dtype), copy.deepcopy(hf).to(dtype)
    idx = torch.tensor([prompt])
    runs = {"ours": lambda: generate(model, idx, n, temperature=0),
            "theirs": lambda: hf.generate(idx, attention_mask=torch.ones_like(idx), max_new_tokens=n,
                                          min_new_tokens=n, do_sample=False, use_cache=True)}
    if compiled:
        runs["comp"] = lambda: generate(model, idx, n, temperature=0, compile=True)
    best = dict.fromkeys(runs, float("inf"))
    with torch.no_grad():
        if compiled:
            runs["comp"]()  # compiles
        for _ in range(rounds):
            for k, fn in runs.items():
                best[k] = min(best[k], best_of(fn, 1))
    return n / best["ours"], n / best["theirs"], (n / best["comp"]) if compiled else None


def other_runtimes(model, tok_dir: Path, root: Path, prompt, n, threads: int) -> dict[str, float | str]:
    """Greedy tokens/s of onnxruntime f32 and llama.cpp (GGUF f32, q8_0) on `model`'s weights; a
    runtime that cannot run maps to the reason (a string)."""
    out: dict[str, float | str] = {}
    try:
        import onnxruntime as ort

        from gptforge.export.onnx import OnnxDecoder, export_onnx

        export_onnx(model, {"tokenizer_dir": tok_dir, "hf_config": None, "generation_config": None},
                    root / "onnx", overwrite=True)
        dec = OnnxDecoder(root / "onnx")
        opts = ort.SessionOptions()
        opts.intra_op_num_threads = opts.inter_op_num_threads = threads  # as torch gets
        dec.session = ort.InferenceSession(str(root / "onnx" / "model.onnx"), opts,
                                           providers=["CPUExecutionProvider"])
        out["onnxruntime f32"] = n / best_of(lambda: dec.greedy(prompt, n))
    except ImportError as e:
        out["onnxruntime f32"] = f"not importable ({e.name})"
    try:
        import llama_cpp
    except ImportError:
        llama_cpp = None
    for q in ("f32", "q8_0"):
        if llama_cpp is None:
            out[f"llama.cpp {q}"] = "llama-cpp-python not installed"
            continue
        from gptforge.export.gguf import write_gguf

        f = root / f"m-{q}.gguf"
        write_gguf(model, tok_dir, f, dtype="f32", quantize=None if q == "f32" else q, warn=lambda m: None)
        llm = llama_cpp.Llama(str(f), n_ctx=max(256, len(prompt) + n + 8), n_threads=threads,
                              n_threads_batch=threads, verbose=False)

        def run(llm=llm):
            llm.reset()
            it = llm.generate(prompt, top_k=1, top_p=1.0, min_p=0.0, temp=0.0, repeat_penalty=1.0, reset=True)
            for _, _tok in zip(range(n), it, strict=False):
                pass

        out[f"llama.cpp {q}"] = n / best_of(run)
        llm.close()
    return out


def engine_rate(model, decode, prompts, n, batch):
    from gptforge.infer.engine import Engine, SamplingParams

    eng = Engine(model, decode, max_batch_size=batch)
    for p in prompts:
        eng.submit(p, SamplingParams(max_tokens=n, temperature=0), lambda ev: None)
    t = time.perf_counter()
    while eng.step():
        pass
    return len(prompts) * n / (time.perf_counter() - t)


GRAMMAR_SCHEMA = {"type": "array", "items": {"type": "object", "properties": {
    "name": {"type": "string"}, "score": {"type": "number"}}, "required": ["name", "score"]}}
"""The JSON schema of the constrained run (--grammar): a list of named scores, long enough for any n."""


def engine_grammar_rates(model, tok, prompts, n, batch=8, rounds=3) -> tuple[float, float, float]:
    """(free, constrained, half-and-half) aggregate tokens/s of the engine over `prompts`, sampled
    at temperature 1 (seed 0): free rows, rows under GRAMMAR_SCHEMA (gptforge.infer.grammar), and
    half of each in one batch; best of `rounds` rounds that run the three in turn. Tokens counted
    as generated (a constrained row that closes its JSON early counts what it made)."""
    from gptforge.infer.engine import Engine, SamplingParams
    from gptforge.infer.grammar import GrammarVocab, json_schema_grammar

    vocab = GrammarVocab(tok.to_str(), model.config.vocab_size, tok.eos_id)
    grammar = json_schema_grammar(GRAMMAR_SCHEMA, "bench")

    def run(constrained) -> float:
        eng = Engine(model, tok.decode, max_batch_size=batch)
        eng.grammar_vocab = vocab
        made = [0]

        def count(ev):
            made[0] += ev.token_id is not None

        t = time.perf_counter()
        for i, p in enumerate(prompts):
            eng.submit(p, SamplingParams(max_tokens=n, temperature=1.0, seed=i,
                                         grammar=grammar if constrained(i) else None), count)
        while eng.step():
            pass
        return made[0] / (time.perf_counter() - t)

    best = [0.0, 0.0, 0.0]
    for _ in range(rounds):
        for k, rule in enumerate((lambda i: False, lambda i: True, lambda i: i % 2 == 1)):
            best[k] = max(best[k], run(rule))
    return best[0], best[1], best[2]


def engine_clients(model, decode, prompts, n, clients, per_client, stop_token_ids=(), batch=8) -> dict:
    """The HTTP run's workload in process, as its reference: `clients` closed-loop clients, each
    submitting its next request (the same prompt order as the load generator's) as soon as its
    previous one finishes, on an engine of the same max batch, stepped in this thread. The requests
    stop at `stop_token_ids` as the server's do (it passes the tokenizer's end-of-text id), so a
    sequence that reaches it ends early in both runs. Returns tokens/s (generated tokens counted as
    the server's usage counts them), the engine's `EngineStats` and this process's CPU seconds."""
    from gptforge.infer.engine import Engine, SamplingParams

    eng = Engine(model, decode, max_batch_size=batch)
    done, tokens = [0] * clients, [0]
    params = SamplingParams(max_tokens=n, temperature=0, stop_token_ids=list(stop_token_ids))

    def send(c):
        def on_event(ev):
            tokens[0] += ev.token_id is not None
            if ev.finish_reason:
                done[c] += 1
                if done[c] < per_client:
                    send(c)
        eng.submit(prompts[(c + done[c]) % len(prompts)], params, on_event)

    for c in range(clients):
        send(c)
    t, cpu0 = time.perf_counter(), time.process_time()
    while eng.step():
        pass
    wall = time.perf_counter() - t
    return {"rate": tokens[0] / wall, "tokens": tokens[0], "wall": wall, "stats": eng.stats,
            "cpu": time.process_time() - cpu0}


def since(now, before):
    """The EngineStats accumulated between the snapshot `before` and `now`."""
    return type(now)(**{f.name: getattr(now, f.name) - getattr(before, f.name) for f in dataclasses.fields(now)})


def breakdown(st, wall: float) -> dict:
    """Per-step figures of an EngineStats over `wall` seconds: share of the wall in steps, ms per
    decode pass, rows per decode pass, prefill share of the step time, engine thread CPU seconds."""
    return {"busy": st.seconds / wall, "decode_ms": 1e3 * st.decode_seconds / max(st.decode_passes, 1),
            "rows": st.decode_rows / max(st.decode_passes, 1), "prefill_share": st.prefill_seconds / max(st.seconds, 1e-9),
            "prefill_per_pass": st.prefill_sequences / max(st.prefill_passes, 1), "engine_cpu": st.cpu_seconds,
            "emit_ms": 1e3 * st.emit_seconds / max(st.steps, 1), "steps": st.steps}


def hf_batch_rate(hf, prompts, n):
    idx = torch.tensor(prompts)
    with torch.no_grad():
        dt = best_of(lambda: hf.generate(idx, attention_mask=torch.ones_like(idx), max_new_tokens=n,
                                         min_new_tokens=n, do_sample=False, use_cache=True), 1)
    return len(prompts) * n / dt


def load_generator(spec: dict) -> dict:
    """The HTTP clients, run in their own process (`--load-generator`, spec as JSON on stdin):
    spec["clients"] threads, each sending spec["per_client"] streaming completions one after the
    other. One untimed request first warms the server (its first request builds what FastAPI and
    pydantic build lazily; the in-process reference runs on a warm engine too); the clock starts once
    every thread has made its HTTP client (making one loads certificates: tens of ms each, which is
    the load generator's cost, not the server's). Returns TTFTs (s), completion token counts, the
    wall seconds and this process's CPU seconds (user + system, all threads) of the timed part."""
    import httpx

    ttfts, tokens = [], []
    prompts = spec["prompts"]

    def request(h, prompt, n):
        body = {"model": "bench", "prompt": prompt, "max_tokens": n, "temperature": 0, "stream": True,
                "stream_options": {"include_usage": True}}
        t0, first, count = time.perf_counter(), None, None
        with h.stream("POST", spec["url"], json=body) as r:
            for line in r.iter_lines():
                if not line.startswith("data: {"):
                    continue
                chunk = json.loads(line[6:])
                if chunk["choices"] and first is None:
                    first = time.perf_counter() - t0
                if chunk.get("usage"):
                    count = chunk["usage"]["completion_tokens"]
        return first, count

    with httpx.Client(timeout=300) as h:
        request(h, prompts[0], 2)
    ready = threading.Barrier(spec["clients"] + 1)

    def client(c):
        with httpx.Client(timeout=300) as h:
            ready.wait()
            for k in range(spec["per_client"]):
                first, count = request(h, prompts[(c + k) % len(prompts)], spec["n"])
                ttfts.append(first)
                tokens.append(count)

    threads = [threading.Thread(target=client, args=(c,)) for c in range(spec["clients"])]
    for x in threads:
        x.start()
    ready.wait()
    print("timing", flush=True)  # the server process starts its clocks (http_load)
    cpu0, t = time.process_time(), time.perf_counter()
    for x in threads:
        x.join()
    return {"ttfts": ttfts, "tokens": tokens, "wall": time.perf_counter() - t, "cpu": time.process_time() - cpu0}


def http_load(model, tok_file, prompts, n, clients=8, per_client=3, loop="auto", http="auto",
              engine_process=False) -> dict:
    """Serve `model` in this process (with `engine_process`, its engine in a child process) and drive
    it from a load-generator process; returns its figures (see the module docstring, item 3)."""
    import socket

    import uvicorn

    from gptforge.serve.app import ServeConfig, create_app

    app = create_app(model, tok_file, ServeConfig(model_name="bench", max_batch_size=min(clients, 8),
                                                  engine_process=engine_process))
    engine = app.state.server.engine
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning", loop=loop, http=http))
    th = threading.Thread(target=server.run, kwargs={"sockets": [sock]}, daemon=True)
    th.start()
    while not server.started:
        time.sleep(0.02)
    spec = {"url": f"http://127.0.0.1:{sock.getsockname()[1]}/v1/completions", "prompts": prompts, "n": n,
            "clients": clients, "per_client": per_client}
    errors = tempfile.TemporaryFile("w+")
    proc = subprocess.Popen([sys.executable, __file__, "--load-generator"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE, stderr=errors, text=True, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert proc.stdin is not None and proc.stdout is not None
    proc.stdin.write(json.dumps(spec))
    proc.stdin.close()
    proc.stdout.readline()  # "timing": the warm-up request is done and every client is ready
    cpu0, stats0 = time.process_time(), copy.copy(engine.stats)
    child0 = getattr(engine, "child_cpu_seconds", 0.0)
    out = proc.stdout.read()
    proc.wait()
    # the engine process's CPU (as of its last step) counts as the server's
    server_cpu = time.process_time() - cpu0 + getattr(engine, "child_cpu_seconds", 0.0) - child0
    server.should_exit = True
    th.join(10)
    if proc.returncode:
        errors.seek(0)
        raise RuntimeError(f"load generator failed:\n{errors.read()[-2000:]}")
    r = json.loads(out.splitlines()[-1])
    if len(r["tokens"]) != clients * per_client:
        raise RuntimeError(f"only {len(r['tokens'])} of {clients * per_client} streamed requests completed")
    ttfts = sorted(r["ttfts"])
    return {"p50": statistics.median(ttfts), "p99": ttfts[min(len(ttfts) - 1, int(round(0.99 * (len(ttfts) - 1))))],
            "rate": sum(r["tokens"]) / r["wall"], "client_cpu": r["cpu"], "wall": r["wall"],
            "server_cpu": server_cpu, **breakdown(since(engine.stats, stats0), r["wall"])}
def _ratio(ours: float, theirs) -> str:
    return f"{theirs:.0f} tok/s | {ours / theirs:.2f}x" if isinstance(theirs, float) else f"{theirs} | -"


def tables(rows: list[dict], args) -> str:
    """The three Markdown tables of a run (decode against transformers, against the other runtimes,
    engine and HTTP)."""
    if args.grammar_only:
        return grammar_table(rows) + "\n"
    t1 = ["| model | dtype | gptforge generate | transformers generate | ratio | gptforge compiled | ratio |",
          "|---|---|---:|---:|---:|---:|---:|"]
    for r in rows:
        for d, (ours, theirs, comp) in r["single"].items():
            c = f"{comp:.0f} tok/s | {comp / theirs:.2f}x" if comp else "- | -"
            t1.append(f"| {r['preset']} | {d} | {ours:.0f} tok/s | {theirs:.0f} tok/s | {ours / theirs:.2f}x | {c} |")
    names = list(rows[0]["runtimes"])
    # gptforge / runtime: the faster of gptforge's eager and compiled fp32 decode.
    t2 = ["| model | gptforge fp32 (eager / compiled) | " + " | ".join(f"{n} | gptforge / {n}" for n in names) + " |",
          "|---|---:|" + "---:|---:|" * len(names)]
    for r in rows:
        eager, _, comp = r["single"].get("fp32", (float("nan"), None, None))
        ours = max(eager, comp or 0.0)
        t2.append(f"| {r['preset']} | {eager:.0f} / {comp or 0:.0f} tok/s | "
                  + " | ".join(_ratio(ours, r["runtimes"][n]) for n in names) + " |")
    w = f"{args.clients}x{args.per_client}"
    where = ", engine process" if args.engine_process else ""
    t3 = ["| model | engine 1 stream | engine 8 streams | 8 / 1 | transformers batch 8 | "
          f"in-process {w} (before / after) | HTTP {w} streams{where} | HTTP / in-process (every round) | TTFT p50 / p99 | "
          "load generator CPU | server process CPU | HTTP wall | in-process CPU / HTTP server CPU (every round) |",
          "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|"]
    t4 = ["| model | run | engine busy | engine thread CPU | rest of the server process CPU | ms per decode pass "
          "| sequences per decode pass | prefill share of step time | sequences per prefill pass | ms in callbacks per step |",
          "|---|---|---:|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        h = r.get("http")
        if not h:
            continue
        ref = (r["ref"][0]["rate"] + r["ref"][1]["rate"]) / 2
        t3.append(f"| {r['preset']} | {r['agg1']:.0f} tok/s | {r['agg8']:.0f} tok/s | {r['agg8'] / r['agg1']:.2f}x | "
                  f"{r['hf8']:.0f} tok/s | {r['ref'][0]['rate']:.0f} / {r['ref'][1]['rate']:.0f} tok/s | "
                  f"{h['rate']:.0f} tok/s | {h['rate'] / ref:.2f}x ({', '.join(f'{x:.2f}' for x in r['ratios'])}) | "
                  f"{h['p50'] * 1e3:.0f} / {h['p99'] * 1e3:.0f} ms | "
                  f"{h['client_cpu']:.1f} s | {h['server_cpu']:.1f} s | {h['wall']:.1f} s | "
                  f"{sorted(r['cpu_ratios'])[len(r['cpu_ratios']) // 2]:.2f}x "
                  f"({', '.join(f'{x:.2f}' for x in r['cpu_ratios'])}) |")
        for name, b, rest in (("in-process (before)", r["ref"][0]["breakdown"], "-"),
                              ("HTTP", h, f"{h['server_cpu'] - h['engine_cpu']:.1f} s")):
            t4.append(f"| {r['preset']} | {name} | {100 * b['busy']:.0f}% | {b['engine_cpu']:.1f} s | {rest} | "
                      f"{b['decode_ms']:.1f} | {b['rows']:.1f} | {100 * b['prefill_share']:.0f}% | "
                      f"{b['prefill_per_pass']:.1f} | {b['emit_ms']:.2f} |")
    parts = (t1, t2, t3, t4) if all(r.get("http") for r in rows) else (t1, t2)
    if args.serving_only:
        parts = (t3, t4)
    text = "\n\n".join("\n".join(t) for t in parts) + "\n"
    return text + ("\n" + grammar_table(rows) + "\n" if args.grammar else "")


def grammar_table(rows: list[dict]) -> str:
    """The Markdown table of --grammar (`engine_grammar_rates` of each preset)."""
    t = ["| model | engine 8 streams free | under a JSON schema | constrained / free | 4 free + 4 constrained |",
         "|---|---:|---:|---:|---:|"]
    for r in rows:
        free, con, mixed = r["grammar"]
        t.append(f"| {r['preset']} | {free:.0f} tok/s | {con:.0f} tok/s | {con / free:.2f}x | {mixed:.0f} tok/s |")
    return "\n".join(t)


def measure(preset: str, tok, tmp: Path, args) -> dict:
    """Every figure of one preset (see the module docstring)."""
    model, hf = build(preset, tmp / "tok", tmp / preset)
    g = torch.Generator().manual_seed(1)
    prompts = [torch.randint(1, 1000, (args.prompt_tokens,), generator=g).tolist() for _ in range(8)]
    r: dict = {"preset": preset, "single": {}}
    if args.grammar:
        r["grammar"] = engine_grammar_rates(model, tok, prompts, args.new_tokens)
        print(f"{preset}: free / constrained / mixed {r['grammar']} tok/s (load {os.getloadavg()[0]:.2f})",
              flush=True)
        if args.grammar_only:
            return r
    for d in ([] if args.serving_only else args.dtypes.split(",")):
        r["single"][d] = single_stream(model, hf, prompts[0], args.new_tokens, DTYPES[d], not args.no_compile)
        print(f"{preset} {d}: gptforge {r['single'][d][0]:.0f} vs transformers {r['single'][d][1]:.0f} tok/s; "
              f"compiled {r['single'][d][2]}", flush=True)
    r["runtimes"] = {} if args.serving_only else other_runtimes(model, tmp / "tok", tmp / f"{preset}-x", prompts[0],
                                                                 args.new_tokens, args.threads)
    print(f"{preset}: {r['runtimes']}", flush=True)
    r["agg1"] = engine_rate(model, tok.decode, prompts[:1], args.new_tokens, 1)
    r["agg8"] = engine_rate(model, tok.decode, prompts, args.new_tokens, 8)
    r["hf8"] = hf_batch_rate(hf, prompts, args.new_tokens)
    if not args.skip_http:
        # In-process reference and HTTP runs alternate (ref, HTTP, ref, HTTP, ..., ref): each HTTP
        # run is divided by the mean of the references just before and after it, so a change of the
        # machine's load between runs lands on both sides; the table shows the median round.
        def reference():
            ref = engine_clients(model, tok.decode, prompts, args.new_tokens, args.clients, args.per_client,
                                 [tok.eos_id])
            ref["breakdown"] = breakdown(ref["stats"], ref["wall"])
            return ref

        refs, https = [reference()], []
        for _ in range(args.rounds):
            https.append(http_load(model, tmp / "tok" / "tokenizer.json", prompts, args.new_tokens, args.clients,
                                   args.per_client, args.uvicorn_loop, args.uvicorn_http, args.engine_process))
            refs.append(reference())
        ratios = [h["rate"] / ((refs[i]["rate"] + refs[i + 1]["rate"]) / 2) for i, h in enumerate(https)]
        # The same comparison in CPU seconds of the serving process (in process: the engine's; HTTP:
        # the engine's, the event loop's and uvicorn's): on a shared machine a process's rate follows
        # its CPU time per token, and CPU time moves less with the load than wall time does.
        cpu_ratios = [((refs[i]["cpu"] + refs[i + 1]["cpu"]) / 2) / h["server_cpu"] for i, h in enumerate(https)]
        m = sorted(range(len(ratios)), key=ratios.__getitem__)[len(ratios) // 2]
        r["http"], r["ref"], r["ratios"], r["cpu_ratios"] = https[m], (refs[m], refs[m + 1]), ratios, cpu_ratios
        print(f"{preset}: engine 1={r['agg1']:.0f} 8={r['agg8']:.0f}; HF batch 8={r['hf8']:.0f}; HTTP {r['http']}",
              flush=True)
    return r


def main() -> int:
    if sys.argv[1:] == ["--load-generator"]:
        print(json.dumps(load_generator(json.loads(sys.stdin.read()))))
        return 0
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--new-tokens", type=int, default=128)
    ap.add_argument("--prompt-tokens", type=int, default=32)
    ap.add_argument("--threads", type=int, default=1, help="threads of every runtime (default 1: the machine is shared)")
    ap.add_argument("--presets", nargs="+", default=["gpt2-mini", "llama-micro"])
    ap.add_argument("--dtypes", default="fp32,bf16", help="dtypes of the gptforge / transformers decode (default fp32,bf16)")
    ap.add_argument("--clients", type=int, default=8, help="concurrent HTTP streaming clients (issue's full load: 32)")
    ap.add_argument("--per-client", type=int, default=3, help="requests per client (issue's full load: 10)")
    ap.add_argument("--no-compile", action="store_true", help="leave out gptforge's compiled decode")
    ap.add_argument("--serving-only", action="store_true",
                    help="only the engine and HTTP table (no single-stream decode, no other runtimes)")
    ap.add_argument("--skip-http", action="store_true", help="no HTTP part (third table left out)")
    ap.add_argument("--rounds", type=int, default=3, help="HTTP runs, each between two in-process references")
    ap.add_argument("--uvicorn-loop", default="auto", help="uvicorn's loop: auto (uvloop when installed) or asyncio")
    ap.add_argument("--uvicorn-http", default="auto", help="uvicorn's HTTP parser: auto (httptools when installed) or h11")
    ap.add_argument("--switch-interval", type=float, default=None,
                    help="sys.setswitchinterval of this (server) process, seconds (default Python's 0.005)")
    ap.add_argument("--engine-process", action="store_true",
                    help="serve with the engine in its own process (`gptforge serve --engine-process`)")
    ap.add_argument("--grammar", action="store_true",
                    help="also the grammar's cost: engine tokens/s free vs under a JSON schema (llguidance)")
    ap.add_argument("--grammar-only", action="store_true", help="only the grammar table (implies --grammar)")
    ap.add_argument("--write", action="store_true", help="append the tables to bench/RESULTS.md")
    args = ap.parse_args()
    args.grammar = args.grammar or args.grammar_only
    torch.set_num_threads(args.threads)
    if args.switch_interval is not None:
        sys.setswitchinterval(args.switch_interval)
    import transformers

    from gptforge.data.stdlib_corpus import stdlib_files
    from gptforge.data.tokenizer import train_bpe

    load0 = os.getloadavg()
    texts = [p.read_text(errors="replace") for p in stdlib_files()[:60]]
    tok = train_bpe(texts, vocab_size=1000)
    with tempfile.TemporaryDirectory() as tmp:
        tmp = Path(tmp)
        tok.save(tmp / "tok" / "tokenizer.json")
        rows = [measure(preset, tok, tmp, args) for preset in args.presets]
    loads = f"load average {load0[0]:.1f} at start, {os.getloadavg()[0]:.1f} at end"
    head = (f"Machine: {cpu_description()}, torch {torch.__version__} ({args.threads} thread(s) for every runtime), "
            f"transformers {transformers.__version__}; {loads}. Prompt {args.prompt_tokens} tokens, "
            f"{args.new_tokens} new tokens, greedy, random weights, vocabulary 1000.")
    text = head + "\n\n" + tables(rows, args)
    print("\n" + text)
    if args.write:
        cmd = "python bench/serve_throughput.py " + " ".join(sys.argv[1:])
        with open(REPO / "bench" / "RESULTS.md", "a") as f:
            title = ("The grammar's cost per token: constrained vs free decoding (issue 44)" if args.grammar_only
                     else "Decoding and serving against transformers, onnxruntime and llama.cpp (issue 29)")
            f.write(f"\n## {title}\n\n"
                    f"Command: `{cmd.strip()}`. {text}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""`gptforge serve RUN_OR_HF_DIR`: an OpenAI-compatible HTTP server with continuous batching."""

from __future__ import annotations

from dataclasses import dataclass

from gptforge.ranges import bounded

# One description: `gptforge --help` lists SUMMARY (read from this file unimported); DESCRIPTION begins with it.
SUMMARY = "Serve a run or Hugging Face folder over the OpenAI HTTP API (continuous batching, streaming)."

DESCRIPTION = SUMMARY + """

Serve a run directory, checkpoint or Hugging Face folder over the OpenAI HTTP API
(/v1/models, /v1/completions, /v1/chat/completions, /tokenize, /detokenize, /tokenizer_info,
/health, /metrics, /v1/load_lora_adapter, /v1/unload_lora_adapter; the OpenAPI schema at /openapi.json). Concurrent requests are decoded together;
beyond --max-batch-size they wait in arrival order, at most --max-queue of them. Binds to
127.0.0.1 unless --host says otherwise."""


@dataclass
class ServeOptions:
    model: str
    """Run directory (checkpoints/latest), checkpoint folder, or Hugging Face model folder."""
    host: str = "127.0.0.1"
    """Address to bind (0.0.0.0 exposes the server to the network: set --api-key then)."""
    port: int = bounded(8000, low=1, high=65535)
    """TCP port."""
    api_key: str | None = None
    """Require `Authorization: Bearer KEY` on every request except /health and /metrics."""
    max_batch_size: int = bounded(8, low=1)
    """Sequences decoded together; further requests queue in arrival order."""
    max_model_len: int | None = bounded(None, low=1)
    """Positions per sequence, prompt + generated (default and maximum: the model's block_size)."""
    max_queue: int | None = bounded(None, low=0)
    """Sequences that may wait for a cache slot; a request needing more gets 429 + Retry-After (default: no bound)."""
    device: str = "auto"
    """auto, cpu, cuda, mps."""
    precision: str = "auto"
    """auto (fp32 on CPU, bf16 on CUDA), fp32, bf16, fp16."""
    served_model_name: str | None = None
    """The model id clients send (default: the folder's name)."""
    chat_template: str | None = None
    """`default` forces the default chat template; unset: the tokenizer's template, else the default."""
    engine_process: bool = False
    """Run the model in its own process, beside the HTTP event loop (faster under many streams on a CPU)."""
    engine_restarts: int = bounded(3, low=0)
    """With --engine-process: new engine processes started within 10 minutes after one dies (0: none)."""
    prefix_caching: bool = True
    """Prefix reuse (on unless --no-prefix-caching): the leading tokens of a prompt that an earlier prompt
    in any cache slot started with skip their prefill (usage.prompt_tokens_details.cached_tokens)."""
    prefix_cache_slots: int = bounded(0, low=0)
    """Extra KV cache slots (each max-model-len positions) that keep earlier prompts' prefixes once
    their slots are reused; the least recently used is replaced."""
    speculative: str | None = None
    """`ngram`: speculative decoding with drafts looked up in the prompt and output so far, verified in one pass."""
    num_speculative_tokens: int = bounded(4, low=1)
    """Draft tokens per sequence and step with --speculative."""
    compile: bool = False
    """Decode through compiled static-shape steps, one per batch size and cache-length bucket (as
    `generate --compile`; each compiles on first use, seconds on a CPU). Not for speculative passes."""
    lora: str | None = None
    """LoRA adapters served by name, NAME=RUN_DIR[,NAME=RUN_DIR...]: a request whose `model` is NAME runs
    with the adapters of that LoRA fine-tune of this model, inside the same batch as the others."""


SERVE_PACKAGES = {"fastapi": "fastapi", "uvicorn": "uvicorn", "prometheus_client": "prometheus-client"}
"""The `serve` extra: {module: pip package}."""


def check_options(opts: ServeOptions) -> None:
    """Refuse, before any package or model is loaded, option values no model can serve that the
    fields' ranges (`bounded`, checked by the parser) leave (the upper bound of --max-model-len,
    the model's block_size, is checked once the model is loaded).

    Raises:
        OptionError: naming the option and its allowed values.
    """
    from gptforge.errors import OptionError

    if opts.speculative not in (None, "ngram"):
        raise OptionError(f"--speculative {opts.speculative!r}: the only method is `ngram`")
    if opts.lora and opts.engine_process:
        raise OptionError("--lora needs the in-process engine: drop --engine-process or --lora")
    if opts.chat_template not in (None, "default"):
        raise OptionError(f"--chat-template {opts.chat_template!r}: the only value is `default`")


def main(argv: list[str]) -> int:
    from pathlib import Path

    from gptforge.errors import InputError, OptionError, require_extra
    from gptforge.options import command_parser, parse_command

    opts, _ = parse_command(command_parser("gptforge serve", DESCRIPTION, ServeOptions, positional=("model",)), argv)
    check_options(opts)
    require_extra("gptforge serve", "serve", SERVE_PACKAGES)
    import uvicorn

    from gptforge.infer.slots import kv_cache_excess
    from gptforge.serve.adapters import parse_lora_option
    from gptforge.serve.app import ServeConfig, create_app, load_model
    from gptforge.serve.listen import bind_listening_socket, draining_server

    model, tok, template = load_model(opts.model, opts.device, opts.precision)
    block = model.config.block_size
    if opts.max_model_len is not None and not 0 < opts.max_model_len <= block:
        raise OptionError(f"--max-model-len must be in 1..{block} (the model's block_size), got {opts.max_model_len}")
    excess = kv_cache_excess(model, opts.max_batch_size + opts.prefix_cache_slots, opts.max_model_len or block)
    if excess is not None:
        spare = f" + --prefix-cache-slots {opts.prefix_cache_slots}" if opts.prefix_cache_slots else ""
        raise OptionError(f"--max-batch-size {opts.max_batch_size}{spare}: {excess}; lower --max-batch-size"
                          f"{' or --prefix-cache-slots' if spare else ''} or --max-model-len")
    name = opts.served_model_name or Path(opts.model).resolve().name
    cfg = ServeConfig(model_name=name, api_key=opts.api_key, max_batch_size=opts.max_batch_size,
                      max_model_len=opts.max_model_len, chat_template=opts.chat_template or template,
                      max_queue=opts.max_queue, engine_process=opts.engine_process,
                      engine_restarts=opts.engine_restarts, prefix_caching=opts.prefix_caching,
                      prefix_cache_slots=opts.prefix_cache_slots, speculative=opts.speculative,
                      num_speculative_tokens=opts.num_speculative_tokens, compile_decode=opts.compile)
    try:
        cfg.lora_modules = parse_lora_option(opts.lora)
        app = create_app(model, tok, cfg)
    except ValueError as e:  # a bad --lora entry or an adapter of another base: one line
        raise InputError(str(e)) from None
    sock = bind_listening_socket(opts.host, opts.port)  # a busy port: one error line, not uvicorn's
    print(f"serving {name!r} on http://{opts.host}:{opts.port}/v1 (context {cfg.max_model_len or block}, "
          f"batch {opts.max_batch_size})", flush=True)
    server = draining_server(app, uvicorn.Config(app, host=opts.host, port=opts.port, log_level="warning",
                                                 timeout_graceful_shutdown=10))
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
    return 0

"""The OpenAI-compatible HTTP server: FastAPI routes over a continuous-batching `Engine`.

Endpoints (OpenAI API reference; tokenizer routes as vLLM names them, which lm-eval probes):
GET /v1/models, POST /v1/completions, POST /v1/chat/completions, POST /tokenize,
POST /detokenize, GET /tokenizer_info, GET /health, GET /metrics (Prometheus text format), and
POST /v1/load_lora_adapter, POST /v1/unload_lora_adapter (LoRA adapters served by name,
`gptforge.serve.adapters`), and GET /openapi.json, the OpenAPI 3.1 schema of all of them
(`gptforge.serve.openapi`).

Streaming is server-sent events as OpenAI sends them: `data: {json}\\n\\n` per chunk, then
`data: [DONE]\\n\\n`. The first chat chunk of each choice carries `delta.role`; each choice ends
with a chunk holding its finish_reason ("length" when max_tokens, or the end of the context when
max_tokens is not given, ended it; "stop" for a stop string or the end-of-text token). With
`stream_options.include_usage`, every chunk has `"usage": null` and one last chunk with empty
choices carries the usage; without it there is no usage field. Text is streamed in whole
characters only (`gptforge.infer.stream`).

Errors are OpenAI's error JSON: 400 for invalid parameters (naming the field; a prompt that
cannot fit in the context is refused before it is tokenized), 401 without the API key, 404 for
an unknown model or route, 413 for a body over `max_body_bytes`, 429 with Retry-After when more
than `max_queue` sequences would wait for a cache slot. A client that disconnects has its
sequences cancelled at once, which frees their cache slots.

Layout: `server.Server` holds the state (tokenizer, engine, metrics, admission); the routes live
in `completions`, `chat` and `info`; this module wires them into one FastAPI app.
"""

from __future__ import annotations

from contextlib import asynccontextmanager
from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse
from starlette.exceptions import HTTPException as StarletteHTTPException

from gptforge.serve import adapters, chat, completions, info, page
from gptforge.serve.openapi import OPEN_PATHS, openapi
from gptforge.serve.protocol import APIError
from gptforge.serve.server import ServeConfig, Server

__all__ = ["ServeConfig", "Server", "create_app", "load_model"]


@asynccontextmanager
async def _lifespan(app: FastAPI):
    engine = app.state.server.engine
    engine.start()
    try:
        yield
    finally:
        engine.stop()


def _error_response(request: Request, e: APIError) -> JSONResponse:
    request.app.state.server.metrics.requests.labels(request.url.path, str(e.status)).inc()
    return JSONResponse(e.body(), status_code=e.status, headers=e.headers)


async def _api_error(request: Request, e: APIError) -> JSONResponse:
    return _error_response(request, e)


async def _http_error(request: Request, e: StarletteHTTPException) -> JSONResponse:
    code = "not_found" if e.status_code == 404 else None
    return _error_response(request, APIError(e.status_code, f"{request.method} {request.url.path}: {e.detail}",
                                             code=code))


class Guard:
    """ASGI middleware: the API key (every path but OPEN_PATHS) and the body size (Content-Length),
    checked before any route runs. A plain ASGI class rather than `app.middleware("http")`, whose
    BaseHTTPMiddleware passes every chunk of a streamed response through an extra memory stream and
    task on the event loop: measurable per token when several streams are served at once."""

    def __init__(self, app):
        self.app = app

    async def __call__(self, scope, receive, send):
        if scope["type"] == "http":
            refusal = self.refusal(Request(scope))
            if refusal is not None:
                await refusal(scope, receive, send)
                return
        await self.app(scope, receive, send)

    @staticmethod
    def refusal(request: Request) -> JSONResponse | None:
        """The 401 or 413 answer for `request`, or None when it may proceed."""
        cfg = request.app.state.server.cfg
        path = request.url.path
        if cfg.api_key is not None and path not in OPEN_PATHS:
            if request.headers.get("authorization", "") != f"Bearer {cfg.api_key}":
                return _error_response(request, APIError(
                    401, "Incorrect or missing API key: send `Authorization: Bearer KEY`", code="invalid_api_key"))
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > cfg.max_body_bytes:
            return _error_response(request, APIError(
                413, f"request body of {length} bytes is over the limit of {cfg.max_body_bytes} bytes",
                code="request_too_large"))
        return None


def create_app(model, tokenizer_file: str | Path, cfg: ServeConfig | None = None) -> FastAPI:
    """A FastAPI app serving `model` (a GPT in eval mode) with the tokenizer at `tokenizer_file`.

    The engine thread starts with the app (its lifespan) and stops with it; `app.state.server`
    holds the `Server`; GET /openapi.json is the schema.

    Raises:
        ValueError: see `Engine` (max_model_len above block_size).
    """
    cfg = cfg or ServeConfig()
    srv = Server(model, Path(tokenizer_file), cfg)
    app = FastAPI(title="gptforge", version="1", lifespan=_lifespan, docs_url=None, redoc_url=None,
                  openapi_url="/openapi.json",
                  description="OpenAI-compatible completions and chat over a continuous-batching engine.")
    app.state.server = srv
    for module in (completions, chat, info, adapters, page):
        app.include_router(module.router)
    # Starlette types a handler as taking any Exception; each of these takes the class it is registered for.
    app.add_exception_handler(APIError, _api_error)  # type: ignore[arg-type]
    app.add_exception_handler(StarletteHTTPException, _http_error)  # type: ignore[arg-type]
    app.add_middleware(Guard)
    app.openapi = lambda: openapi(app)  # type: ignore[method-assign]  # FastAPI's documented override
    return app


def load_model(path: str | Path, device: str = "auto", precision: str = "auto"):
    """(GPT in eval mode, tokenizer.json path, chat template choice) for serving `path`: a gptforge
    run directory or checkpoint folder (`load_for_inference`) or a Hugging Face folder
    (`load_pretrained`). precision: auto (fp32 on CPU, bf16 on CUDA when supported), fp32, bf16, fp16.
    The chat template choice is "default" for a run fine-tuned with the default template, else None.

    Raises:
        MissingInputError: no model or no tokenizer.json at `path`. InputError: an unknown precision.
    """
    import torch

    from gptforge.errors import InputError, MissingInputError
    from gptforge.runtime.device import pick_device
    from gptforge.runtime.loading import load_for_inference, load_pretrained

    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    if precision not in ("auto", *dtypes):
        raise InputError(f"--precision {precision!r}: use auto, fp32, bf16 or fp16")
    dev = pick_device(device, "--device")
    path = Path(path)
    if not path.exists():
        raise MissingInputError(f"{path}: no such run directory, checkpoint or Hugging Face folder")
    template = None
    if (path / "config.json").is_file():
        model, src = load_pretrained(path)
        tok = src["tokenizer_dir"] / "tokenizer.json" if src["tokenizer_dir"] is not None else None
    else:
        model, _ckpt, doc, tok = load_for_inference(path, "cpu")
        if ((doc.get("finetune") or {}).get("chat_template")) == "default":
            template = "default"
    if tok is None or not Path(tok).is_file():
        raise MissingInputError(f"{path}: no tokenizer.json in the model folder, its run directory or its data folder")
    if precision == "auto":
        precision = "bf16" if dev.type == "cuda" and torch.cuda.is_bf16_supported() else "fp32"
    model = model.to(device=dev, dtype=dtypes[precision]).eval()
    model.reset_rope()  # RoPE tables stay fp32 whatever the weights' dtype
    return model, Path(tok), template

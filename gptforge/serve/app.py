"""The OpenAI-compatible HTTP server: FastAPI routes over a continuous-batching `Engine`.

Endpoints (OpenAI API reference; tokenizer routes as vLLM names them, which lm-eval probes):
GET /v1/models, POST /v1/completions, POST /v1/chat/completions, POST /tokenize,
POST /detokenize, GET /tokenizer_info, GET /health, GET /metrics (Prometheus text format).

Streaming is server-sent events as OpenAI sends them: `data: {json}\\n\\n` per chunk, then
`data: [DONE]\\n\\n`. The first chat chunk of each choice carries `delta.role`; each choice ends
with a chunk holding its finish_reason ("length" when max_tokens, or the end of the context when
max_tokens is not given, ended it; "stop" for a stop string or the end-of-text token). With
`stream_options.include_usage`, every chunk has `"usage": null` and one last chunk with empty
choices carries the usage; without it there is no usage field. Text is streamed in whole
characters only (`gptforge.infer.stream`).

Errors are OpenAI's error JSON: 400 for invalid parameters (naming the field), 401 without the
API key, 404 for an unknown model or route, 413 for a body over `max_body_bytes`. A client that
disconnects has its sequences cancelled at once, which frees their cache slots.
"""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from contextlib import asynccontextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from pydantic import ValidationError
from starlette.exceptions import HTTPException as StarletteHTTPException

from gptforge.infer.engine import Engine, Event, SamplingParams
from gptforge.serve.protocol import (
    UNSUPPORTED,
    APIError,
    ChatRequest,
    CompletionRequest,
    DetokenizeRequest,
    TokenizeRequest,
)


@dataclass
class ServeConfig:
    """What `create_app` serves and how."""

    model_name: str = "gptforge"
    """The model id clients name (GET /v1/models lists it; another name is a 404)."""
    api_key: str | None = None
    """When set, every request except /health and /metrics needs `Authorization: Bearer KEY`."""
    max_batch_size: int = 8
    """Sequences decoded together; more wait in arrival order."""
    max_model_len: int | None = None
    """Positions per sequence (prompt + generated); default the model's block_size."""
    chat_template: str | None = None
    """None: the tokenizer's chat template when it has one, else the default; "default": always the default."""
    max_body_bytes: int = 4 * 2**20
    """Largest accepted request body (bytes); larger ones get 413."""


class Metrics:
    """Prometheus metrics of one server, in their own registry (several apps may share a process)."""

    def __init__(self, engine: Engine):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        r = self.registry = CollectorRegistry()
        self.requests = Counter("gptforge_requests", "HTTP requests answered", ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("gptforge_prompt_tokens", "Prompt tokens processed", registry=r)
        self.generation_tokens = Counter("gptforge_generation_tokens", "Tokens generated", registry=r)
        Gauge("gptforge_queue_length", "Sequences waiting for a cache slot", registry=r).set_function(
            lambda: engine.num_waiting)
        Gauge("gptforge_running_sequences", "Sequences being decoded", registry=r).set_function(
            lambda: engine.num_running)
        buckets = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30)
        self.ttft = Histogram("gptforge_time_to_first_token_seconds", "Time from request to its first token",
                              buckets=buckets, registry=r)
        self.tpot = Histogram("gptforge_time_per_output_token_seconds", "Time between successive tokens",
                              buckets=buckets, registry=r)


def _err(status: int, message: str, param: str | None = None, code: str | None = None) -> APIError:
    return APIError(status, message, param, code)


def _is_union_tag(part) -> bool:
    # pydantic names the member of a union it tried in the error location ("str", "list[int]", "ContentPart").
    return isinstance(part, str) and (part in ("str", "int", "float", "bool") or "[" in part or part[:1].isupper())


def _validation_error(e) -> APIError:
    first = e.errors()[0]
    loc = ".".join(str(p) for p in first["loc"] if not _is_union_tag(p))
    if first["type"] == "extra_forbidden":
        return _err(400, f"unrecognized request argument supplied: {loc}", loc, "invalid_field")
    return _err(400, f"{loc}: {first['msg']} (got {first.get('input')!r})"[:500], loc, "invalid_value")


class Server:
    """The state behind the routes: tokenizer, engine, metrics. Build with `create_app`."""

    def __init__(self, model, tokenizer_file: Path, cfg: ServeConfig):
        from gptforge.data.instruct import DEFAULT_TEMPLATE, ChatTokenizer
        from gptforge.data.tokenizer import Tokenizer

        self.cfg = cfg
        self.tok = Tokenizer.from_file(tokenizer_file)
        self.chat = ChatTokenizer.from_dir(tokenizer_file)
        self.template = DEFAULT_TEMPLATE if cfg.chat_template == "default" else None
        self.engine = Engine(model, self.tok.decode, cfg.max_batch_size, cfg.max_model_len)
        self.max_model_len = self.engine.max_model_len
        self.metrics = Metrics(self.engine)
        self.created = int(time.time())
        self._piece_cache: dict[int, str] = {}

    # ---- helpers ------------------------------------------------------------------------------

    def piece(self, token_id: int) -> str:
        """The text of one token (as logprobs name it)."""
        s = self._piece_cache.get(token_id)
        if s is None:
            s = self._piece_cache[token_id] = self.tok.decode([token_id])
        return s

    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.cfg.model_name:
            raise _err(404, f"The model `{name}` does not exist; this server serves `{self.cfg.model_name}`",
                       "model", "model_not_found")

    def check_unsupported(self, req) -> None:
        for name in UNSUPPORTED:
            if getattr(req, name, None) is not None:
                raise _err(400, f"`{name}` is not supported by this server", name, "unsupported_parameter")
        best_of = getattr(req, "best_of", None)
        if best_of is not None and best_of != req.n:
            raise _err(400, "`best_of` other than n is not supported by this server", "best_of",
                       "unsupported_parameter")

    def encode(self, text: str) -> list[int]:
        """Ids of a prompt string; special-token spellings in it ("<|endoftext|>") are those tokens, as in
        OpenAI's and vLLM's completions (chat message contents, by contrast, are always plain text)."""
        return self.chat.encode_template(text)

    def prompt_ids(self, prompt) -> list[list[int]]:
        """A completions prompt (str, [str], [int], [[int]]) -> lists of token ids."""
        if isinstance(prompt, str):
            prompts = [self.encode(prompt)]
        elif prompt and all(isinstance(p, str) for p in prompt):
            prompts = [self.encode(p) for p in prompt]
        elif prompt and all(isinstance(p, int) for p in prompt):
            prompts = [list(prompt)]
        else:
            prompts = [list(p) for p in prompt]
        if not prompts:
            raise _err(400, "prompt is an empty list", "prompt", "invalid_value")
        for i, p in enumerate(prompts):
            if not p:
                raise _err(400, f"prompt {i} is empty (no tokens)", "prompt", "invalid_value")
            bad = next((t for t in p if not 0 <= t < self.tok.vocab_size), None)
            if bad is not None:
                raise _err(400, f"prompt {i}: token id {bad} is outside the vocabulary [0, {self.tok.vocab_size})",
                           "prompt", "invalid_value")
        return prompts

    def chat_ids(self, messages) -> list[int]:
        from gptforge.data.instruct import prompt_ids

        rendered = []
        for j, m in enumerate(messages):
            content = m.content
            if isinstance(content, list):
                content = "".join(p.text for p in content)
            if content is None:
                raise _err(400, f"messages[{j}].content is missing", f"messages.{j}.content", "invalid_value")
            rendered.append({"role": "system" if m.role == "developer" else m.role, "content": content})
        try:
            return prompt_ids(self.chat, rendered, self.template)
        except ValueError as e:
            raise _err(400, str(e), "messages", "invalid_value") from None

    def params(self, req, prompt_len: int, max_tokens: int | None, allow_zero: bool, stop_ids: list[int],
               logprobs: int | None, prompt_logprobs: int | None, choice: int) -> SamplingParams:
        room = self.max_model_len - prompt_len
        if max_tokens is None:
            if room < 1:
                raise _err(400, f"the prompt has {prompt_len} tokens: no room left in the model's context of "
                                f"{self.max_model_len} tokens", "prompt", "context_length_exceeded")
            max_tokens = room
        elif max_tokens < 0 or (max_tokens == 0 and not allow_zero):
            raise _err(400, f"max_tokens must be at least 1{' (0 only with echo)' if allow_zero is False else ''}, "
                            f"got {max_tokens}", "max_tokens", "invalid_value")
        elif max_tokens > room:
            raise _err(400, f"the prompt has {prompt_len} tokens and max_tokens is {max_tokens}: together "
                            f"{prompt_len + max_tokens}, more than the model's context of {self.max_model_len} "
                            "tokens", "max_tokens", "context_length_exceeded")
        stop = [req.stop] if isinstance(req.stop, str) else list(req.stop or [])
        return SamplingParams(
            max_tokens=max_tokens, temperature=req.temperature, top_k=max(req.top_k, 0), top_p=req.top_p,
            seed=None if req.seed is None else (req.seed + choice) % 2**64, stop=stop, stop_token_ids=stop_ids,
            logprobs=logprobs, prompt_logprobs=prompt_logprobs, presence_penalty=req.presence_penalty,
            frequency_penalty=req.frequency_penalty)

    async def run(self, request, jobs: list[tuple[list[int], SamplingParams]]):
        """Submit every job; yield (job index, Event) as they come, cancelling all on exit
        (client gone, error, or done)."""
        loop = asyncio.get_running_loop()
        queue: asyncio.Queue = asyncio.Queue()

        def sink(i):
            def on_event(ev: Event):
                try:
                    loop.call_soon_threadsafe(queue.put_nowait, (i, ev))
                except RuntimeError:  # the event loop has closed: the server is shutting down
                    pass
            return on_event

        seqs = []
        try:
            for i, (prompt, params) in enumerate(jobs):
                seqs.append(self.engine.submit(prompt, params, sink(i)))
                self.metrics.prompt_tokens.inc(len(prompt))
            left = len(jobs)
            while left:
                try:
                    i, ev = await asyncio.wait_for(queue.get(), timeout=0.5)
                except asyncio.TimeoutError:
                    if await request.is_disconnected():
                        return
                    continue
                if ev.token_id is not None:
                    self.metrics.generation_tokens.inc()
                if ev.finish_reason:
                    left -= 1
                yield i, ev
        finally:
            for s in seqs:
                if not s.finished:
                    self.engine.cancel(s)


    async def collect(self, request, jobs: list[tuple[list[int], SamplingParams]], start: float, on_event=None):
        """Run `jobs` to the end for a non-streaming response: (texts, completion token counts,
        finish reasons), one entry per job, or None when the client went away before every job
        finished. Observes the time to first token from `start` (time.monotonic() seconds);
        `on_event(j, ev)` sees every event first (logprob collection).

        Raises:
            APIError: 500 when generation failed inside the engine.
        """
        n = len(jobs)
        texts, counts, reasons = [""] * n, [0] * n, [None] * n
        first = True
        async for j, ev in self.run(request, jobs):
            if first:
                self.metrics.ttft.observe(time.monotonic() - start)
                first = False
            if ev.finish_reason == "error":
                raise APIError(500, f"generation failed: {ev.error}", type="server_error")
            if on_event is not None:
                on_event(j, ev)
            if ev.token_id is not None:
                counts[j] += 1
            texts[j] += ev.text
            reasons[j] = ev.finish_reason or reasons[j]
        if any(r is None for r in reasons):
            return None
        return texts, counts, reasons


def _sse(obj) -> str:
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


def create_app(model, tokenizer_file: str | Path, cfg: ServeConfig | None = None):
    """A FastAPI app serving `model` (a GPT in eval mode) with the tokenizer at `tokenizer_file`.

    The engine thread starts with the app (its lifespan) and stops with it; `app.state.server`
    holds the `Server`.

    Raises:
        ValueError: see `Engine` (max_model_len above block_size).
    """
    cfg = cfg or ServeConfig()
    srv = Server(model, Path(tokenizer_file), cfg)

    @asynccontextmanager
    async def lifespan(_app):
        srv.engine.start()
        try:
            yield
        finally:
            srv.engine.stop()

    app = FastAPI(title="gptforge", lifespan=lifespan, docs_url=None, redoc_url=None, openapi_url=None)
    app.state.server = srv

    def error_response(e: APIError, endpoint: str):
        srv.metrics.requests.labels(endpoint, str(e.status)).inc()
        return JSONResponse(e.body(), status_code=e.status)

    @app.exception_handler(APIError)
    async def _api_error(request: Request, e: APIError):
        return error_response(e, request.url.path)

    @app.exception_handler(StarletteHTTPException)
    async def _http_error(request: Request, e: StarletteHTTPException):
        code = "not_found" if e.status_code == 404 else None
        return error_response(APIError(e.status_code, f"{request.method} {request.url.path}: {e.detail}",
                                       code=code), request.url.path)

    @app.middleware("http")
    async def guard(request: Request, call_next):
        path = request.url.path
        if cfg.api_key is not None and path not in ("/health", "/metrics"):
            if request.headers.get("authorization", "") != f"Bearer {cfg.api_key}":
                return error_response(APIError(401, "Incorrect or missing API key: send `Authorization: Bearer KEY`",
                                               code="invalid_api_key"), path)
        length = request.headers.get("content-length")
        if length is not None and length.isdigit() and int(length) > cfg.max_body_bytes:
            return error_response(APIError(413, f"request body of {length} bytes is over the limit of "
                                                f"{cfg.max_body_bytes} bytes", code="request_too_large"), path)
        return await call_next(request)

    async def body(request: Request, cls):
        raw = await request.body()
        if len(raw) > cfg.max_body_bytes:
            raise APIError(413, f"request body of {len(raw)} bytes is over the limit of {cfg.max_body_bytes} bytes",
                           code="request_too_large")
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise _err(400, f"the request body is not valid JSON ({e})", None, "invalid_json") from None
        if not isinstance(data, dict):
            raise _err(400, "the request body must be a JSON object", None, "invalid_json")
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            raise _validation_error(e) from None

    def ok(endpoint: str, payload):
        srv.metrics.requests.labels(endpoint, "200").inc()
        return payload

    @app.get("/health")
    async def health():
        return Response(status_code=200)

    @app.get("/metrics")
    async def metrics():
        from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

        return Response(generate_latest(srv.metrics.registry), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models():
        return ok("/v1/models", {"object": "list", "data": [
            {"id": cfg.model_name, "object": "model", "created": srv.created, "owned_by": "gptforge",
             "max_model_len": srv.max_model_len}]})

    @app.get("/tokenizer_info")
    async def tokenizer_info():
        return ok("/tokenizer_info", {
            "tokenizer_class": "PreTrainedTokenizerFast", "vocab_size": srv.tok.vocab_size,
            "eos_token": srv.tok.eos_token, "eos_token_id": srv.tok.eos_id, "max_model_len": srv.max_model_len,
            "model_max_length": srv.max_model_len, "chat_template": srv.chat.chat_template,
            "bos_token": srv.chat.bos_token, "add_bos_token": srv.chat.add_bos})

    @app.post("/tokenize")
    async def tokenize(request: Request):
        req = await body(request, TokenizeRequest)
        srv.check_model(req.model)
        if (req.prompt is None) == (req.messages is None):
            raise _err(400, "give exactly one of `prompt` or `messages`", "prompt", "invalid_value")
        ids = srv.encode(req.prompt) if req.prompt is not None else srv.chat_ids(req.messages)
        return ok("/tokenize", {"count": len(ids), "max_model_len": srv.max_model_len, "tokens": ids})

    @app.post("/detokenize")
    async def detokenize(request: Request):
        req = await body(request, DetokenizeRequest)
        srv.check_model(req.model)
        bad = next((t for t in req.tokens if not 0 <= t < srv.tok.vocab_size), None)
        if bad is not None:
            raise _err(400, f"token id {bad} is outside the vocabulary [0, {srv.tok.vocab_size})", "tokens",
                       "invalid_value")
        return ok("/detokenize", {"prompt": srv.tok.decode(req.tokens)})

    def usage(prompt_tokens: int, completion_tokens: int) -> dict:
        return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
                "total_tokens": prompt_tokens + completion_tokens}

    # ---- /v1/completions ----------------------------------------------------------------------

    @app.post("/v1/completions")
    async def completions(request: Request):
        req = await body(request, CompletionRequest)
        srv.check_model(req.model)
        srv.check_unsupported(req)
        prompts = srv.prompt_ids(req.prompt)
        # Choice index j = prompt index * n + c, as OpenAI numbers the choices of several prompts.
        jobs = [(p, srv.params(req, len(p), req.max_tokens, req.echo, [srv.tok.eos_id], req.logprobs,
                               req.logprobs if req.echo and req.logprobs is not None else None, c))
                for p in prompts for c in range(req.n)]
        rid, created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        include_usage = bool(req.stream_options and req.stream_options.include_usage)
        n_prompt = sum(len(p) for p in prompts)

        def logprob_block(entries, offset0: int):
            """OpenAI completions logprobs: tokens, token_logprobs, top_logprobs, text_offset."""
            out: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
            offset = offset0
            for token_id, lp in entries:
                piece = srv.piece(token_id)
                out["tokens"].append(piece)
                out["token_logprobs"].append(None if lp is None else lp.logprob)
                out["top_logprobs"].append(None if lp is None else {srv.piece(t): v for t, v in lp.top})
                out["text_offset"].append(offset)
                offset += len(piece)
            return out

        def echo_entries(j, ev):
            return list(zip(jobs[j][0], ev.prompt_logprobs, strict=False)) if ev.prompt_logprobs is not None else []

        def prompt_text(j):
            return srv.tok.decode(jobs[j][0])

        start = time.monotonic()
        if req.stream:
            async def events():
                last: dict[int, float] = {}
                completion_tokens = 0
                first = True
                async for j, ev in srv.run(request, jobs):
                    now = time.monotonic()
                    if first:
                        srv.metrics.ttft.observe(now - start)
                        first = False
                    elif j in last:
                        srv.metrics.tpot.observe(now - last[j])
                    last[j] = now
                    text, entries = ev.text, []
                    if req.echo and j not in echoed:  # a choice's first chunk starts with its prompt
                        echoed.add(j)
                        text = prompt_text(j) + text
                        entries = echo_entries(j, ev)
                    if ev.token_id is not None:
                        completion_tokens += 1
                        entries = entries + [(ev.token_id, ev.logprob)]
                    choice = {"index": j, "text": text, "logprobs": None, "finish_reason": ev.finish_reason}
                    if req.logprobs is not None:
                        choice["logprobs"] = logprob_block(entries, 0)
                    if ev.finish_reason == "error":
                        yield _sse({"error": {"message": ev.error, "type": "server_error", "param": None,
                                              "code": None}})
                        return
                    chunk = {"id": rid, "object": "text_completion", "created": created, "model": cfg.model_name,
                             "choices": [choice]}
                    if include_usage:
                        chunk["usage"] = None
                    yield _sse(chunk)
                if include_usage:
                    yield _sse({"id": rid, "object": "text_completion", "created": created, "model": cfg.model_name,
                                "choices": [], "usage": usage(n_prompt, completion_tokens)})
                srv.metrics.requests.labels("/v1/completions", "200").inc()
                yield "data: [DONE]\n\n"

            echoed: set[int] = set()
            return StreamingResponse(events(), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})

        entries: list[list[Any]] = [[] for _ in jobs]

        def gather(j, ev):
            if req.echo:
                entries[j] += echo_entries(j, ev)
            if ev.token_id is not None:
                entries[j].append((ev.token_id, ev.logprob))

        done = await srv.collect(request, jobs, start, gather)
        if done is None:
            return Response(status_code=499)  # the client went away
        texts, counts, reasons = done
        choices = []
        for j in range(len(jobs)):
            head = prompt_text(j) if req.echo else ""
            lp = None
            if req.logprobs is not None:
                lp = logprob_block(entries[j], 0 if req.echo else len(prompt_text(j)))
            choices.append({"index": j, "text": head + texts[j], "logprobs": lp, "finish_reason": reasons[j]})
        return ok("/v1/completions", {"id": rid, "object": "text_completion", "created": created,
                                      "model": cfg.model_name, "choices": choices,
                                      "usage": usage(n_prompt, sum(counts))})

    # ---- /v1/chat/completions -----------------------------------------------------------------

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        req = await body(request, ChatRequest)
        srv.check_model(req.model)
        srv.check_unsupported(req)
        ids = srv.chat_ids(req.messages)
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        top = req.top_logprobs if req.top_logprobs is not None else 0
        stop_ids = sorted({srv.chat.eos_id, srv.tok.eos_id})
        jobs = [(ids, srv.params(req, len(ids), max_tokens, False, stop_ids, top if req.logprobs else None, None, c))
                for c in range(req.n)]
        rid, created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        include_usage = bool(req.stream_options and req.stream_options.include_usage)

        def content_logprob(ev: Event) -> dict:
            lp = ev.logprob
            piece = srv.piece(ev.token_id)
            return {"token": piece, "logprob": lp.logprob, "bytes": list(piece.encode("utf-8")),
                    "top_logprobs": [{"token": srv.piece(t), "logprob": v, "bytes": list(srv.piece(t).encode())}
                                     for t, v in lp.top]}

        start = time.monotonic()
        if req.stream:
            async def events():
                completion_tokens = 0
                started: set[int] = set()
                last: dict[int, float] = {}

                def chunk(choices):
                    c = {"id": rid, "object": "chat.completion.chunk", "created": created, "model": cfg.model_name,
                         "choices": choices}
                    if include_usage:
                        c["usage"] = None
                    return _sse(c)

                async for j, ev in srv.run(request, jobs):
                    now = time.monotonic()
                    if not last:
                        srv.metrics.ttft.observe(now - start)
                    elif j in last:
                        srv.metrics.tpot.observe(now - last[j])
                    last[j] = now
                    if ev.finish_reason == "error":
                        yield _sse({"error": {"message": ev.error, "type": "server_error", "param": None,
                                              "code": None}})
                        return
                    if j not in started:
                        started.add(j)
                        yield chunk([{"index": j, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                      "finish_reason": None}])
                    if ev.token_id is not None:
                        completion_tokens += 1
                    lp = None
                    if req.logprobs and ev.token_id is not None:
                        lp = {"content": [content_logprob(ev)]}
                    if ev.text or lp is not None:
                        yield chunk([{"index": j, "delta": {"content": ev.text}, "logprobs": lp,
                                      "finish_reason": None}])
                    if ev.finish_reason:
                        yield chunk([{"index": j, "delta": {}, "logprobs": None, "finish_reason": ev.finish_reason}])
                if include_usage:
                    yield _sse({"id": rid, "object": "chat.completion.chunk", "created": created,
                                "model": cfg.model_name, "choices": [], "usage": usage(len(ids), completion_tokens)})
                srv.metrics.requests.labels("/v1/chat/completions", "200").inc()
                yield "data: [DONE]\n\n"

            return StreamingResponse(events(), media_type="text/event-stream", headers={"Cache-Control": "no-cache"})

        lps: list[list[Any]] = [[] for _ in jobs]

        def gather(j, ev):
            if req.logprobs and ev.token_id is not None:
                lps[j].append(content_logprob(ev))

        done = await srv.collect(request, jobs, start, gather)
        if done is None:
            return Response(status_code=499)
        texts, counts, reasons = done
        choices = [{"index": j, "message": {"role": "assistant", "content": texts[j]},
                    "logprobs": {"content": lps[j]} if req.logprobs else None, "finish_reason": reasons[j]}
                   for j in range(len(jobs))]
        return ok("/v1/chat/completions", {"id": rid, "object": "chat.completion", "created": created,
                                           "model": cfg.model_name, "choices": choices,
                                           "usage": usage(len(ids), sum(counts))})

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
    dev = pick_device(device)
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

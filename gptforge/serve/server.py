"""The state behind the HTTP routes: tokenizer, engine, metrics, request admission.

`Server` turns validated request bodies into engine jobs (prompt ids + `SamplingParams`), admits
them against the queue bound, and hands their events back to the route as an async stream
(`Submission`). The routes (`gptforge.serve.completions`, `.chat`, `.info`) shape the answers.
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import threading
import time
import weakref
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from fastapi import Request
from fastapi.responses import Response
from pydantic import ValidationError

from gptforge.data.tokenizer import token_bytes
from gptforge.infer.engine import Engine, Event, SamplingParams
from gptforge.infer.engine_process import EngineProcess
from gptforge.infer.generate import MIN_TEMPERATURE, MIN_TOP_P
from gptforge.infer.grammar import GrammarVocab
from gptforge.serve.adapters import ServedAdapters
from gptforge.serve.engine_options import add_engine_metrics, engine_options
from gptforge.serve.protocol import UNSUPPORTED, APIError
from gptforge.serve.relay import EventRelay
from gptforge.serve.structured import constrain
from gptforge.serve.tools import message_dict

#: the most `stop` sequences a request may give (OpenAI's limit).
MAX_STOP = 4

# A JSON escape of a UTF-16 surrogate (a pair is one character once decoded; a lone one is not Unicode).
_SURROGATE_ESCAPE = re.compile(rb"\\u[dD][89a-fA-F]")


@dataclass
class ServeConfig:
    """What `create_app` serves and how."""

    model_name: str = "gptforge"
    """The model id clients name (GET /v1/models lists it; another name is a 404)."""
    api_key: str | None = None
    """When set, every request except GET / (the chat page), /health, /metrics and /openapi.json needs
    `Authorization: Bearer KEY`."""
    max_batch_size: int = 8
    """Sequences decoded together; more wait in arrival order."""
    max_model_len: int | None = None
    """Positions per sequence (prompt + generated); default the model's block_size."""
    chat_template: str | None = None
    """None: the tokenizer's chat template when it has one, else the default; "default": always the default."""
    max_body_bytes: int = 4 * 2**20
    """Largest accepted request body (bytes); larger ones get 413."""
    max_queue: int | None = None
    """Sequences that may wait for a cache slot beyond those being decoded; a request that would
    queue more gets 429 with Retry-After. None: no bound."""
    engine_process: bool = False
    """Run the engine in its own process (`gptforge.infer.engine_process`), so that the event loop
    and the model do not share one interpreter lock; the child starts with the app (seconds)."""
    engine_restarts: int = 3
    """With engine_process: how many times within gptforge.infer.engine_process.RESTART_WINDOW_S
    (600 s) a dead engine process is replaced by a new one; after that the server stays down
    (/health 503) for a supervisor to restart."""
    prefix_caching: bool = True
    """Reuse the cached keys/values of a prompt's leading tokens (gptforge.infer.prefix_cache)."""
    prefix_cache_slots: int = 0
    """KV cache slots beyond max_batch_size that only keep earlier prompts' prefixes (LRU)."""
    speculative: str | None = None
    """None, or "ngram": n-gram speculative decoding (gptforge.infer.speculative)."""
    num_speculative_tokens: int = 0
    """Draft tokens per sequence and step with `speculative`."""
    compile_decode: bool = False
    """One-token decode passes through compiled static-shape steps (gptforge.infer.engine_compile)."""
    lora_modules: dict[str, str] = field(default_factory=dict)
    """LoRA adapters served by name: {model id: run directory of a LoRA fine-tune of the served model}."""


class Metrics:
    """Prometheus metrics of one server, in their own registry (several apps may share a process)."""

    def __init__(self, engine: Engine | EngineProcess):
        from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

        r = self.registry = CollectorRegistry()
        self.requests = Counter("gptforge_requests", "HTTP requests answered", ["endpoint", "status"], registry=r)
        self.prompt_tokens = Counter("gptforge_prompt_tokens", "Prompt tokens processed", registry=r)
        self.generation_tokens = Counter("gptforge_generation_tokens", "Tokens generated", registry=r)
        Gauge("gptforge_queue_length", "Sequences waiting for a cache slot", registry=r).set_function(
            lambda: engine.num_waiting)
        Gauge("gptforge_running_sequences", "Sequences being decoded", registry=r).set_function(
            lambda: engine.num_running)
        Gauge("gptforge_engine_up", "1 while the engine runs and answers, else 0 (see /health)",
              registry=r).set_function(lambda: float(engine.alive))
        Gauge("gptforge_engine_restarts", "Engine processes started after one died (0 in process)",
              registry=r).set_function(lambda: float(getattr(engine, "restarts", 0)))
        add_engine_metrics(r, engine)
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


def validation_error(e: ValidationError) -> APIError:
    """The 400 for a body that does not validate, naming its first bad field."""
    first = e.errors()[0]
    loc = ".".join(str(p) for p in first["loc"] if not _is_union_tag(p))
    if first["type"] == "extra_forbidden":
        return _err(400, f"unrecognized request argument supplied: {loc}", loc, "invalid_field")
    return _err(400, f"{loc}: {first['msg']} (got {first.get('input')!r})"[:500], loc, "invalid_value")


def _max_token_chars(hf_tokenizer) -> int:
    """The most characters of input text one token can stand for: its longest vocabulary string
    (byte-level BPE writes one character per byte, SentencePiece writes the space as one '▁'),
    doubled when a normalizer runs, since a normalizer may compose several characters into one."""
    longest = max(len(s) for s in hf_tokenizer.get_vocab(with_added_tokens=True))
    return longest * (2 if hf_tokenizer.normalizer is not None else 1)


class Submission:
    """The engine sequences of one request, submitted together; `events` streams what they produce.

    Sequences still running when the request ends (done, error, client gone) or when the
    submission is garbage-collected without being streamed are cancelled, which frees their slots.
    """

    def __init__(self, srv: Server, jobs: list[tuple[list[int], SamplingParams]]):
        relay = srv.relay(asyncio.get_running_loop())
        self.srv, self.n = srv, len(jobs)
        self.queue: asyncio.Queue = asyncio.Queue()
        self.seqs: list[Any] = []
        self._cached: dict[int, int] = {}  # prompt list's id -> most tokens a reused prefix covered in a job of it
        self._prompt_ids = [id(p) for p, _ in jobs]  # the n choices of one prompt share its list
        self._cancel = weakref.finalize(self, _cancel_all, srv.engine, self.seqs)
        queue = self.queue  # the callbacks must not hold `self`, or the finalizer never runs

        def sink(i):
            def on_event(ev: Event):
                relay.push(queue, (i, ev))
            return on_event

        try:
            for i, (prompt, params) in enumerate(jobs):
                self.seqs.append(srv.engine.submit(prompt, params, sink(i)))
        except BaseException:
            self._cancel()
            raise

    @property
    def cached_tokens(self) -> int:
        """Prompt tokens whose prefill a reused prefix skipped, each prompt counted once (as usage
        counts its prompt_tokens), however many choices it has."""
        return sum(self._cached.values())

    async def timed_events(self, request: Request, start: float, metrics: "Metrics"):
        """`events`, observing time to first token (from `start`, seconds on time.monotonic) and
        time per output token of each job in `metrics`."""
        last: dict[int, float] = {}
        async for j, ev in self.events(request):
            now = time.monotonic()
            if not last:
                metrics.ttft.observe(now - start)
            elif j in last:
                metrics.tpot.observe(now - last[j])
            last[j] = now
            yield j, ev

    async def events(self, request: Request):
        """Yield (job index, Event) as they come until every job has finished or the client has gone."""
        started: dict[int, float] = {}
        finished: set[int] = set()
        try:
            while len(finished) < self.n:
                if not self.queue.empty():  # no timer when an event is already there
                    i, ev = self.queue.get_nowait()
                else:
                    try:
                        i, ev = await asyncio.wait_for(self.queue.get(), timeout=0.5)
                    except asyncio.TimeoutError:
                        if await request.is_disconnected():
                            return
                        why = self.srv.stopping and getattr(self.srv.engine, "down_reason", lambda: None)()
                        if why:  # stopping, and the engine will not answer: end the jobs left now
                            for j in range(self.n):
                                if j not in finished:
                                    finished.add(j)
                                    yield j, Event(finish_reason="error", error=f"{why}; the server is stopping")
                            return
                        continue
                started.setdefault(i, time.monotonic())
                if ev.cached_tokens:
                    key = self._prompt_ids[i]
                    self._cached[key] = max(self._cached.get(key, 0), ev.cached_tokens)
                if ev.token_id is not None:
                    self.srv.metrics.generation_tokens.inc()
                if ev.finish_reason:
                    finished.add(i)
                    self.srv.observe_slot_seconds(time.monotonic() - started[i])
                yield i, ev
        finally:
            self._cancel()


async def coalesce(sub: Submission, chunks):
    """The strings of the async generator `chunks` (SSE events of `sub`'s answer), joined into one
    write while `sub` already holds its next events: when the event loop is behind the engine, a
    stream sends what has piled up at once instead of one socket write per token. A chunk made while
    nothing else is waiting goes out at once, so the stream's latency is unchanged."""
    buf: list[str] = []
    try:
        async for c in chunks:
            buf.append(c)
            if sub.queue.empty():
                yield "".join(buf)
                buf = []
        if buf:
            yield "".join(buf)
    finally:
        await chunks.aclose()  # at once, not at garbage collection: its end cancels the sequences


def _cancel_all(engine: Engine | EngineProcess, seqs) -> None:
    for s in seqs:
        if not s.finished:
            engine.cancel(s)


class Server:
    """The state behind the routes: tokenizer, engine, metrics. Build with `create_app`."""

    def __init__(self, model, tokenizer_file: Path, cfg: ServeConfig):
        from gptforge.data.chat import DEFAULT_TEMPLATE, ChatTokenizer
        from gptforge.data.tokenizer import Tokenizer

        self.cfg = cfg
        self.tok = Tokenizer.from_file(tokenizer_file)
        self.chat = ChatTokenizer.from_dir(tokenizer_file)
        self.template = DEFAULT_TEMPLATE if cfg.chat_template == "default" else None
        self.engine: Engine | EngineProcess
        opts = engine_options(cfg)
        if cfg.engine_process:
            self.engine = EngineProcess(model, tokenizer_file, cfg.max_batch_size, cfg.max_model_len,
                                        max_restarts=cfg.engine_restarts, engine_options=opts)
        else:
            self.engine = Engine(model, self.tok.decode, cfg.max_batch_size, cfg.max_model_len, **opts)
        self.max_model_len = self.engine.max_model_len
        self.adapters = ServedAdapters(model, self.engine, cfg.model_name)
        for name, path in cfg.lora_modules.items():
            try:
                self.adapters.load(name, path)
            except APIError as e:
                raise ValueError(e.message) from None
        self.grammar_vocab = GrammarVocab(self.tok.to_str(), model.config.vocab_size, self.tok.eos_id)
        if isinstance(self.engine, Engine):
            self.engine.grammar_vocab = self.grammar_vocab
        self.max_prompt_chars = self.max_model_len * _max_token_chars(self.chat.tokenizer)
        self.metrics = Metrics(self.engine)
        self.created = int(time.time())
        self.slot_seconds = 1.0  # running mean of the seconds a sequence holds a cache slot (Retry-After)
        self.stopping = False
        """Set when the server has been told to stop (SIGTERM / Ctrl-C: `app.DrainingServer`): from
        then on a request whose engine cannot answer (a dead or silent engine process) ends with an
        error instead of holding the drain until uvicorn's graceful timeout cancels it."""
        self._piece_cache: dict[int, str] = {}
        # One relay per event loop serving this app (tests run several loops); replaced, never
        # mutated, so that the engine's thread can walk it while a loop adds its relay.
        self._relays: tuple[EventRelay, ...] = ()
        self._relays_lock = threading.Lock()
        self.engine.step_hooks.append(self._wake_relays)

    def relay(self, loop: asyncio.AbstractEventLoop) -> EventRelay:
        """The `EventRelay` of `loop` (made on first use; those of closed loops are dropped then)."""
        for r in self._relays:
            if r.loop is loop:
                return r
        with self._relays_lock:
            r = EventRelay(loop)
            self._relays = tuple(x for x in self._relays if not x.loop.is_closed()) + (r,)
        return r

    def _wake_relays(self) -> None:
        for r in self._relays:
            r.wake()

    # ---- request bodies -----------------------------------------------------------------------

    async def parse(self, request: Request, cls):
        """The body of `request` validated as pydantic model `cls`.

        Raises:
            APIError: 413 over max_body_bytes; 400 for invalid JSON, a non-object, or a field that does
                not validate (naming it).
        """
        limit = self.cfg.max_body_bytes
        raw = await request.body()
        if len(raw) > limit:
            raise APIError(413, f"request body of {len(raw)} bytes is over the limit of {limit} bytes",
                           code="request_too_large")
        try:
            data = json.loads(raw)
        except (ValueError, UnicodeDecodeError) as e:
            raise _err(400, f"the request body is not valid JSON ({e})", None, "invalid_json") from None
        if not isinstance(data, dict):
            raise _err(400, "the request body must be a JSON object", None, "invalid_json")
        if _SURROGATE_ESCAPE.search(raw):  # "\ud800" alone decodes to a str that no tokenizer can take
            try:
                json.dumps(data, ensure_ascii=False).encode("utf-8")
            except UnicodeEncodeError as e:
                raise _err(400, f"the request body has a lone UTF-16 surrogate escape ({e.object[e.start]!r}) in a "
                                "string: send valid Unicode (a surrogate pair, or the character itself)", None,
                           "invalid_json") from None
        try:
            return cls.model_validate(data)
        except ValidationError as e:
            raise validation_error(e) from None

    def ok(self, endpoint: str, payload):
        """`payload` (a pydantic response model, or a Response) as the 200 answer of `endpoint`, counted."""
        self.metrics.requests.labels(endpoint, "200").inc()
        if isinstance(payload, Response):
            return payload
        return Response(payload.model_dump_json(), media_type="application/json")

    def check_model(self, name: str | None) -> None:
        if name is not None and name != self.cfg.model_name and name not in self.adapters.by_name:
            also = "".join(f", `{n}`" for n in self.adapters.by_name)
            raise _err(404, f"The model `{name}` does not exist; this server serves `{self.cfg.model_name}`{also}",
                       "model", "model_not_found")

    def check_unsupported(self, req) -> None:
        for name in UNSUPPORTED:
            if getattr(req, name, None) is not None:
                raise _err(400, f"`{name}` is not supported by this server", name, "unsupported_parameter")
        best_of = getattr(req, "best_of", None)
        if best_of is not None and best_of != req.n:
            raise _err(400, "`best_of` other than n is not supported by this server", "best_of",
                       "unsupported_parameter")

    # ---- prompts ------------------------------------------------------------------------------

    def piece(self, token_id: int) -> str:
        """The text of one token (as logprobs name it). A byte-level token that holds only part of a
        UTF-8 character (a piece of a CJK character or an emoji) is spelled "bytes:" plus its bytes
        as \\xNN escapes, as OpenAI's API spells such tokens, not as the U+FFFD its decode gives."""
        s = self._piece_cache.get(token_id)
        if s is None:
            s = self.tok.decode([token_id])
            raw = token_bytes(self.tok.id_to_token(token_id) or "") if "\ufffd" in s else None
            if raw and not _is_utf8(raw):
                s = "bytes:" + "".join(f"\\x{b:02x}" for b in raw)
            self._piece_cache[token_id] = s
        return s

    def token_bytes(self, token_id: int) -> list[int]:
        """The bytes one token stands for (a byte-level token's own bytes, else its text's UTF-8)."""
        raw = token_bytes(self.tok.id_to_token(token_id) or "")
        return list(raw) if raw is not None else list(self.tok.decode([token_id]).encode("utf-8"))

    def encode(self, text: str) -> list[int]:
        """Ids of a prompt string; special-token spellings in it ("<|endoftext|>") are those tokens, as in
        OpenAI's and vLLM's completions (chat message contents, by contrast, are always plain text)."""
        return self.chat.encode_template(text)

    def check_prompt_chars(self, chars: int, what: str, param: str) -> None:
        """Refuse a prompt of `chars` characters that cannot fit in the context, before tokenizing it.

        No token stands for more than `max_prompt_chars / max_model_len` characters (`_max_token_chars`),
        so such a text has more tokens than the context holds; a 10^6-token prompt costs no tokenization.

        Raises:
            APIError: 400 context_length_exceeded.
        """
        if chars > self.max_prompt_chars:
            raise _err(400, f"{what} has {chars} characters: more than the model's context of {self.max_model_len} "
                            f"tokens holds (one token covers at most {self.max_prompt_chars // self.max_model_len} "
                            "characters here); shorten it", param, "context_length_exceeded")

    def prompt_ids(self, prompt) -> list[list[int]]:
        """A completions prompt (str, [str], [int], [[int]]) -> lists of token ids.

        Raises:
            APIError: 400 for an empty prompt, a token id outside the vocabulary, or a prompt longer
                than the context (checked before the text is tokenized).
        """
        if isinstance(prompt, str):
            prompt = [prompt]
        elif prompt and all(isinstance(p, int) for p in prompt):
            prompt = [prompt]
        if not prompt:
            raise _err(400, "prompt is an empty list", "prompt", "invalid_value")
        prompts = []
        for i, p in enumerate(prompt):
            if isinstance(p, str):
                self.check_prompt_chars(len(p), f"prompt {i}", "prompt")
                p = self.encode(p)
            if not p:
                raise _err(400, f"prompt {i} is empty (no tokens)", "prompt", "invalid_value")
            if len(p) > self.max_model_len:
                raise _err(400, f"prompt {i} has {len(p)} tokens: more than the model's context of "
                                f"{self.max_model_len} tokens", "prompt", "context_length_exceeded")
            bad = next((t for t in p if not 0 <= t < self.tok.vocab_size), None)
            if bad is not None:
                raise _err(400, f"prompt {i}: token id {bad} is outside the vocabulary [0, {self.tok.vocab_size})",
                           "prompt", "invalid_value")
            prompts.append(list(p))
        return prompts

    def chat_ids(self, messages, bounded: bool = True, tools: list[dict] | None = None) -> list[int]:
        """Ids of a conversation rendered with the chat template, ending with the assistant's header.
        bounded: refuse contents longer than the context holds before rendering (`check_prompt_chars`).
        tools: the functions the template shows the model (gptforge.serve.tools.tool_dicts).

        Raises:
            APIError: 400 for a conversation the template refuses, or one too long (when bounded).
        """
        from gptforge.data.chat import prompt_ids

        rendered = [message_dict(m) for m in messages]
        if bounded:
            chars = sum(len(m["content"] or "") for m in rendered) + (len(json.dumps(tools)) if tools else 0)
            self.check_prompt_chars(chars, "the conversation", "messages")
        try:
            return prompt_ids(self.chat, rendered, self.template, tools)
        except ValueError as e:
            raise _err(400, str(e), "messages", "invalid_value") from None

    def params(self, req, prompt_len: int, max_tokens: int | None, allow_zero: bool, stop_ids: list[int],
               logprobs: int | None, prompt_logprobs: int | None, choice: int) -> SamplingParams:
        """The engine's SamplingParams of choice `choice` of `req` for a prompt of `prompt_len` tokens.

        Raises:
            APIError: 400 when max_tokens is below 1 (0 only when allow_zero) or the prompt and
                max_tokens do not fit in the context (context_length_exceeded, giving both counts).
        """
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
        if len(stop) > MAX_STOP:  # OpenAI's limit: a client written for it never sends more
            raise _err(400, f"stop: at most {MAX_STOP} stop sequences, got {len(stop)}", "stop", "invalid_value")
        temperature = req.temperature if req.temperature >= MIN_TEMPERATURE else 0.0
        return SamplingParams(
            max_tokens=max_tokens, temperature=temperature, top_k=max(req.top_k, 0), top_p=max(req.top_p, MIN_TOP_P),
            seed=None if req.seed is None else (req.seed + choice) % 2**64, stop=stop, stop_token_ids=stop_ids,
            logprobs=logprobs, prompt_logprobs=prompt_logprobs, presence_penalty=req.presence_penalty,
            frequency_penalty=req.frequency_penalty, adapter=self.adapters.get(req.model))

    async def answer(self, request: Request, cls, make_call) -> Response:
        """Parse the body as `cls`, check its model and unsupported fields, build the endpoint's
        call object with `make_call(self, req)` (it has `jobs`, `stream()` and `respond()`), admit
        its jobs and answer: server-sent events when `stream` is set, else one JSON response.

        Raises:
            APIError: a bad body or model, an unsupported field, or a full queue (see `submit`).
        """
        from fastapi.responses import StreamingResponse

        req = await self.parse(request, cls)
        self.check_model(req.model)
        self.check_unsupported(req)
        call = make_call(self, req)
        await constrain(self.grammar_vocab, req, call.jobs)
        start = time.monotonic()
        sub = self.submit(call.jobs)
        if req.stream:
            return StreamingResponse(coalesce(sub, call.stream(request, sub, start)), media_type="text/event-stream",
                                     headers={"Cache-Control": "no-cache"})
        return await call.respond(request, sub, start)

    # ---- admission and results ----------------------------------------------------------------

    def submit(self, jobs: list[tuple[list[int], SamplingParams]]) -> Submission:
        """Admit `jobs` against the queue bound and submit them to the engine at once (no await
        between the check and the submission, so concurrent requests cannot both pass it).

        Raises:
            APIError: 429 with Retry-After when the jobs would queue more than max_queue sequences;
                400 when the request alone has more sequences than max_batch_size + max_queue.
        """
        q = self.cfg.max_queue
        if q is not None:
            n, batch = len(jobs), self.engine.max_batch_size
            if n > batch + q:
                raise _err(400, f"the request has {n} sequences (prompts x n): more than this server takes at once "
                                f"({batch} decoded + {q} queued); send fewer prompts or a smaller n", "n",
                           "invalid_value")
            free = self.engine.num_free_slots  # read first: a step admitting in between lowers the count
            waiting = self.engine.num_waiting
            queued = waiting + n - free  # sequences of the queue once this request's have taken the free slots
            if queued > q:
                wait = self.retry_after(queued - q)
                # Submitted sequences that the free slots take at the next step (or, with the engine
                # in its own process, that are in their prefill) start now: they are not waiting.
                ahead = max(0, waiting - free)
                raise APIError(429, f"the server is busy: {ahead} sequence(s) already wait for one of {batch} "
                                    f"cache slots, and this request's {n} would make {queued} wait (at most {q} "
                                    f"may wait); retry after {wait} s",
                               code="queue_full", type="server_busy", headers={"Retry-After": str(wait)})
        try:
            sub = Submission(self, jobs)
        except RuntimeError as e:  # an engine process that has died
            raise APIError(503, f"the engine is not running: {e}", code="engine_down", type="server_error") from e
        self.metrics.prompt_tokens.inc(sum(len(p) for p, _ in jobs))
        return sub

    def retry_after(self, excess: int) -> int:
        """Whole seconds (1..60) until `excess` more sequences could queue: the queue drains
        max_batch_size sequences per mean slot time, so ceil(excess / max_batch_size) slot times."""
        waves = math.ceil(excess / self.engine.max_batch_size)
        return int(min(60, max(1, math.ceil(waves * self.slot_seconds))))

    def observe_slot_seconds(self, seconds: float) -> None:
        """Fold one finished sequence's time in its slot into the running mean (weight 0.2)."""
        self.slot_seconds += 0.2 * (seconds - self.slot_seconds)

    async def collect(self, request: Request, sub: Submission, start: float, on_event=None):
        """Run a submission to the end for a non-streaming response: (texts, completion token counts,
        finish reasons), one entry per job, or None when the client went away before every job
        finished. Observes the time to first token from `start` (time.monotonic() seconds);
        `on_event(j, ev)` sees every event first (logprob collection).

        Raises:
            APIError: 500 when generation failed inside the engine.
        """
        n = sub.n
        texts, counts, reasons = [""] * n, [0] * n, [None] * n
        first = True
        async for j, ev in sub.events(request):
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


def usage(prompt_tokens: int, completion_tokens: int, cached_tokens: int = 0) -> dict:
    """OpenAI's usage object; prompt_tokens_details.cached_tokens: prompt tokens a reused prefix covered."""
    return {"prompt_tokens": prompt_tokens, "completion_tokens": completion_tokens,
            "total_tokens": prompt_tokens + completion_tokens, "prompt_tokens_details": {"cached_tokens": cached_tokens}}


def sse(obj) -> str:
    """One server-sent event carrying `obj` as compact JSON."""
    return f"data: {json.dumps(obj, ensure_ascii=False, separators=(',', ':'))}\n\n"


def sse_error(message: str) -> str:
    """The SSE event sent when generation fails after the stream has started (OpenAI's error object)."""
    return sse({"error": {"message": message, "type": "server_error", "param": None, "code": None}})


def _is_utf8(raw: bytes) -> bool:
    try:
        raw.decode("utf-8")
    except UnicodeDecodeError:
        return False
    return True

"""POST /v1/chat/completions (OpenAI API reference: Chat), streamed or whole.

The conversation is rendered with the run's chat template (or the default `### User:` template)
and generation stops at the template's end of turn or the end-of-text token. The first streamed
chunk of each choice carries `delta.role`, the last one its finish_reason and an empty delta.
"""

from __future__ import annotations

import time
import uuid

from fastapi import APIRouter, Request
from fastapi.responses import Response

from gptforge.infer.engine import Event, TokenLogprob
from gptforge.serve import tools
from gptforge.serve.logprobs import AnsweredLogprobs
from gptforge.serve.openapi import route_doc
from gptforge.serve.protocol import APIError, ChatCompletion, ChatCompletionChunk, ChatRequest
from gptforge.serve.server import Server, Submission, sse, sse_error, usage
from gptforge.serve.tools import CallStream, check_tools

router = APIRouter()
ENDPOINT = "/v1/chat/completions"


class ChatCall:
    """One /v1/chat/completions request after validation: its jobs and how its answer is shaped."""

    def __init__(self, srv: Server, req: ChatRequest):
        self.srv, self.req = srv, req
        if req.top_logprobs is not None and not req.logprobs:
            raise APIError(400, "top_logprobs needs logprobs: true", "top_logprobs", "invalid_value")
        check_tools(req)
        self.tools = tools.active(req)
        self.ids = ids = srv.chat_ids(req.messages, tools=tools.tool_dicts(req))
        max_tokens = req.max_completion_tokens if req.max_completion_tokens is not None else req.max_tokens
        top = req.top_logprobs if req.top_logprobs is not None else 0
        stop_ids = sorted({srv.chat.eos_id, srv.tok.eos_id})
        self.jobs = [(ids, srv.params(req, len(ids), max_tokens, False, stop_ids, top if req.logprobs else None,
                                      None, c)) for c in range(req.n)]
        self.rid, self.created = f"chatcmpl-{uuid.uuid4().hex}", int(time.time())
        self.include_usage = bool(req.stream_options and req.stream_options.include_usage)

    def content_logprob(self, token_id: int, lp: TokenLogprob) -> dict:
        """OpenAI's logprobs.content entry of one generated token (bytes: the token's own bytes)."""
        piece, raw = self.srv.piece, self.srv.token_bytes
        return {"token": piece(token_id), "logprob": lp.logprob, "bytes": raw(token_id),
                "top_logprobs": [{"token": piece(t), "logprob": v, "bytes": raw(t)} for t, v in lp.top]}

    def content(self, ev: Event, answered: AnsweredLogprobs) -> list[dict]:
        """logprobs.content entries of the generated tokens whose text the answer now holds."""
        return [self.content_logprob(t, lp) for t, lp, _ in answered.push(ev) if lp is not None]

    def chunk(self, choices: list, **extra) -> str:
        c = {"id": self.rid, "object": "chat.completion.chunk", "created": self.created,
             "model": (self.req.model or self.srv.cfg.model_name), "choices": choices, **extra}
        if self.include_usage and "usage" not in c:
            c["usage"] = None
        return sse(c)

    async def stream(self, request: Request, sub: Submission, start: float):
        """The SSE events of the answer (ChatCompletionChunk per event, then [DONE])."""
        metrics, req = self.srv.metrics, self.req
        completion_tokens = 0
        started: set[int] = set()
        answered = [AnsweredLogprobs(self.srv.tok.decode) for _ in self.jobs] if req.logprobs else []
        calls = [CallStream() for _ in self.jobs] if self.tools else []
        async for j, ev in sub.timed_events(request, start, metrics):
            if ev.finish_reason == "error":
                yield sse_error(ev.error)
                return
            if j not in started:
                started.add(j)
                yield self.chunk([{"index": j, "delta": {"role": "assistant", "content": ""}, "logprobs": None,
                                   "finish_reason": None}])
            if ev.token_id is not None:
                completion_tokens += 1
            lp = None
            if req.logprobs:
                content = self.content(ev, answered[j])
                lp = {"content": content} if content else None
            text, reason = (calls[j].push(ev.text) if calls else ev.text), ev.finish_reason
            if text or lp is not None:
                yield self.chunk([{"index": j, "delta": {"content": text}, "logprobs": lp, "finish_reason": None}])
            if reason and calls:
                for delta in self.call_deltas(calls[j]):
                    reason = "tool_calls" if "tool_calls" in delta and reason == "stop" else reason
                    yield self.chunk([{"index": j, "delta": delta, "logprobs": None, "finish_reason": None}])
            if reason:
                yield self.chunk([{"index": j, "delta": {}, "logprobs": None, "finish_reason": reason}])
        if self.include_usage:
            yield self.chunk([], usage=usage(len(self.ids), completion_tokens, sub.cached_tokens))
        metrics.requests.labels(ENDPOINT, "200").inc()
        yield "data: [DONE]\n\n"

    @staticmethod
    def call_deltas(stream: CallStream) -> list[dict]:
        """The deltas that end a streamed choice with tools: its held-back text, then its calls."""
        text, calls = stream.finish()
        out: list[dict] = [{"content": text}] if text else []
        if calls:
            out.append({"tool_calls": [dict(c, index=k) for k, c in enumerate(calls)]})
        return out

    async def respond(self, request: Request, sub: Submission, start: float) -> Response:
        """The whole answer (a ChatCompletion), or 499 when the client went away first."""
        req = self.req
        lps: list[list] = [[] for _ in self.jobs]
        answered = [AnsweredLogprobs(self.srv.tok.decode) for _ in self.jobs] if req.logprobs else []

        def gather(j, ev):
            if req.logprobs:
                lps[j] += self.content(ev, answered[j])

        done = await self.srv.collect(request, sub, start, gather)
        if done is None:
            return Response(status_code=499)
        texts, counts, reasons = done
        choices = []
        for j in range(len(self.jobs)):
            message: dict = {"role": "assistant", "content": texts[j]}
            content, calls = tools.parse_calls(texts[j]) if self.tools else (texts[j], [])
            if calls:
                message = {"role": "assistant", "content": content, "tool_calls": calls}
                reasons[j] = "tool_calls" if reasons[j] == "stop" else reasons[j]
            choices.append({"index": j, "message": message, "finish_reason": reasons[j],
                            "logprobs": {"content": lps[j]} if req.logprobs else None})
        return self.srv.ok(ENDPOINT, ChatCompletion.model_validate({
            "id": self.rid, "created": self.created, "model": (self.req.model or self.srv.cfg.model_name), "choices": choices,
            "usage": usage(len(self.ids), sum(counts), sub.cached_tokens)}))


@router.post(ENDPOINT, response_class=Response, summary="Answer a conversation",
             **route_doc(ChatRequest, ChatCompletion, ChatCompletionChunk, errors=(400, 404, 413, 429, 500, 503)))
async def chat_completions(request: Request) -> Response:
    """The assistant's next message, `n` choices; with `stream`, server-sent ChatCompletionChunks."""
    srv: Server = request.app.state.server
    return await srv.answer(request, ChatRequest, ChatCall)

"""POST /v1/completions (OpenAI API reference: Completions), streamed or whole.

Choice index j = prompt index * n + choice number, as OpenAI numbers the choices of several
prompts. With `echo` each choice's text starts with its prompt (and, with `logprobs`, the prompt
tokens' log-probabilities; the first is None); `max_tokens` 0 with `echo` scores the prompt only.
"""

from __future__ import annotations

import time
import uuid
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response

from gptforge.serve.logprobs import AnsweredLogprobs, Entry, prompt_entries
from gptforge.serve.openapi import route_doc
from gptforge.serve.protocol import Completion, CompletionChunk, CompletionRequest
from gptforge.serve.server import Server, Submission, sse, sse_error, usage

router = APIRouter()
ENDPOINT = "/v1/completions"


class CompletionCall:
    """One /v1/completions request after validation: its jobs and how its answer is shaped."""

    def __init__(self, srv: Server, req: CompletionRequest):
        self.srv, self.req = srv, req
        prompts = srv.prompt_ids(req.prompt)
        lp = req.logprobs
        self.jobs = [(p, srv.params(req, len(p), req.max_tokens, req.echo, [srv.tok.eos_id], lp,
                                    lp if req.echo and lp is not None else None, c))
                     for p in prompts for c in range(req.n)]
        self.rid, self.created = f"cmpl-{uuid.uuid4().hex}", int(time.time())
        self.include_usage = bool(req.stream_options and req.stream_options.include_usage)
        self.n_prompt = sum(len(p) for p in prompts)
        self._prompt_texts: dict[int, str] = {}

    def logprob_block(self, entries: list[Entry]) -> dict:
        """OpenAI completions logprobs of `entries` (gptforge.serve.logprobs): tokens,
        token_logprobs, top_logprobs, text_offset (characters from the prompt's start)."""
        piece = self.srv.piece
        out: dict[str, list[Any]] = {"tokens": [], "token_logprobs": [], "top_logprobs": [], "text_offset": []}
        for token_id, lp, offset in entries:
            out["tokens"].append(piece(token_id))
            out["token_logprobs"].append(None if lp is None else lp.logprob)
            out["top_logprobs"].append(None if lp is None else {piece(t): v for t, v in lp.top})
            out["text_offset"].append(offset)
        return out

    def entries(self, j: int, ev, answered: AnsweredLogprobs) -> list[Entry]:
        """Choice j's entries for one event: its echoed prompt's (first event) and the generated
        tokens whose text the answer now holds."""
        echo = (prompt_entries(self.srv.tok.decode, self.jobs[j][0], ev.prompt_logprobs)
                if ev.prompt_logprobs is not None else [])
        return echo + answered.push(ev)

    def answered(self) -> list[AnsweredLogprobs]:
        """One tracker per choice, offsets after its prompt's text (none without logprobs: no
        per-token decode is spent on them)."""
        if self.req.logprobs is None:
            return []
        return [AnsweredLogprobs(self.srv.tok.decode, len(self.prompt_text(j))) for j in range(len(self.jobs))]

    def prompt_text(self, j: int) -> str:
        """Choice j's prompt as text, decoded once."""
        if j not in self._prompt_texts:
            self._prompt_texts[j] = self.srv.tok.decode(self.jobs[j][0])
        return self._prompt_texts[j]

    def chunk(self, choices: list, **extra) -> str:
        c = {"id": self.rid, "object": "text_completion", "created": self.created, "model": (self.req.model or self.srv.cfg.model_name),
             "choices": choices, **extra}
        if self.include_usage and "usage" not in c:
            c["usage"] = None
        return sse(c)

    async def stream(self, request: Request, sub: Submission, start: float):
        """The SSE events of the answer (CompletionChunk per event, then [DONE])."""
        metrics, req = self.srv.metrics, self.req
        echoed: set[int] = set()
        completion_tokens = 0
        answered = self.answered()
        async for j, ev in sub.timed_events(request, start, metrics):
            if ev.finish_reason == "error":
                yield sse_error(ev.error)
                return
            text = ev.text
            if req.echo and j not in echoed:  # a choice's first chunk starts with its prompt
                echoed.add(j)
                text = self.prompt_text(j) + text
            if ev.token_id is not None:
                completion_tokens += 1
            lp = self.logprob_block(self.entries(j, ev, answered[j])) if req.logprobs is not None else None
            yield self.chunk([{"index": j, "text": text, "logprobs": lp, "finish_reason": ev.finish_reason}])
        if self.include_usage:
            yield self.chunk([], usage=usage(self.n_prompt, completion_tokens, sub.cached_tokens))
        metrics.requests.labels(ENDPOINT, "200").inc()
        yield "data: [DONE]\n\n"

    async def respond(self, request: Request, sub: Submission, start: float) -> Response:
        """The whole answer (a Completion), or 499 when the client went away first."""
        req = self.req
        entries: list[list[Entry]] = [[] for _ in self.jobs]
        answered = self.answered()

        def gather(j, ev):
            if answered:
                entries[j] += self.entries(j, ev, answered[j])

        done = await self.srv.collect(request, sub, start, gather)
        if done is None:
            return Response(status_code=499)  # the client went away
        texts, counts, reasons = done
        choices = []
        for j in range(len(self.jobs)):
            head = self.prompt_text(j) if req.echo else ""
            lp = None
            if req.logprobs is not None:
                lp = self.logprob_block(entries[j])
            choices.append({"index": j, "text": head + texts[j], "logprobs": lp, "finish_reason": reasons[j]})
        return self.srv.ok(ENDPOINT, Completion.model_validate({
            "id": self.rid, "created": self.created, "model": (self.req.model or self.srv.cfg.model_name), "choices": choices,
            "usage": usage(self.n_prompt, sum(counts), sub.cached_tokens)}))


@router.post(ENDPOINT, response_class=Response, summary="Complete a prompt",
             **route_doc(CompletionRequest, Completion, CompletionChunk, errors=(400, 404, 413, 429, 500, 503)))
async def completions(request: Request) -> Response:
    """Text after each prompt, `n` choices per prompt; with `stream`, server-sent CompletionChunks."""
    srv: Server = request.app.state.server
    return await srv.answer(request, CompletionRequest, CompletionCall)

"""The routes around generation: GET /v1/models, POST /tokenize, POST /detokenize,
GET /tokenizer_info (as vLLM names them; lm-eval's remote tokenizer probes them), GET /health and
GET /metrics (Prometheus text format)."""

from __future__ import annotations

from fastapi import APIRouter, Request
from fastapi.responses import PlainTextResponse, Response
from starlette.concurrency import run_in_threadpool

from gptforge.infer.engine_process import EngineProcess
from gptforge.serve.openapi import route_doc
from gptforge.serve.protocol import (
    APIError,
    DetokenizeRequest,
    DetokenizeResponse,
    ModelCard,
    ModelList,
    TokenizeRequest,
    TokenizeResponse,
    TokenizerInfo,
)
from gptforge.serve.server import Server

router = APIRouter()


def _server(request: Request) -> Server:
    return request.app.state.server


@router.get("/health", response_class=Response, summary="Liveness",
            **route_doc(errors=(503,), description="Serving"))
async def health(request: Request) -> Response:
    """200 with an empty body while the server and its engine run; 503 when the engine has stopped
    (an engine process that exited)."""
    engine = request.app.state.server.engine
    if not engine.alive:
        why = engine.down_reason() if isinstance(engine, EngineProcess) else None
        raise APIError(503, "the engine is not running" + (f": {why}" if why else ""), code="engine_down",
                       type="server_error")
    return Response(status_code=200)


@router.get("/metrics", response_class=PlainTextResponse, summary="Prometheus metrics",
            **route_doc(errors=(), content={"text/plain": {"schema": {"type": "string"}}},
                        description="Prometheus text exposition format"))
async def metrics(request: Request) -> Response:
    """Requests by endpoint and status, prompt and generated tokens, queue length, running sequences,
    time to first token and time per output token."""
    from prometheus_client import CONTENT_TYPE_LATEST, generate_latest

    return Response(generate_latest(_server(request).metrics.registry), media_type=CONTENT_TYPE_LATEST)


@router.get("/v1/models", response_class=Response, summary="The served model",
            **route_doc(response=ModelList, errors=()))
async def models(request: Request) -> Response:
    """The model this server serves, with its context length, and the LoRA adapters it serves by name."""
    srv = _server(request)
    return srv.ok("/v1/models", ModelList(data=[ModelCard(
        id=srv.cfg.model_name, created=srv.created, owned_by="gptforge", max_model_len=srv.max_model_len),
        *srv.adapters.cards(srv.created, srv.max_model_len)]))


@router.get("/tokenizer_info", response_class=Response, summary="The tokenizer",
            **route_doc(response=TokenizerInfo, errors=()))
async def tokenizer_info(request: Request) -> Response:
    """Vocabulary size, special tokens, context length and chat template."""
    srv = _server(request)
    return srv.ok("/tokenizer_info", TokenizerInfo(
        tokenizer_class="PreTrainedTokenizerFast", vocab_size=srv.tok.vocab_size, eos_token=srv.tok.eos_token,
        eos_token_id=srv.tok.eos_id, max_model_len=srv.max_model_len, model_max_length=srv.max_model_len,
        chat_template=srv.chat.chat_template, bos_token=srv.chat.bos_token, add_bos_token=srv.chat.add_bos))


@router.post("/tokenize", response_class=Response, summary="Token ids of a text or a conversation",
             **route_doc(TokenizeRequest, TokenizeResponse))
async def tokenize(request: Request) -> Response:
    """Ids of `prompt` (special-token spellings become their ids) or of `messages` rendered with the
    chat template; any length (no context check)."""
    srv = _server(request)
    req = await srv.parse(request, TokenizeRequest)
    srv.check_model(req.model)
    if (req.prompt is None) == (req.messages is None):
        raise APIError(400, "give exactly one of `prompt` or `messages`", "prompt", "invalid_value")

    def answer() -> Response:
        ids = srv.encode(req.prompt) if req.prompt is not None else srv.chat_ids(req.messages, bounded=False)
        return srv.ok("/tokenize", TokenizeResponse(count=len(ids), max_model_len=srv.max_model_len, tokens=ids))

    # A long text takes seconds to tokenize and serialize: off the event loop, so /health and the
    # streams of other requests keep answering meanwhile.
    return await run_in_threadpool(answer)


@router.post("/detokenize", response_class=Response, summary="The text of token ids",
             **route_doc(DetokenizeRequest, DetokenizeResponse))
async def detokenize(request: Request) -> Response:
    """The text of `tokens` (ids in the vocabulary)."""
    srv = _server(request)
    req = await srv.parse(request, DetokenizeRequest)
    srv.check_model(req.model)
    bad = next((t for t in req.tokens if not 0 <= t < srv.tok.vocab_size), None)
    if bad is not None:
        raise APIError(400, f"token id {bad} is outside the vocabulary [0, {srv.tok.vocab_size})", "tokens",
                   "invalid_value")
    return srv.ok("/detokenize", DetokenizeResponse(prompt=srv.tok.decode(req.tokens)))

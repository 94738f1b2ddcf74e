"""LoRA adapters served by name: `gptforge serve BASE --lora NAME=RUN_DIR,...`, a request's `model`
naming an adapter runs its rows with that adapter inside the continuous batch
(`gptforge.infer.multi_lora`), and the adapters are loaded and unloaded at runtime with
POST /v1/load_lora_adapter and POST /v1/unload_lora_adapter (as vLLM names them). GET /v1/models
lists each adapter with its `root` (the run it came from) and `parent` (the served base)."""

from __future__ import annotations

import re
from typing import Any

from fastapi import APIRouter, Request
from fastapi.responses import Response
from starlette.concurrency import run_in_threadpool

from gptforge.serve.openapi import route_doc
from gptforge.serve.protocol import (
    APIError,
    DeletedModel,
    LoadLoRAAdapterRequest,
    ModelCard,
    UnloadLoRAAdapterRequest,
)

router = APIRouter()

_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._:/-]{0,127}$")


def parse_lora_option(value: str | None) -> dict[str, str]:
    """`--lora NAME=RUN_DIR[,NAME=RUN_DIR...]` -> {name: run directory}.

    Raises:
        ValueError: an entry without `=`, an empty or repeated name, naming --lora.
    """
    out: dict[str, str] = {}
    for item in (value or "").split(","):
        if not item.strip():
            continue
        name, sep, path = item.strip().partition("=")
        if not sep or not name or not path:
            raise ValueError(f"--lora {item.strip()!r}: give NAME=RUN_DIR (several separated by commas)")
        if name in out:
            raise ValueError(f"--lora: the name {name!r} is given twice")
        out[name] = path
    return out


class ServedAdapters:
    """The adapters a server serves by name, over its engine's model (in-process engines only).

    Args:
        model: the served base model (its adaptable linears become `MultiLoRALinear`s at the first load).
        engine: the server's Engine (or EngineProcess: then every load is refused).
        served: the base's served model id.
    """

    def __init__(self, model, engine, served: str):
        self.model, self.engine, self.served = model, engine, served
        self.by_name: dict[str, Any] = {}

    def load(self, name: str, path: str) -> Any:
        """Load the adapter of the LoRA fine-tune at `path` as `name`; returns it.

        Raises:
            APIError: 400 for a bad or taken name, an engine process, or an adapter the base refuses
                (`load_adapter`); 404 when `path` holds no checkpoint.
        """
        from gptforge.infer.engine import Engine
        from gptforge.infer.multi_lora import enable_multi_lora, load_adapter

        if not _NAME.match(name) or name == self.served:
            raise APIError(400, f"lora_name {name!r}: use letters, digits and . _ : / - (at most 128), not the base's "
                                f"own id `{self.served}`", "lora_name", "invalid_value")
        if name in self.by_name:
            raise APIError(400, f"the adapter `{name}` is already loaded (from {self.by_name[name].path}); unload it "
                                "first", "lora_name", "invalid_value")
        if not isinstance(self.engine, Engine):
            raise APIError(400, "LoRA adapters are served by the in-process engine only: restart without "
                                "--engine-process", "lora_name", "unsupported_parameter")
        try:
            adapter = load_adapter(name, path, self.model, self.served)
        except FileNotFoundError as e:
            raise APIError(404, f"lora_path {path}: {e}", "lora_path", "not_found") from None
        except (ValueError, OSError) as e:  # not a LoRA run of this base; unreadable, or no path at all
            raise APIError(400, str(e)[:500], "lora_path", "invalid_value") from None
        self.engine.lora = enable_multi_lora(self.model)
        self.by_name[name] = adapter
        return adapter

    def unload(self, name: str) -> None:
        """Stop serving `name` (requests already running with it finish with it).

        Raises:
            APIError: 404 when no adapter has that name.
        """
        if self.by_name.pop(name, None) is None:
            raise APIError(404, f"no adapter named `{name}` is loaded (loaded: {', '.join(self.by_name) or 'none'})",
                           "lora_name", "model_not_found")

    def get(self, name: str | None) -> Any:
        """The adapter a request's `model` names, or None (the base)."""
        return self.by_name.get(name) if name is not None else None

    def cards(self, created: int, max_model_len: int) -> list[ModelCard]:
        """GET /v1/models entries of the adapters."""
        return [ModelCard(id=n, created=created, owned_by="gptforge", max_model_len=max_model_len, root=a.path,
                          parent=self.served) for n, a in self.by_name.items()]


def _invalidate_schema(request: Request) -> None:
    request.app.openapi_schema = None  # the served model ids appear in it


@router.post("/v1/load_lora_adapter", response_class=Response, summary="Serve a LoRA adapter by name",
             **route_doc(LoadLoRAAdapterRequest, ModelCard, errors=(400, 404, 413)))
async def load_lora_adapter(request: Request) -> Response:
    """Load the LoRA fine-tune at `lora_path` (run directory or checkpoint) over the served base;
    requests naming `lora_name` as their model then run with it."""
    srv = request.app.state.server
    req = await srv.parse(request, LoadLoRAAdapterRequest)
    await run_in_threadpool(srv.adapters.load, req.lora_name, req.lora_path)  # reads the checkpoint
    _invalidate_schema(request)
    card = srv.adapters.cards(srv.created, srv.max_model_len)
    return srv.ok("/v1/load_lora_adapter", next(c for c in card if c.id == req.lora_name))


@router.post("/v1/unload_lora_adapter", response_class=Response, summary="Stop serving a LoRA adapter",
             **route_doc(UnloadLoRAAdapterRequest, DeletedModel, errors=(400, 404, 413)))
async def unload_lora_adapter(request: Request) -> Response:
    """Stop serving the adapter `lora_name`; the base and other adapters are unchanged."""
    srv = request.app.state.server
    req = await srv.parse(request, UnloadLoRAAdapterRequest)
    srv.adapters.unload(req.lora_name)
    _invalidate_schema(request)
    return srv.ok("/v1/unload_lora_adapter", DeletedModel(id=req.lora_name))

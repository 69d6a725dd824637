"""LoRA adapters: the static ones at start, and vLLM's run-time routes.

`load_static` loads every `--lora-modules` adapter once the engine is up (one that fails stops the
server). With `VLLM_ALLOW_RUNTIME_LORA_UPDATING=1`, `POST /v1/load_lora_adapter` loads the weights before
serving the name (a bad path is a 400 at once) and `/v1/unload_lora_adapter` stops serving it (the
engine keeps the weights cached), both in vLLM's "Success: ..." text, one at a time under a lock.
"""

from __future__ import annotations

import asyncio
import logging
import os

from aiohttp import web

from engine_adapter.base import Adapter, EngineFailure, EngineRejected
from streamproxy.core.adapters import parse_lora_modules
from streamproxy.errors import InvalidRequest, ServiceUnavailable
from streamproxy.http.routes.body import decode_body
from streamproxy.http.state import AppState, app_state, engine_dead
from streamproxy.protocol.lora import decode_load, decode_unload

log = logging.getLogger("streamproxy.lora")


def runtime_updates_allowed() -> bool:
    """vLLM's `VLLM_ALLOW_RUNTIME_LORA_UPDATING` ("1" or "true")."""
    return os.environ.get("VLLM_ALLOW_RUNTIME_LORA_UPDATING", "0").strip().lower() in ("1", "true")


async def load_static(state: AppState) -> None:
    """Load `--lora-modules` into the engine and serve their names (raises if one cannot be loaded)."""
    for module in parse_lora_modules(state.settings.lora_modules):
        await _load(state, module.name, module.path, parent=module.base_model_name, replace=False)


async def _load(state: AppState, name: str, path: str, *, parent: str | None, replace: bool) -> Adapter:
    engine = state.engine
    async with state.adapter_lock:
        adapter = state.adapters.plan_load(name, path, parent=parent, replace=replace)
        try:
            async with asyncio.timeout(state.settings.request_timeout):
                await engine.load_adapter(adapter, replace=replace)
        except EngineRejected as exc:
            raise InvalidRequest(f"The LoRA adapter '{name}' cannot be loaded from '{path}': {exc}", param=exc.param or "lora_path") from exc
        except EngineFailure as exc:
            if engine.state == "dead":
                raise engine_dead() from exc
            raise ServiceUnavailable(str(exc)) from exc
        except TimeoutError:
            raise ServiceUnavailable(f"loading the LoRA adapter '{name}' took longer than --request-timeout") from None
        state.adapters.add(adapter)
    log.info("LoRA adapter %r loaded from %s (id %d, parent %s)", name, path, adapter.id, adapter.parent)
    return adapter


async def load_lora_adapter(request: web.Request) -> web.Response:
    state = app_state(request)
    req = await decode_body(request, decode_load)
    state.require_engine(None)  # 503 while it loads, after it died, while draining
    await _load(state, req.lora_name, req.lora_path, parent=None, replace=req.load_inplace)
    return web.Response(text=f"Success: LoRA adapter '{req.lora_name}' added successfully.")


async def unload_lora_adapter(request: web.Request) -> web.Response:
    state = app_state(request)
    req = await decode_body(request, decode_unload)
    async with state.adapter_lock:
        state.adapters.remove(req.lora_name)
    log.info("LoRA adapter %r unloaded", req.lora_name)
    return web.Response(text=f"Success: LoRA adapter '{req.lora_name}' removed successfully.")

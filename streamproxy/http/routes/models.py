"""GET /v1/models, /v1/models/{id}, /health, /version: small, no engine call.

The model list is the base model's served names, then one card per LoRA
adapter (`root` its path, `parent` its base model), as `vllm serve` lists them.
"""

from __future__ import annotations

from aiohttp import web

from streamproxy.errors import ModelNotFound
from streamproxy.http.state import VERSION, app_state
from streamproxy.protocol.common import HealthStatus, ModelCard, ModelList, VersionInfo, encode


def _cards(request: web.Request) -> list[ModelCard]:
    state = app_state(request)
    info = state.engine.info
    cards = [ModelCard(id=name, created=info.created, root=info.root, max_model_len=info.max_model_len) for name in info.served_names]
    cards += [
        ModelCard(id=a.name, created=info.created, root=a.path, max_model_len=info.max_model_len, parent=a.parent)
        for a in state.adapters
    ]
    return cards


async def list_models(request: web.Request) -> web.Response:
    return _json(ModelList(data=_cards(request)))


async def get_model(request: web.Request) -> web.Response:
    model_id = request.match_info["model_id"]
    for card in _cards(request):
        if card.id == model_id:
            return _json(card)
    raise ModelNotFound(f"The model `{model_id}` does not exist.", param="model")


async def health(request: web.Request) -> web.Response:
    state = app_state(request)
    engine_state = state.engine.state
    if engine_state == "ready":
        return _json(HealthStatus(status="ok"))
    # Load balancers and orchestrators may honour Retry-After while the model loads.
    headers = {"Retry-After": "10"} if engine_state == "loading" else {}
    return _json(HealthStatus(status=engine_state), status=503, headers=headers)


async def version(request: web.Request) -> web.Response:
    return _json(VersionInfo(version=VERSION))


def _json(obj: object, status: int = 200, headers: dict[str, str] | None = None) -> web.Response:
    return web.Response(body=encode(obj), status=status, headers=headers, content_type="application/json")

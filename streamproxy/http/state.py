"""What every handler shares: settings, the engine, and the gate in front of it.

`AppState.require_engine(model)` is the one check before any generation:
it answers 503 while the engine loads, after it died (`engine_dead`, also
during a drain: the more useful answer) or while the server drains, and 404
for a model name that is not served (a LoRA adapter's name is served, see
`adapters`, except where `adapters=False`: embeddings). `inflight` bounds the
life of every generating request (request timeout, drain; see drain.py).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

from aiohttp import web

from engine_adapter.base import Adapter, Engine
from streamproxy.apis.responses.store import ResponseStore, size_from
from streamproxy.config import Settings
from streamproxy.core.adapters import AdapterRegistry
from streamproxy.errors import EngineDead, EngineLoading, ModelNotFound, ServerShuttingDown, ServiceUnavailable
from streamproxy.http.admission import Admission
from streamproxy.http.drain import InFlight

VERSION = "0.1.0"
SYSTEM_FINGERPRINT = f"streamproxy-{VERSION}"


class AppState:
    def __init__(self, settings: Settings, engine: Engine) -> None:
        self.settings = settings
        self.engine = engine
        self.started = int(time.time())
        self.engine_error: str | None = None
        self.engine_died = False  # engine_watch saw it die
        self.admission = Admission(settings.max_concurrent_requests, settings.max_queued_requests)
        self.inflight = InFlight()
        self.engine_ids: set[str] = set()  # of the requests in flight (generation.Work claims and releases them)
        # Called when the engine cannot start, or after it died (the server then exits non-zero).
        self.on_engine_failure: list[Callable[[], None]] = []
        self.death_watch: asyncio.Task[None] | None = None  # engine_watch.watch, once the engine is up
        # LoRA adapters served beside the model (--lora-modules, POST /v1/load_lora_adapter);
        # loads and unloads take the lock one at a time (vLLM: a lock per name).
        self.adapters = AdapterRegistry(engine.info.served_names)
        self.adapter_lock = asyncio.Lock()
        self.responses = ResponseStore(size_from(settings.responses_store))
        # The tasks running background responses (routes/responses.py); cancelled on shutdown.
        self.background: set[asyncio.Task[None]] = set()

    @property
    def ready(self) -> bool:
        return self.engine.state == "ready"

    def adapter(self, model: str | None) -> Adapter | None:
        """The LoRA adapter a request's `model` names (None: the base model)."""
        return self.adapters.get(model)

    def require_engine(self, model: str | None, *, adapters: bool = True) -> Engine:
        engine = self.engine
        state = engine.state
        if state == "dead":
            raise engine_dead()
        if self.inflight.draining:
            raise ServerShuttingDown("the server is shutting down; retry on another instance")
        if state == "loading":
            raise EngineLoading("the model is still loading; retry shortly", retry_after=10)
        if state != "ready":  # not in the contract's states
            raise ServiceUnavailable("the inference engine is not available (it stopped or failed); retry shortly")
        if model is not None and model not in engine.info.served_names and not (adapters and model in self.adapters):
            raise ModelNotFound(f"The model `{model}` does not exist.", param="model")
        return engine


def engine_dead() -> EngineDead:
    return EngineDead("the inference engine is dead; this server is exiting to be restarted, retry shortly")


STATE_KEY: web.AppKey[AppState] = web.AppKey("streamproxy_state", AppState)


def app_state(request: web.Request) -> AppState:
    return request.app[STATE_KEY]

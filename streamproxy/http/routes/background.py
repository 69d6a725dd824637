"""Responses' background mode (`background: true`): a response the server generates on its own.

vLLM's model, bounded. `start` checks vLLM's rules, enters admission and the store (at most N running:
429) and runs `generation.detach` in a server task, so a client that leaves does not end it. Without
`stream` the create answers the `queued` response; with it the events as they come (`follow`), and
`GET /v1/responses/{id}?stream=true&starting_after=N` replays from N+1 and follows. `cancel` cancels
the task and the response is `cancelled` with its output so far; a drain ends the rest at its deadline
(`failed`), `stop` cancels any left.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Sequence

import msgspec
from aiohttp import web

from engine_adapter.base import Delta, Engine
from streamproxy.apis.responses.protocol import Response, encode
from streamproxy.apis.responses.store import ResponseStore
from streamproxy.apis.responses.stream import ResponsesEncoder
from streamproxy.core.blockstream import seed_of
from streamproxy.core.prepare import Prepared
from streamproxy.errors import APIError, InternalError, InvalidRequest
from streamproxy.http.admission import Ticket
from streamproxy.http.body import SSE_HEADERS, Body, WriteStalled
from streamproxy.http.context import CONTEXT
from streamproxy.http.routes import generation
from streamproxy.http.state import STATE_KEY, AppState, app_state
from streamproxy.http.writer import client_gone

log = logging.getLogger("streamproxy.responses")

# vLLM's 400 for `background` when its store is off (VLLM_ENABLE_RESPONSES_API_STORE unset).
NO_STORE = (
    "This vLLM engine does not support `store=True` and therefore does not support the background mode. "
    "To enable these features, set the environment variable `VLLM_ENABLE_RESPONSES_API_STORE=1` when "
    "launching the vLLM server."
)


class Background:
    """One background response (the store's `Live` entry); the accumulator its task feeds."""

    __slots__ = ("shell", "enc", "status", "task", "frames", "final", "_changed")

    def __init__(self, shell: Response, enc: ResponsesEncoder, stream: bool) -> None:
        self.shell = shell
        self.enc = enc
        self.status = "queued"
        self.task: asyncio.Task[None] | None = None
        self.frames: list[bytes] | None = [] if stream else None  # a streamed one's events, one frame each
        self.final: bytes | None = None
        self._changed = asyncio.Event()

    # -- what collect() feeds (an Accumulator) -----------------------------
    @property
    def prompt_tokens(self) -> int:
        return self.enc.prompt_tokens

    @prompt_tokens.setter
    def prompt_tokens(self, n: int) -> None:
        self.enc.prompt_tokens = n

    @property
    def cached_tokens(self) -> int:
        return self.enc.cached_tokens

    @cached_tokens.setter
    def cached_tokens(self, n: int) -> None:
        self.enc.cached_tokens = n

    @property
    def completion_tokens(self) -> int:
        return self.enc.completion_tokens

    @property
    def finish_reasons(self) -> Sequence[str | None]:
        return self.enc.finish_reasons

    def step(self, deltas: Sequence[Delta]) -> None:
        self._add(self.enc.step(deltas))

    def started(self) -> None:
        """The engine took it."""
        self.status = "in_progress"
        self._add(self.enc.start())  # its response() now shows the output so far

    def _add(self, data: bytes) -> None:
        if self.frames is not None and data:
            self.frames.extend(frame + b"\n\n" for frame in data.split(b"\n\n")[:-1])
        self._wake()

    def _wake(self) -> None:
        changed, self._changed = self._changed, asyncio.Event()
        changed.set()

    def end(self, final: bytes, frames: bytes) -> None:
        self._add(frames)
        self.final = final
        self._wake()

    # -- what GET and cancel read ------------------------------------------
    def snapshot(self) -> bytes:
        if self.final is not None:
            return self.final
        if self.status == "queued":
            return encode(msgspec.structs.replace(self.shell, status="queued"))
        return encode(self.enc.response())

    async def cancel(self) -> None:
        """Cancel its task and wait until it ended (its engine request aborted)."""
        task = self.task
        assert task is not None
        task.cancel()
        await asyncio.wait([task])

    async def changed(self) -> None:
        """Until something was added."""
        await self._changed.wait()


async def start(
    request: web.Request, state: AppState, engine: Engine, prep: Prepared, shell: Response, store: ResponseStore | None,
    stream: bool,
) -> web.StreamResponse:
    if store is None:  # `store: false` with background is convert's 400; here the server keeps nothing
        raise InvalidRequest(NO_STORE, param="background")
    shell.background = True
    work = generation.Work(engine, [prep.prompt_ids], [prep.params])
    bg = Background(shell, ResponsesEncoder(shell, prep.filters, emit=stream, id_seed=seed_of(shell.id)), stream)
    ticket = state.admission.enter(work.weight)
    try:
        store.start(shell.id, bg)
    except APIError:
        ticket.release()
        raise
    task = asyncio.get_running_loop().create_task(_run(state, store, bg, work, ticket, request[CONTEXT].request_id))
    bg.task = task
    state.background.add(task)
    task.add_done_callback(state.background.discard)
    if stream:
        return await follow(request, bg, 0)
    return web.Response(body=bg.snapshot(), content_type="application/json")


async def _run(state: AppState, store: ResponseStore, bg: Background, work: generation.Work, ticket: Ticket, request_id: str) -> None:
    enc = bg.enc
    final: Response
    frames = b""
    try:
        await generation.detach(state, work, ticket, bg, request_id, bg.started)
        frames = enc.finish()
        final = enc.response()
    except asyncio.CancelledError:  # a cancel (or shutdown): vLLM's `cancelled`, with the output so far
        enc.finish()
        final = msgspec.structs.replace(enc.response(), status="cancelled")
    except APIError as exc:
        frames = enc.error(exc)
        final = enc.response()
    except Exception:
        log.exception("background response %s failed", bg.shell.id)
        frames = enc.error(InternalError("the background response failed"))
        final = enc.response()
    body = encode(final)
    bg.end(body, frames)
    store.end(bg.shell.id, None if bg.frames is not None else body)


async def follow(request: web.Request, bg: Background, start_at: int) -> web.StreamResponse:
    """Stream a background response's events from index `start_at` until it ended (or the client left)."""
    assert bg.frames is not None
    settings = app_state(request).settings
    body = Body(request, web.StreamResponse(headers=SSE_HEADERS), bg.enc.keepalive, heartbeat=settings.sse_heartbeat,
                stall=settings.write_stall_timeout)
    try:
        await body.open()
        at = max(start_at, 0)
        while True:
            frames = bg.frames
            if at < len(frames):
                data = b"".join(frames[at:])
                at = len(frames)
                await body.write(data)
            elif bg.final is not None:
                break
            else:
                await bg.changed()  # the body's heartbeat meanwhile
        await body.finish()
    except (WriteStalled, ConnectionResetError) as exc:
        client_gone(request, exc, request[CONTEXT])
    finally:
        body.close()
    return body.response


async def stop(app: web.Application) -> None:
    """on_shutdown: cancel the background responses still running (each aborts its engine request)."""
    tasks = list(app[STATE_KEY].background)
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks)

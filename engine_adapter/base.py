"""The engine contract: what the server needs from an inference engine.

A request's life: `start()`, `render_chat()`/`encode()` to prompt ids, `generate()` -> `OutputStream`,
`abort()` (idempotent), `close()`; the edge also reads `info`, `state`, `decode`, `tokenizer`, `embed`,
`load_adapter` and `num_running`. `Engine` and `OutputStream` are Protocols (mypy checks shape, no base
class); each adapter maps the engine-neutral `GenerationParams` to its own sampling parameters.

`DeltaQueue` is the one `OutputStream`, filled by every engine: one `put` per step, and the consumer
takes everything pending at once, so a slow socket coalesces steps into one write. `get()` is
cancellation-safe; `wait(timeout)` waits without taking. Push: an idle consumer whose socket keeps up
`arm`s a sink that `put` calls synchronously in the engine's step; the sink returns False (or raises:
kept, surfaced as `PushFailed` by the next `get_nowait`) and the stream falls back to pulling.
"""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any, Literal, Protocol

import msgspec

FinishReason = Literal["stop", "length", "abort", "error"]
EngineState = Literal["loading", "ready", "dead"]


class Adapter(msgspec.Struct, frozen=True, kw_only=True):
    """A LoRA adapter chosen per request by name. `id`: vLLM's `lora_int_id` (>= 1, kept on reload);
    `parent`: the served base model name it belongs to."""

    name: str
    id: int
    path: str
    parent: str


class GenerationParams(msgspec.Struct, kw_only=True):
    max_tokens: int
    n: int = 1
    temperature: float = 1.0
    top_p: float = 1.0
    top_k: int = 0  # 0: disabled
    min_p: float = 0.0
    presence_penalty: float = 0.0
    frequency_penalty: float = 0.0
    repetition_penalty: float = 1.0
    seed: int | None = None
    stop: list[str] = []
    stop_token_ids: list[int] = []
    ignore_eos: bool = False
    min_tokens: int = 0
    logit_bias: dict[int, float] | None = None
    # Number of top logprobs per output token; None = no logprobs.
    logprobs: int | None = None
    # Number of top logprobs per prompt token (-1: the whole vocabulary, as vLLM);
    # None = none. They come on the stream (`OutputStream.prompt_logprobs`).
    prompt_logprobs: int | None = None
    include_stop_str_in_output: bool = False
    skip_special_tokens: bool = True
    # Structured output constraints (json schema, regex, choice, grammar) ride here.
    structured: dict[str, Any] | None = None
    # The chat template kwargs the prompt was rendered with: an engine-side reasoning
    # parser reads them (e.g. enable_thinking) to know when a constraint starts to apply.
    template_kwargs: dict[str, Any] | None = None
    # The LoRA adapter to run the request with (None: the base model alone).
    adapter: Adapter | None = None
    # W3C trace context (`traceparent`, `tracestate`) of the request's span, with --otlp-traces-endpoint:
    # the engine's own spans join the trace (vLLM's `trace_headers`). None: no tracing.
    trace_headers: dict[str, str] | None = None


class ModelInfo(msgspec.Struct, kw_only=True):
    name: str  # the served name (first of served_names)
    served_names: list[str]
    root: str  # where the weights come from
    max_model_len: int
    created: int
    # Embedding/pooling models cannot generate.
    runner: Literal["generate", "pooling"] = "generate"
    # Token ids are 0 .. vocab_size-1 (None: unknown until the engine has loaded).
    vocab_size: int | None = None
    # What `--tool-call-parser auto` and `--reasoning-parser auto` read (known once loaded).
    chat_template: str | None = None
    model_type: str | None = None


def token_text(data: bytes) -> str:
    """How a token's bytes read as text: escaped `\\xNN` where they are not whole UTF-8."""
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError:
        return data.decode("utf-8", "backslashreplace")


class TokenLogprob:
    """One token's log probability. `bytes`: the real bytes (maybe half a character); `token`:
    `token_text(bytes)`; `top`: the likeliest tokens in rank order (their own `top` empty); `rank`: the
    vocabulary rank where the engine tells it. A prompt's first token has `logprob` None and no `top`."""

    __slots__ = ("token_id", "token", "bytes", "logprob", "top", "rank")

    def __init__(
        self,
        token_id: int,
        token: str,
        data: bytes,
        logprob: float | None,
        top: Sequence[TokenLogprob] = (),
        rank: int | None = None,
    ) -> None:
        self.token_id = token_id
        self.token = token
        self.bytes = data
        self.logprob = logprob
        self.top = top
        self.rank = rank

    def __repr__(self) -> str:
        return f"TokenLogprob({self.token_id}, {self.token!r}, {self.logprob})"


class Delta(msgspec.Struct, gc=False, repr_omit_defaults=True):
    """What one choice produced in one engine step. `text` may be UTF-8 `bytes` ending mid-character
    (the utf8 carry repairs it). `gc=False`: data only, never a cycle."""

    index: int
    text: str | bytes
    num_tokens: int
    finish_reason: str | None = None
    token_ids: Sequence[int] | None = None
    logprobs: list[TokenLogprob] | None = None


class EngineFailure(Exception):
    """The engine failed a request (or died) after it was accepted. `retryable`: the engine asks the
    client to try again (vLLM's RetryableRequestError, e.g. a paused engine); `code` names why."""

    def __init__(self, message: str = "", *, code: str | None = None, retryable: bool = False) -> None:
        super().__init__(message)
        self.code = code
        self.retryable = retryable


class EngineRejected(Exception):
    """The engine refused a request as invalid (a client error, 400)."""

    def __init__(self, message: str, param: str | None = None) -> None:
        super().__init__(message)
        self.param = param


class PushFailed(Exception):
    """The push sink raised; `__cause__` is what it raised."""


Sink = Callable[[list[Delta]], bool]


class OutputStream(Protocol):
    """One request's output as the writer reads it (single consumer, cancellation-safe).

    `get_nowait()` takes everything pending (None: nothing yet) and raises `StopAsyncIteration` at the
    end, the engine's error, or `PushFailed`. `prompt_tokens`/`cached_tokens` are final once `finished`;
    `prompt_logprobs` is set before the first step is taken.
    """

    prompt_tokens: int
    cached_tokens: int
    prompt_logprobs: list[TokenLogprob] | None

    @property
    def finished(self) -> bool: ...

    def arm(self, sink: Sink) -> bool: ...

    def disarm(self) -> None: ...

    def get_nowait(self) -> list[Delta] | None: ...

    async def get(self) -> list[Delta]: ...

    async def wait(self, timeout: float) -> None: ...


class DeltaQueue:
    """An `OutputStream` the engine fills: `put` per step, `close` at the end."""

    __slots__ = (
        "_pending", "_owned", "_waiter", "_closed", "_error", "_sink", "_sink_error", "prompt_tokens", "cached_tokens",
        "prompt_logprobs",
    )

    def __init__(self) -> None:
        self._pending: list[Delta] = []
        self._owned = False
        self._waiter: asyncio.Future[None] | None = None
        self._closed = False
        self._error: BaseException | None = None
        self._sink: Sink | None = None
        self._sink_error: BaseException | None = None
        self.prompt_tokens = 0
        self.cached_tokens = 0
        self.prompt_logprobs: list[TokenLogprob] | None = None

    # -- producer side (engine) --
    def put(self, deltas: list[Delta]) -> None:
        sink = self._sink
        if sink is not None:
            pending = self._pending
            if pending:  # held steps (`hold`) go first, in the same piece
                self._pending = []
                deltas = pending + deltas
            try:
                if sink(deltas):
                    return
            except Exception as exc:  # never into the engine's loop
                self._sink = None
                self._sink_error = exc
                self._wake()
                return
            self._sink = None  # the consumer takes over (and pulls)
        self._queue(deltas)

    def hold(self, deltas: list[Delta]) -> None:
        """Queue a step without handing it on: neither the sink nor the consumer sees it until
        `release()` or the next `put`, which hands it on with that step (one piece: one write when
        the sink is armed). For a producer that knows more of this stream's output is waiting."""
        self._append(deltas)

    def release(self) -> None:
        """Hand on what `hold` queued: to the sink when armed, else wake the consumer."""
        if self._sink is not None and self._pending:
            self.put([])
        else:
            self._wake()

    def _queue(self, deltas: list[Delta]) -> None:
        self._append(deltas)
        self._wake()

    def _append(self, deltas: list[Delta]) -> None:
        pending = self._pending
        if not pending:
            self._pending = deltas
            self._owned = False
        else:
            if not self._owned:  # never mutate the producer's list
                self._pending = pending = list(pending)
                self._owned = True
            pending.extend(deltas)

    def close(self, error: BaseException | None = None) -> None:
        """No more output. With `error`, the consumer sees it after what is pending."""
        if error is not None and self._error is None:
            self._error = error
        self._closed = True
        self._sink = None
        self._wake()

    def _wake(self) -> None:
        waiter = self._waiter
        if waiter is not None:
            self._waiter = None
            if not waiter.done():
                waiter.set_result(None)

    # -- consumer side (writer) --
    @property
    def finished(self) -> bool:
        return self._closed and not self._pending

    def arm(self, sink: Sink) -> bool:
        if self._pending or self._closed or self._sink_error is not None:
            return False
        self._sink = sink
        return True

    def disarm(self) -> None:
        self._sink = None

    def get_nowait(self) -> list[Delta] | None:
        if self._sink_error is not None:
            raise PushFailed(repr(self._sink_error)) from self._sink_error
        pending = self._pending
        if pending:
            self._pending = []
            return pending
        if self._closed:
            if self._error is not None:
                raise self._error
            raise StopAsyncIteration
        return None

    async def get(self) -> list[Delta]:
        while True:
            got = self.get_nowait()
            if got is not None:
                return got
            waiter = self._waiter = asyncio.get_running_loop().create_future()
            await waiter

    async def wait(self, timeout: float) -> None:
        """Until something is pending (or the end, or a sink error), at most `timeout` s; takes nothing.
        A bare timer on the waiter: lighter than `asyncio.timeout()` per idle stream."""
        if self._pending or self._closed or self._sink_error is not None:
            return
        loop = asyncio.get_running_loop()
        waiter = self._waiter = loop.create_future()
        timer = loop.call_later(timeout, _release, waiter)
        try:
            await waiter
        finally:
            timer.cancel()

    def __aiter__(self) -> DeltaQueue:
        return self

    async def __anext__(self) -> list[Delta]:
        return await self.get()


def _release(waiter: asyncio.Future[None]) -> None:
    if not waiter.done():
        waiter.set_result(None)


class Engine(Protocol):
    info: ModelInfo

    @property
    def state(self) -> EngineState: ...

    async def start(self) -> None: ...

    async def close(self) -> None: ...

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]: ...

    def decode(self, token_ids: Sequence[int]) -> str: ...

    def render_chat(
        self,
        messages: list[dict[str, Any]],
        *,
        add_generation_prompt: bool = True,
        continue_final_message: bool = False,
        tools: list[dict[str, Any]] | None = None,
        chat_template_kwargs: dict[str, Any] | None = None,
        chat_template: str | None = None,
    ) -> list[int]:
        """The prompt's token ids, rendered by `chat_template` (None: the model's own template)."""
        ...

    @property
    def tokenizer(self) -> Any:
        """The engine's own tokenizer object (for adapters such as vLLM's tool parsers), or None."""
        ...

    async def generate(self, request_id: str, prompt_ids: list[int], params: GenerationParams) -> OutputStream:
        """Submit a request; its output comes through the returned stream (raises
        `EngineRejected` for a request the engine refuses, `EngineFailure` when it cannot run)."""
        ...

    async def embed(self, request_id: str, prompt_ids: list[int], dimensions: int | None = None) -> list[float]:
        """Pooling models only (info.runner == "pooling")."""
        ...

    async def load_adapter(self, adapter: Adapter, *, replace: bool = False) -> None:
        """Load a LoRA adapter now (`replace`: reload under the same id); `EngineRejected` if it cannot be."""
        ...

    async def abort(self, request_id: str) -> None: ...

    @property
    def num_running(self) -> int:
        """Requests the engine holds for this server (the `streamproxy_engine_requests` gauge)."""
        ...


if TYPE_CHECKING:

    def _conforms(queue: DeltaQueue) -> OutputStream:  # mypy proves DeltaQueue is an OutputStream
        return queue

"""A deterministic scripted engine with the same contract as the real one.

One step loop for the whole engine gives each running request its next token every `token_delay` s
(after `ttft`). A `FakeScript` says what comes out: explicit `tokens` (str, or `bytes` that may end
mid-character) ending "stop", or `text` words repeated until `max_tokens` ("length"); stop strings as
vLLM; `fail_after`/`fail_on` fail requests; a step that raises (or a prompt with `crash_on`, or
`kill()`) kills the engine as vLLM's core dies. Prompts are one token per character (code points); a
generated token's id is `SCRIPT_IDS + position` (Unicode's private use area A, inside the vocabulary), and
`decode` reads such an id as the script's token. The "model" follows its own tokens: a prompt that ends
with a generated id continues the script after it (a continuation of prompt + generated ids makes what an
unbroken run would; the bytes of a character split at that point come with the next token, as vLLM's
detokenizer primed with the prompt sends them). Logprobs and words are fake_text.py's. The chat template is fake_chat.py's; `rendered`/`template_kwargs` keep
what render_chat got.
"""

from __future__ import annotations

import asyncio
import os
import time
from collections import deque
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, Literal

import msgspec

from . import fake_chat
from .base import (
    Adapter,
    Delta,
    DeltaQueue,
    EngineFailure,
    EngineRejected,
    EngineState,
    GenerationParams,
    ModelInfo,
)
from .fake_text import (
    SCRIPT_IDS,
    char,
    is_script_id,
    prompt_logprobs,
    release,
    resumes_at,
    sample_logprobs,
    script_id,
    script_words,
    split_tail,
)

MAX_LOGPROBS = 20  # vLLM's default --max-logprobs


class FakeScript(msgspec.Struct, kw_only=True):
    text: str = "Hello! This is a fake streamed answer. "
    tokens: list[str | bytes] | None = None
    ttft: float = 0.0
    token_delay: float = 0.0
    fail_after: int | None = None
    # Only requests whose prompt contains this text fail after `fail_after` tokens (None: every request).
    fail_on: str | None = None
    # How the injected failure ends the stream: the engine's failure, its refusal of the request
    # (as vLLM's validation errors, EngineRejected), or a failure it asks to retry (a paused engine).
    fail_as: Literal["failure", "rejected", "retryable"] = "failure"
    # A step serving a request whose prompt contains this text raises: the engine dies.
    crash_on: str | None = None
    logprobs: list[float] | None = None


def _injected(kind: str, after: int) -> Exception:
    message = f"injected failure after {after} tokens"
    if kind == "rejected":
        return EngineRejected(message)
    return EngineFailure(message, code="engine_paused" if kind == "retryable" else None, retryable=kind == "retryable")


class _Choice:
    __slots__ = ("index", "emitted", "text", "sent", "done")

    def __init__(self, index: int) -> None:
        self.index = index
        self.emitted = 0
        self.text = ""  # everything generated (for stop strings)
        self.sent = 0  # how much of `text` has gone out
        self.done = False


class _Running:
    __slots__ = ("request_id", "stream", "params", "choices", "start_at", "tokens", "repeat", "plain", "fail_after", "crash",
                 "start", "carried")

    def __init__(
        self, request_id: str, stream: DeltaQueue, params: GenerationParams, start_at: float, script: FakeScript,
        fail_after: int | None = None, crash: bool = False, start: int = 0,
    ) -> None:
        self.request_id = request_id
        self.stream = stream
        self.params = params
        self.choices = [_Choice(i) for i in range(params.n)]
        self.start_at = start_at
        self.repeat = script.tokens is None
        self.tokens: Sequence[str | bytes] = script_words(script.text) if script.tokens is None else script.tokens
        self.fail_after = fail_after
        self.crash = crash
        self.start = start  # the script position it continues from (the prompt ended with the one before)
        # The bytes of a character the prompt's last generated tokens split: sent with the first token.
        self.carried = split_tail(self.tokens, start) if start and not self.repeat else b""
        # One choice, no stop strings, no logprobs, no injected failure: `FakeEngine._advance_plain`.
        self.plain = (params.n == 1 and not params.stop and params.logprobs is None and fail_after is None and not crash
                      and not start)


class FakeEngine:
    def __init__(
        self,
        script: FakeScript | None = None,
        *,
        model_name: str = "fake",
        served_names: list[str] | None = None,
        max_model_len: int = 4096,
        load_delay: float = 0.0,
        runner: Literal["generate", "pooling"] = "generate",
        embedding_dim: int = 8,
        record: bool = True,
        chat_template: str | None = None,
    ) -> None:
        self.script = script or FakeScript()
        names = served_names or [model_name]
        self.info = ModelInfo(
            name=names[0], served_names=names, root="fake", max_model_len=max_model_len, created=int(time.time()), runner=runner,
            vocab_size=0x110000,  # the fake tokenizer's ids are Unicode code points
            chat_template=chat_template,  # only what `auto` parsers read: the fake renders its own way
        )
        self.embedding_dim = embedding_dim
        self.load_delay = load_delay
        self._state: EngineState = "loading"
        self._running: dict[str, _Running] = {}
        self._wakeup = asyncio.Event()
        self._loop_task: asyncio.Task[None] | None = None
        # Observability for tests; a served fake engine (record=False) keeps
        # nothing, so its memory stays flat however long it runs.
        self.aborted: list[str] | deque[str] = [] if record else deque(maxlen=0)
        self.submitted: list[tuple[str, list[int], GenerationParams]] | deque[tuple[str, list[int], GenerationParams]] = (
            [] if record else deque(maxlen=0)
        )
        # render_chat's last (messages, tools), bounded: a benchmark renders millions.
        self.rendered: deque[tuple[list[dict[str, Any]], list[dict[str, Any]] | None]] = deque(maxlen=64)
        self.template_kwargs: deque[dict[str, Any] | None] = deque(maxlen=64)
        self.adapters: dict[str, Adapter] = {}  # what load_adapter loaded, by name
        self.submitted_embeddings: list[tuple[str, list[int]]] | deque[tuple[str, list[int]]] = (
            [] if record else deque(maxlen=0)
        )

    # -- lifecycle ------------------------------------------------------
    @property
    def state(self) -> EngineState:
        return self._state

    async def start(self) -> None:
        if self.load_delay:
            await asyncio.sleep(self.load_delay)
        self._loop_task = asyncio.create_task(self._step_loop(), name="fake-engine-steps")
        self._state = "ready"

    async def close(self) -> None:
        if self._loop_task is not None:
            self._loop_task.cancel()
            try:
                await self._loop_task
            except asyncio.CancelledError:
                pass
        for run in self._running.values():
            run.stream.close(EngineFailure("engine shut down"))
        self._running.clear()
        self._state = "dead"

    def kill(self, reason: str = "engine died") -> None:
        """Simulate an engine crash: in-flight requests fail, state becomes dead."""
        self._state = "dead"
        running, self._running = self._running, {}
        for run in running.values():
            run.stream.close(EngineFailure(reason))

    @property
    def num_running(self) -> int:
        return len(self._running)

    # -- tokenizer ------------------------------------------------------
    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return [ord(c) for c in text]

    def decode(self, token_ids: Sequence[int]) -> str:
        if not any(is_script_id(t) for t in token_ids):
            return "".join(map(char, token_ids))
        tokens = self.script.tokens or script_words(self.script.text)
        data = b""
        for t in token_ids:
            piece = tokens[(t - SCRIPT_IDS) % len(tokens)] if is_script_id(t) else char(t)
            data += piece if isinstance(piece, bytes) else piece.encode("utf-8", "surrogatepass")
        return data.decode("utf-8", "replace")

    @property
    def tokenizer(self) -> Any:
        return None

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
        self.rendered.append((messages, tools))
        self.template_kwargs.append(chat_template_kwargs)
        return self.encode(fake_chat.render(
            messages, add_generation_prompt=add_generation_prompt, continue_final_message=continue_final_message,
            tools=tools, chat_template_kwargs=chat_template_kwargs, chat_template=chat_template))

    # -- generation -----------------------------------------------------
    async def generate(self, request_id: str, prompt_ids: list[int], params: GenerationParams) -> DeltaQueue:
        if self._state != "ready":
            raise EngineFailure(f"engine is {self._state}")
        if params.prompt_logprobs is not None and not 0 <= params.prompt_logprobs <= MAX_LOGPROBS:
            raise EngineRejected(
                f"Requested prompt logprobs of {params.prompt_logprobs}, which is greater than max allowed: {MAX_LOGPROBS}",
                "prompt_logprobs",
            )
        stream = DeltaQueue()
        stream.prompt_tokens = len(prompt_ids)
        if params.prompt_logprobs is not None:
            stream.prompt_logprobs = prompt_logprobs(prompt_ids, params.prompt_logprobs)
        self.submitted.append((request_id, prompt_ids, params))
        script = self.script
        fail_after, crash = script.fail_after, False
        if script.fail_on is not None or script.crash_on is not None:
            prompt = self.decode(prompt_ids)
            if script.fail_on is not None and script.fail_on not in prompt:
                fail_after = None
            crash = script.crash_on is not None and script.crash_on in prompt
        self._running[request_id] = _Running(request_id, stream, params, time.monotonic() + script.ttft, script, fail_after, crash,
                                             resumes_at(prompt_ids))
        self._wakeup.set()
        return stream

    async def embed(self, request_id: str, prompt_ids: list[int], dimensions: int | None = None) -> list[float]:
        """A deterministic unit vector from the prompt (a pooling model's contract)."""
        if self.info.runner != "pooling":
            raise EngineRejected("this model cannot make embeddings")
        dim = dimensions or self.embedding_dim
        if dim > self.embedding_dim:
            raise EngineRejected(f"dimensions must be at most {self.embedding_dim}", "dimensions")
        self.submitted_embeddings.append((request_id, prompt_ids))
        raw = [float(sum(prompt_ids[i::dim]) % 97 + 1) for i in range(dim)]
        norm = sum(x * x for x in raw) ** 0.5
        return [x / norm for x in raw]

    async def load_adapter(self, adapter: Adapter, *, replace: bool = False) -> None:
        """An adapter is "loaded" when its path is an existing folder (as vLLM's adapters are)."""
        if self._state != "ready":
            raise EngineFailure(f"engine is {self._state}")
        if not os.path.isdir(adapter.path):
            raise EngineRejected(f"Loading lora {adapter.name} failed: No adapter found for {adapter.path}", "lora_path")
        self.adapters[adapter.name] = adapter

    async def abort(self, request_id: str) -> None:
        run = self._running.pop(request_id, None)
        if run is not None:
            self.aborted.append(request_id)
            run.stream.close()

    async def _step_loop(self) -> None:
        delay = self.script.token_delay
        last = time.monotonic()
        while True:
            if not self._running:
                self._wakeup.clear()
                await self._wakeup.wait()
                last = time.monotonic()
            # A step every `delay` seconds from the last one's start, like a model
            # whose step time does not grow with the work the server does per
            # step (its output handling, the writes pushed from the step).
            await asyncio.sleep(max(0.0, last + delay - time.monotonic()))
            now = last = time.monotonic()
            try:
                self.step(now)
            except Exception as exc:  # as vLLM's engine core: a step that raises kills the engine
                self.kill(f"fake engine step failed: {exc!r}")
                return
            if self._running and all(now < r.start_at for r in self._running.values()):
                # Everyone is still in "prefill": nap until the first is due
                # (in short naps, so a new request is not held up for long).
                nearest = min(r.start_at for r in self._running.values())
                await asyncio.sleep(min(0.01, max(0.0, nearest - now - delay)))

    def step(self, now: float) -> None:
        """One engine step at time `now`: every running request past its TTFT gets its next token.

        One pass over the batch, as a real engine's output processing loops
        over its requests: the common request (`_Running.plain`) is advanced
        inline here (what `_advance_plain` does, without a call per request
        and token); the others go through `_advance`.
        """
        finished: list[str] | None = None
        for run in self._running.values():
            if now < run.start_at:
                continue
            if run.plain:
                choice = run.choices[0]
                position = choice.emitted
                tokens = run.tokens
                if run.repeat or position < len(tokens):
                    emitted = choice.emitted = position + 1
                    if emitted < run.params.max_tokens and (
                        run.repeat or emitted < len(tokens) or run.params.ignore_eos
                    ):
                        run.stream.put([Delta(0, tokens[position % len(tokens)], 1, None, [script_id(position)])])
                        continue
                    choice.emitted = position  # the last token: `_advance_plain` finishes the request
                if not self._advance_plain(run):
                    continue
            elif not self._advance(run):
                continue
            if finished is None:
                finished = []
            finished.append(run.request_id)
        if finished is not None:
            for request_id in finished:
                self._running.pop(request_id, None)

    def _advance(self, run: _Running) -> bool:
        """Emit one token per unfinished choice (a request that is not `plain`); True when it is done."""
        if run.crash:
            raise RuntimeError("injected engine crash (a prompt contains --fake-crash-on)")
        params = run.params
        fail_after = run.fail_after
        deltas: list[Delta] = []
        for choice in run.choices:
            if choice.done:
                continue
            if fail_after is not None and choice.emitted >= fail_after:
                if deltas:
                    run.stream.put(deltas)
                run.stream.close(_injected(self.script.fail_as, fail_after))
                return True
            position = run.start + choice.emitted
            if not run.repeat and position >= len(run.tokens):
                choice.done = True
                deltas.append(Delta(choice.index, "", 0, "stop"))
                continue
            token = run.tokens[position % len(run.tokens)]
            if run.carried and not choice.emitted and isinstance(token, bytes):
                token = run.carried + token
            choice.emitted += 1
            finish = "length" if choice.emitted >= params.max_tokens else None
            if finish is None and not run.repeat and position + 1 >= len(run.tokens) and not params.ignore_eos:
                finish = "stop"
            if params.stop and isinstance(token, str):
                choice.text += token
                token, choice.sent, hit = release(choice.text, choice.sent, params.stop, params.include_stop_str_in_output,
                                                  final=finish is not None)
                if hit:
                    finish = "stop"
            if finish is not None:
                choice.done = True
            token_id = script_id(position)
            logprobs = (sample_logprobs(run.tokens, position, self.script.logprobs, params.logprobs or 0, token_id)
                        if params.logprobs is not None else None)
            deltas.append(Delta(choice.index, token, 1, finish, token_ids=[token_id], logprobs=logprobs))
        if deltas:
            run.stream.put(deltas)
        if all(c.done for c in run.choices):
            run.stream.close()
            return True
        return False

    @staticmethod
    def _advance_plain(run: _Running) -> bool:
        """`_advance` for the common request (n=1, no stop strings, no logprobs): same
        output, less work per token, so a benchmark measures the server, not the fake."""
        choice = run.choices[0]
        tokens = run.tokens
        position = choice.emitted
        if not run.repeat and position >= len(tokens):
            choice.done = True
            run.stream.put([Delta(0, "", 0, "stop")])
            run.stream.close()
            return True
        emitted = choice.emitted = position + 1
        params = run.params
        if emitted >= params.max_tokens:
            finish: str | None = "length"
        elif not run.repeat and emitted >= len(tokens) and not params.ignore_eos:
            finish = "stop"
        else:
            finish = None
        run.stream.put([Delta(0, tokens[position % len(tokens)], 1, finish, [script_id(position)])])
        if finish is None:
            return False
        choice.done = True
        run.stream.close()
        return True


if TYPE_CHECKING:
    from .base import Engine

    def _conforms(engine: FakeEngine) -> Engine:  # mypy proves FakeEngine is an Engine
        return engine

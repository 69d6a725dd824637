"""One suite over every Engine implementation (engine_adapter/base.py's protocol).

The fake engine always; vLLM's (`VllmEngine`, in this process, built by the
CLI's own `build` with `-O0`) under the `engine` marker. Each runs once per
module, in one event loop (vLLM's output handler lives in the loop of its
first request), and the tests drive it through the protocol only: state and
info, encode/decode, render_chat, generate -> an OutputStream of Deltas
ending in a finish reason per choice, abort (idempotent, nothing left
running), close.

Nothing here depends on what a real model says (greedy answers differ
between CPUs): the tests check shapes, counts and finish reasons, and
compare two ways to the same answer (the same greedy request twice, with
and without logprobs, which on vLLM are two output paths; a stop string
taken from the engine's own answer).
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, TypeVar

import pytest

from engine_adapter.base import Adapter, Delta, EngineFailure, EngineRejected, GenerationParams, ModelInfo, OutputStream, TokenLogprob
from engine_adapter.fake import FakeEngine, FakeScript
from harness.server import CPU_DTYPE, ENGINE_IN_CORE
from harness.waiting import wait_until

T = TypeVar("T")

VLLM_ARGS = ["-O0", *CPU_DTYPE, "--max-model-len", "2048", "--max-num-seqs", "8"]
START_TIMEOUT = 600.0
BOUND = 120.0  # for one request to end; a passing test is far quicker
MESSAGES = [{"role": "user", "content": "Count from one to twenty, in words, separated by commas."}]


@dataclass
class Subject:
    name: str
    engine: Any
    runner: asyncio.Runner
    unstarted: Callable[[], Any]  # a fresh engine of the same kind, not started

    def run(self, coro: Awaitable[T]) -> T:
        return self.runner.run(asyncio.wait_for(coro, START_TIMEOUT))

    def prompt(self) -> list[int]:
        return self.engine.render_chat(MESSAGES)


def _fake() -> FakeEngine:
    return FakeEngine(FakeScript(token_delay=0.001))


def _vllm() -> Any:
    from streamproxy.cli import build

    return build(list(VLLM_ARGS))[1]


@contextmanager
def _engine_env() -> Iterator[None]:
    """The engine's settings in this process's environment only while an engine is built or started (its engine-core
    process is spawned then): a server launched ahead meanwhile (tests/support/prestart.py) must not inherit them."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("VLLM_CPU_KVCACHE_SPACE", "2")
        for key, value in ENGINE_IN_CORE.items():  # the model in the engine-core process (harness.server)
            mp.setenv(key, value)
        yield


@pytest.fixture(scope="module", params=["fake", pytest.param("vllm", marks=pytest.mark.engine)])
def subject(request: pytest.FixtureRequest) -> Iterator[Subject]:
    kind = _fake if request.param == "fake" else _vllm

    def make() -> Any:
        with _engine_env():
            return kind()

    with asyncio.Runner() as runner:
        engine = make()
        subject = Subject(request.param, engine, runner, make)
        try:
            with _engine_env():
                subject.run(engine.start())
            yield subject
        finally:
            if engine.state != "dead":  # test_close closes it; a failed run may not get there
                subject.run(engine.close())


async def collect(stream: OutputStream) -> list[Delta]:
    """Every Delta of a stream, to its end."""

    async def go() -> list[Delta]:
        out: list[Delta] = []
        async for step in stream:  # type: ignore[attr-defined]  # both implementations iterate; the Protocol does not promise it
            assert isinstance(step, list) and step, step
            out += step
        return out

    return await asyncio.wait_for(go(), BOUND)


async def generate(subject: Subject, request_id: str, **params: Any) -> tuple[OutputStream, list[Delta]]:
    stream = await subject.engine.generate(request_id, subject.prompt(), GenerationParams(**params))
    return stream, await collect(stream)


def per_choice(deltas: list[Delta], n: int = 1) -> dict[int, list[Delta]]:
    """Deltas by choice; asserts the shape of each and one finish reason per choice, on its last Delta."""
    out: dict[int, list[Delta]] = {}
    for d in deltas:
        assert isinstance(d, Delta), d
        assert isinstance(d.index, int) and 0 <= d.index < n, d
        assert isinstance(d.text, (str, bytes)), d
        assert isinstance(d.num_tokens, int) and d.num_tokens >= 0, d
        if d.token_ids is not None:
            assert len(d.token_ids) == d.num_tokens and all(isinstance(t, int) for t in d.token_ids), d
        out.setdefault(d.index, []).append(d)
    assert sorted(out) == list(range(n)), out
    for index, choice in out.items():
        finishes = [d.finish_reason for d in choice if d.finish_reason is not None]
        assert len(finishes) == 1 and choice[-1].finish_reason is not None, (index, choice)
    return out


def text(deltas: list[Delta]) -> str:
    return "".join(d.text if isinstance(d.text, str) else d.text.decode("utf-8", "replace") for d in deltas)


def ids(deltas: list[Delta]) -> list[int]:
    return [t for d in deltas for t in (d.token_ids or ())]


def count(deltas: list[Delta]) -> int:
    return sum(d.num_tokens for d in deltas)


# -- state, info, tokenizer, template -------------------------------------------------------------


def test_a_started_engine_is_ready_and_describes_its_model(subject):
    engine = subject.engine
    assert engine.state == "ready"
    info = engine.info
    assert isinstance(info, ModelInfo)
    assert info.name == info.served_names[0] and all(isinstance(n, str) and n for n in info.served_names)
    assert isinstance(info.max_model_len, int) and info.max_model_len > 0
    assert info.runner == "generate"
    assert isinstance(info.created, int) and info.created > 0


def test_the_chat_template_auto_parsers_read_is_known_once_started(subject):
    info = subject.engine.info
    if subject.name == "fake":
        assert (info.chat_template, info.model_type) == (None, None)  # the fake renders its own way
    else:  # what `--tool-call-parser auto` reads: the template the engine renders chats with
        assert isinstance(info.chat_template, str) and "{%" in info.chat_template
        assert isinstance(info.model_type, str) and info.model_type


def test_an_engine_not_started_is_loading_and_refuses_to_generate(subject):
    engine = subject.unstarted()
    assert engine.state == "loading"
    with pytest.raises(EngineFailure):
        subject.run(engine.generate("not-started", [1, 2, 3], GenerationParams(max_tokens=1)))


def test_encode_and_decode_round_trip(subject):
    engine = subject.engine
    for sample in ["Hello, world!", "two  spaces, tabs\tand 123", "é ü 🙂"]:
        token_ids = engine.encode(sample, add_special_tokens=False)
        assert token_ids and all(isinstance(t, int) for t in token_ids)
        assert engine.decode(token_ids) == sample
        assert sample in engine.decode(engine.encode(sample))


def test_render_chat_renders_the_messages_and_the_generation_prompt(subject):
    engine = subject.engine
    messages = [{"role": "user", "content": "Say hi to Ada."}]
    with_prompt = engine.render_chat(messages)
    without = engine.render_chat(messages, add_generation_prompt=False)
    for rendered in (with_prompt, without):
        assert rendered and all(isinstance(t, int) for t in rendered)
        assert "Say hi to Ada." in engine.decode(rendered)
    # The generation prompt is appended to the same rendering.
    assert len(with_prompt) > len(without) and with_prompt[: len(without)] == without
    # Continuing the assistant's message ends the prompt inside it.
    continued = engine.render_chat([*messages, {"role": "assistant", "content": "Hi Ada"}], continue_final_message=True)
    assert engine.decode(continued).rstrip().endswith("Hi Ada")


# -- generate -------------------------------------------------------------------------------------


def test_generate_streams_deltas_to_a_finish_reason(subject):
    prompt = subject.prompt()

    async def go() -> tuple[OutputStream, list[Delta]]:
        stream = await subject.engine.generate("shape-1", prompt, GenerationParams(max_tokens=8, temperature=0, ignore_eos=True))
        return stream, await collect(stream)

    stream, deltas = subject.run(go())
    (choice,) = per_choice(deltas).values()
    assert choice[-1].finish_reason == "length"
    assert count(choice) == 8
    assert stream.prompt_tokens == len(prompt)
    assert stream.finished


def test_an_answer_ends_with_stop_or_at_max_tokens(subject):
    _, deltas = subject.run(generate(subject, "short-1", max_tokens=12, temperature=0))
    (choice,) = per_choice(deltas).values()
    reason = choice[-1].finish_reason
    assert reason in ("stop", "length"), reason
    assert count(choice) == 12 if reason == "length" else 1 <= count(choice) <= 12


def test_n2_runs_each_choice_to_its_own_finish(subject):
    _, deltas = subject.run(generate(subject, "n2-1", max_tokens=6, n=2, temperature=1.0, seed=7, ignore_eos=True))
    for choice in per_choice(deltas, n=2).values():
        assert choice[-1].finish_reason == "length" and count(choice) == 6


def test_the_same_greedy_request_gives_the_same_answer_with_and_without_logprobs(subject):
    """Twice plain, once with logprobs (on vLLM: the direct route's plain and logprobs paths)."""
    params = dict(max_tokens=10, temperature=0, ignore_eos=True)
    _, first = subject.run(generate(subject, "same-1", **params))
    _, again = subject.run(generate(subject, "same-2", **params))
    _, with_logprobs = subject.run(generate(subject, "same-3", **params, logprobs=2))
    answers = []
    for deltas in (first, again, with_logprobs):
        (choice,) = per_choice(deltas).values()
        answers.append((text(choice), ids(choice), count(choice), choice[-1].finish_reason))
    assert answers[0] == answers[1] == answers[2], answers
    assert answers[0][2] == 10 and answers[0][3] == "length"
    entries = [(d, lp) for d in with_logprobs for lp in (d.logprobs or ())]
    assert all(d.logprobs is not None and len(d.logprobs) == d.num_tokens for d in with_logprobs if d.num_tokens)
    assert [lp.token_id for _, lp in entries] == answers[0][1]
    for _, lp in entries:
        assert isinstance(lp, TokenLogprob) and isinstance(lp.bytes, bytes) and lp.logprob is not None and lp.logprob <= 0
        assert 1 <= len(lp.top) <= 2 and all(isinstance(t, TokenLogprob) for t in lp.top)
        assert lp.logprob == lp.top[0].logprob  # greedy: the chosen token is the most likely one


def test_prompt_logprobs_one_per_prompt_token_the_first_unscored(subject):
    """Asked with prompt_logprobs=k: on the stream before the first step, one per prompt token (vLLM's own path)."""
    prompt = subject.prompt()

    async def go() -> tuple[OutputStream, list[Delta], object]:
        params = GenerationParams(max_tokens=1, temperature=0, prompt_logprobs=2)
        stream = await subject.engine.generate("prompt-lp-1", prompt, params)
        first = await asyncio.wait_for(stream.get(), BOUND)
        seen = stream.prompt_logprobs
        return stream, first + await collect(stream), seen

    stream, deltas, seen = subject.run(go())
    per_choice(deltas)
    got = stream.prompt_logprobs
    assert seen is got and got is not None and len(got) == len(prompt)
    assert [t.token_id for t in got] == prompt
    assert got[0].logprob is None and got[0].top == ()
    for t in got[1:]:
        assert isinstance(t, TokenLogprob) and isinstance(t.bytes, bytes) and t.logprob is not None and t.logprob <= 0
        assert t.rank is not None and t.rank >= 1
        assert 1 <= len(t.top) <= 2 and [a.rank for a in t.top] == sorted(a.rank or 0 for a in t.top)
    # Without the field, none.
    stream, _ = subject.run(generate(subject, "prompt-lp-2", max_tokens=1, temperature=0))
    assert stream.prompt_logprobs is None


def test_a_stop_string_from_the_answer_ends_it_there(subject):
    params = dict(max_tokens=24, temperature=0, ignore_eos=True)
    _, deltas = subject.run(generate(subject, "stop-1", **params))
    answer = text(deltas)
    words = answer.split()
    if len(words) < 3:
        pytest.skip(f"the answer has too few words to take a stop string from: {answer!r}")
    stop = words[len(words) // 2]
    _, stopped = subject.run(generate(subject, "stop-2", **params, stop=[stop]))
    (choice,) = per_choice(stopped).values()
    assert choice[-1].finish_reason == "stop"
    assert text(choice) == answer[: answer.find(stop)], (stop, answer)


# -- abort ------------------------------------------------------------------------------------------


@pytest.mark.parametrize("logprobs", [None, 1], ids=["plain", "logprobs"])
def test_abort_ends_the_stream_is_idempotent_and_leaves_no_request(subject, logprobs):
    engine = subject.engine
    request_id = f"abort-{logprobs}"

    async def go() -> tuple[list[Delta], list[Delta]]:
        params = GenerationParams(max_tokens=1000, temperature=0, ignore_eos=True, logprobs=logprobs)
        stream = await engine.generate(request_id, subject.prompt(), params)
        first = await asyncio.wait_for(stream.get(), BOUND)
        await engine.abort(request_id)
        await engine.abort(request_id)  # idempotent
        rest = await collect(stream)  # ends, without an error
        assert await wait_until(lambda: engine.num_running == 0, BOUND), engine.num_running
        return first, rest

    first, rest = subject.run(go())
    assert first and all(d.finish_reason is None for d in first)
    # What comes after the abort is at most an "abort" finish, never an answer's end.
    assert {d.finish_reason for d in rest} <= {None, "abort"}, rest
    assert count(first + rest) < 1000


def test_abort_of_an_unknown_request_is_a_no_op(subject):
    subject.run(subject.engine.abort("never-was"))
    assert subject.engine.num_running == 0


# -- close: the last test of the module (the engine is shared) ----------------------------------------


def test_an_adapter_that_cannot_be_loaded_is_rejected(subject, tmp_path):
    # vLLM here runs without --enable-lora (refused for that); with it, a missing folder is refused
    # too (tests/engine/test_lora_engine.py).
    adapter = Adapter(name="nowhere", id=1, path=str(tmp_path / "missing"), parent=subject.engine.info.name)
    with pytest.raises(EngineRejected):
        subject.run(subject.engine.load_adapter(adapter))
    assert subject.engine.state == "ready"


def test_close_fails_what_runs_and_leaves_the_engine_dead(subject):
    engine = subject.engine

    async def go() -> dict[str, BaseException | None]:
        streams = {}
        for name, logprobs in (("plain", None), ("logprobs", 1)):
            params = GenerationParams(max_tokens=1000, temperature=0, ignore_eos=True, logprobs=logprobs)
            streams[name] = await engine.generate(f"close-{name}", subject.prompt(), params)
            await asyncio.wait_for(streams[name].get(), BOUND)
        await engine.close()
        ended: dict[str, BaseException | None] = {}
        for name, stream in streams.items():
            try:
                await asyncio.wait_for(collect(stream), 20)
                ended[name] = None
            except (EngineFailure, TimeoutError) as exc:
                ended[name] = exc
        return ended

    ended = subject.run(go())
    assert engine.state == "dead"
    with pytest.raises(EngineFailure):
        subject.run(engine.generate("after-close", [1, 2, 3], GenerationParams(max_tokens=1)))
    subject.run(engine.abort("after-close"))  # a no-op, not an error
    assert isinstance(ended["plain"], EngineFailure), ended
    assert isinstance(ended["logprobs"], EngineFailure), ended

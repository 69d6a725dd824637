"""FakeEngine: the scripted engine behind the HTTP tests and benchmarks."""

from __future__ import annotations

import asyncio
import time

import pytest

from engine_adapter.base import EngineFailure, GenerationParams
from engine_adapter.fake import FakeEngine, FakeScript
from engine_adapter.fake_text import split_words


def run(script: FakeScript, params: GenerationParams, *, prompt=(1, 2, 3)):
    """Start an engine, run one request to its end; return ([(index, text, tokens, finish)...] per step, error)."""

    async def main():
        engine = FakeEngine(script)
        await engine.start()
        try:
            stream = await engine.generate("r1", list(prompt), params)
            steps, error = [], None
            try:
                async for deltas in stream:
                    steps.append([(x.index, x.text, x.num_tokens, x.finish_reason) for x in deltas])
            except EngineFailure as exc:
                error = exc
            return steps, error
        finally:
            await engine.close()

    return asyncio.run(main())


def joined(steps, index=0):
    return "".join(t for step in steps for (i, t, _, _) in step if i == index)


def finishes(steps):
    return {i: f for step in steps for (i, _, _, f) in step if f is not None}


def test_split_words_keeps_leading_whitespace_with_the_word():
    assert split_words("Hello! This is  it. ") == ["Hello!", " This", " is", "  it.", " "]


def test_scripted_tokens_stream_one_per_step_then_stop():
    steps, error = run(FakeScript(tokens=["Hel", "lo", "!"]), GenerationParams(max_tokens=100))
    assert error is None
    assert steps == [[(0, "Hel", 1, None)], [(0, "lo", 1, None)], [(0, "!", 1, "stop")]]


def test_scripted_tokens_cut_by_max_tokens_finish_length():
    steps, _ = run(FakeScript(tokens=["a", "b", "c"]), GenerationParams(max_tokens=2))
    assert steps == [[(0, "a", 1, None)], [(0, "b", 1, "length")]]


def test_scripted_bytes_tokens_pass_through_unchanged():
    euro = "€".encode()
    steps, _ = run(FakeScript(tokens=[euro[:1], euro[1:]]), GenerationParams(max_tokens=10))
    assert steps == [[(0, euro[:1], 1, None)], [(0, euro[1:], 1, "stop")]]


def test_text_repeats_until_max_tokens_then_length():
    steps, error = run(FakeScript(text="x y"), GenerationParams(max_tokens=5))
    assert error is None
    assert [s[0][1] for s in steps] == ["x", " y", "x", " y", "x"]
    assert steps[-1] == [(0, "x", 1, "length")]
    assert all(f is None for s in steps[:-1] for (_, _, _, f) in s)


def test_stop_string_truncates_and_finishes_stop():
    steps, _ = run(FakeScript(), GenerationParams(max_tokens=100, stop=["fake"]))
    assert joined(steps) == "Hello! This is a "
    assert finishes(steps) == {0: "stop"}


def test_stop_string_kept_with_include_stop_str_in_output():
    steps, _ = run(FakeScript(), GenerationParams(max_tokens=100, stop=["fake"], include_stop_str_in_output=True))
    assert joined(steps) == "Hello! This is a fake"
    assert finishes(steps) == {0: "stop"}


def test_stop_string_inside_a_token_truncates_mid_token():
    steps, _ = run(FakeScript(tokens=["ab", "cd", "ef"]), GenerationParams(max_tokens=10, stop=["zz", "d"]))
    assert joined(steps) == "abc"
    assert finishes(steps) == {0: "stop"}


def test_stop_string_spanning_a_token_boundary_with_stop_included():
    steps, _ = run(FakeScript(), GenerationParams(max_tokens=100, stop=["is a"], include_stop_str_in_output=True))
    assert joined(steps) == "Hello! This is a"


def test_stop_string_spanning_a_token_boundary_is_not_streamed():
    # " is" goes out before " a" completes the stop string "is a"; vLLM's
    # detokenizer holds back len(stop)-1 characters, so a client sees "Hello! This ".
    steps, _ = run(FakeScript(), GenerationParams(max_tokens=100, stop=["is a"]))
    assert joined(steps) == "Hello! This "


def test_fail_after_raises_engine_failure_after_n_tokens():
    steps, error = run(FakeScript(text="w", fail_after=3), GenerationParams(max_tokens=100))
    assert [s for step in steps for s in step] == [(0, "w", 1, None)] * 3
    assert isinstance(error, EngineFailure)
    assert str(error) == "injected failure after 3 tokens"


def test_fail_after_zero_fails_before_any_token():
    steps, error = run(FakeScript(fail_after=0), GenerationParams(max_tokens=10))
    assert steps == []
    assert isinstance(error, EngineFailure)


def test_fail_on_limits_the_failure_to_prompts_that_contain_it():
    script = FakeScript(text="w", fail_after=2, fail_on="FAIL")
    steps, error = run(script, GenerationParams(max_tokens=5), prompt=[ord(c) for c in "a FAIL b"])
    assert len(steps) == 2 and isinstance(error, EngineFailure)
    steps, error = run(script, GenerationParams(max_tokens=5), prompt=[ord(c) for c in "fine"])
    assert len(steps) == 5 and error is None


def test_a_step_that_raises_kills_the_engine():
    """As vLLM's engine core: every running request fails, and the engine serves nothing after."""

    async def main():
        engine = FakeEngine(FakeScript(crash_on="boom", token_delay=0.001))
        await engine.start()
        params = GenerationParams(max_tokens=1000)
        bystander = await engine.generate("a", engine.encode("hello"), params)
        poisoned = await engine.generate("b", engine.encode("a boom here"), params)
        errors = []
        for stream in (bystander, poisoned):
            with pytest.raises(EngineFailure) as caught:
                async for _ in stream:
                    pass
            errors.append(str(caught.value))
        assert engine.state == "dead" and engine.num_running == 0
        with pytest.raises(EngineFailure):
            await engine.generate("c", engine.encode("hi"), params)
        await engine.close()
        return errors

    errors = asyncio.run(main())
    assert all("injected engine crash" in e for e in errors), errors


def test_n2_gives_indices_0_and_1_each_step():
    steps, _ = run(FakeScript(tokens=["a", "b"]), GenerationParams(max_tokens=10, n=2))
    assert steps == [
        [(0, "a", 1, None), (1, "a", 1, None)],
        [(0, "b", 1, "stop"), (1, "b", 1, "stop")],
    ]


def test_prompt_tokens_are_counted_on_the_stream():
    async def main():
        engine = FakeEngine()
        await engine.start()
        try:
            stream = await engine.generate("r1", [5, 6, 7, 8], GenerationParams(max_tokens=1))
            return stream.prompt_tokens, engine.submitted[0][:2]
        finally:
            await engine.close()

    assert asyncio.run(main()) == (4, ("r1", [5, 6, 7, 8]))


def test_abort_closes_the_stream_and_records_the_id():
    async def main():
        engine = FakeEngine(FakeScript(token_delay=0.005))
        await engine.start()
        try:
            stream = await engine.generate("r1", [1], GenerationParams(max_tokens=10_000))
            first = await stream.get()
            await engine.abort("r1")
            await engine.abort("r1")  # idempotent
            rest = []
            async for deltas in stream:
                rest += deltas
            return first, rest, engine.aborted, engine.num_running
        finally:
            await engine.close()

    first, rest, aborted, running = asyncio.run(main())
    assert len(first) >= 1
    assert all(x.finish_reason is None for x in first + rest)
    assert aborted == ["r1"]
    assert running == 0


def test_abort_of_unknown_request_is_a_no_op():
    async def main():
        engine = FakeEngine()
        await engine.start()
        try:
            await engine.abort("nope")
            return engine.aborted
        finally:
            await engine.close()

    assert asyncio.run(main()) == []


def test_ttft_delays_the_first_token():
    async def main():
        engine = FakeEngine(FakeScript(tokens=["a"], ttft=0.15))
        await engine.start()
        try:
            t0 = time.monotonic()
            stream = await engine.generate("r1", [1], GenerationParams(max_tokens=5))
            first = await stream.get()
            return time.monotonic() - t0, [(x.text, x.finish_reason) for x in first]
        finally:
            await engine.close()

    elapsed, first = asyncio.run(main())
    assert first == [("a", "stop")]
    assert 0.15 <= elapsed < 10.0  # it waited (a lower bound); the upper one only catches a hang


def test_without_ttft_the_first_token_is_prompt():
    """Side by side, an engine without ttft gives its first token before one with a 5 s ttft."""

    async def first_token(engine: FakeEngine, name: str, order: list[str]) -> None:
        await engine.start()
        try:
            stream = await engine.generate("r1", [1], GenerationParams(max_tokens=5))
            await stream.get()
            order.append(name)
        finally:
            await engine.close()

    async def main() -> list[str]:
        order: list[str] = []
        slow = asyncio.ensure_future(first_token(FakeEngine(FakeScript(tokens=["a"], ttft=5.0)), "slow", order))
        await asyncio.wait_for(first_token(FakeEngine(FakeScript(tokens=["a"])), "prompt", order), 10.0)
        slow.cancel()
        await asyncio.gather(slow, return_exceptions=True)
        return order

    assert asyncio.run(main()) == ["prompt"]


def test_generate_before_start_fails():
    async def main():
        engine = FakeEngine()
        with pytest.raises(EngineFailure, match="loading"):
            await engine.generate("r1", [1], GenerationParams(max_tokens=1))
        return engine.state

    assert asyncio.run(main()) == "loading"


def test_close_fails_running_requests():
    async def main():
        engine = FakeEngine(FakeScript(ttft=10.0))
        await engine.start()
        stream = await engine.generate("r1", [1], GenerationParams(max_tokens=5))
        await engine.close()
        with pytest.raises(EngineFailure, match="shut down"):
            await stream.get()
        return engine.state

    assert asyncio.run(main()) == "dead"


def test_tokenizer_is_one_token_per_character():
    engine = FakeEngine()
    assert engine.encode("hé") == [104, 233]
    assert engine.decode([104, 233]) == "hé"

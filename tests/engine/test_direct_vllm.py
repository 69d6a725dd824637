"""The direct output route (engine_adapter/vllm_direct.py) against vLLM's own classes.

No engine is started here: `EngineCoreOutput`s are built by hand and fed to a
`DirectRoute` installed on a stand-in OutputProcessor, with the default
model's real tokenizer. The text must equal what vLLM's own
`FastIncrementalDetokenizer` makes of the same tokens (also for characters
split across tokens and for a stop token), other requests' outputs must reach
vLLM's processor untouched, and errors must end direct streams, never the
output handler. tests/engine/test_real_engine.py checks the same route end to
end against vLLM's path on the running engine. Engine-free, so `make
check-vllm` runs it over each supported release's sources too (`vllm_sources`).
"""

from __future__ import annotations

import types
from typing import Any

import pytest

from engine_adapter import vllm_compat
from engine_adapter.base import Delta, DeltaQueue, EngineFailure, EngineRejected, GenerationParams
from engine_adapter.vllm_direct import DirectRoute
from tests.support.push import keep

pytestmark = [pytest.mark.engine, pytest.mark.vllm_sources]

TEXT = "Héllo, wörld! 日本語のテキスト 🎉🎉 done."


@pytest.fixture(scope="module")
def tokenizer():
    from vllm.tokenizers.registry import get_tokenizer

    from engine_adapter.default_model import ensure_default_model

    return get_tokenizer(str(ensure_default_model(progress=False)))


class StandInProcessor:
    """Records what reaches vLLM's side."""

    def __init__(self) -> None:
        self.seen: list[list[str]] = []
        self.errors: list[Exception] = []

    def process_outputs(self, outputs, timestamp=None, stats=None, weight_version=None):
        from vllm.v1.engine.output_processor import OutputProcessorOutput

        self.seen.append([o.request_id for o in outputs])
        return OutputProcessorOutput(request_outputs=[], reqs_to_abort=["from-vllm"])

    def propagate_error(self, e: Exception) -> None:
        self.errors.append(e)


def _request(request_id: str, prompt_ids: list[int], external_id: str | None = None, **sampling):
    from vllm import SamplingParams
    from vllm.v1.engine import EngineCoreRequest

    return EngineCoreRequest(request_id, prompt_ids, None, SamplingParams(**sampling), None, 0.0, None, None, None,
                             external_req_id=external_id)


def add(route, request, external_id, params):
    """DirectRoute.add for one choice: its stream."""
    stream, sent = route.add(request, external_id, params)
    assert sent == [request]
    return stream


def _output(request_id: str, ids: list[int], finish=None):
    from vllm.v1.engine import EngineCoreOutput

    return EngineCoreOutput(request_id=request_id, new_token_ids=ids, finish_reason=finish)


def _vllm_text(tokenizer, prompt_ids: list[int], steps: list[list[int]], stop_terminated_last: bool, **sampling) -> str:
    from vllm.v1.engine.detokenizer import FastIncrementalDetokenizer

    detok = FastIncrementalDetokenizer(tokenizer, _request("v", prompt_ids, **sampling))
    for i, ids in enumerate(steps):
        detok.update(list(ids), stop_terminated_last and i == len(steps) - 1)
    return detok.output_text


def text_of(delta: Delta) -> str:
    assert isinstance(delta.text, str), delta
    return delta.text


def _drain(stream) -> list[Delta]:
    got: list[Delta] = []
    while True:
        try:
            step = stream.get_nowait()
        except StopAsyncIteration:
            return got
        assert step is not None, "the stream neither has output nor is finished"
        got.extend(step)


@pytest.mark.parametrize("per_step", [1, 3])
def test_text_equals_vllms_detokenizer(tokenizer, per_step):
    from vllm.v1.engine import FinishReason

    prompt = tokenizer.encode("A prompt: ", add_special_tokens=False)
    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    steps = [ids[i:i + per_step] for i in range(0, len(ids), per_step)]
    route = DirectRoute(StandInProcessor(), tokenizer)
    stream = add(route, _request("r-1", prompt), "r", GenerationParams(max_tokens=len(ids)))
    for i, step in enumerate(steps):
        last = i == len(steps) - 1
        route.process_outputs([_output("r-1", step, FinishReason.LENGTH if last else None)])
    deltas = _drain(stream)
    assert "".join(text_of(d) for d in deltas) == _vllm_text(tokenizer, prompt, steps, False) == TEXT
    assert sum(d.num_tokens for d in deltas) == len(ids)
    assert deltas[-1].finish_reason == "length" and all(d.finish_reason is None for d in deltas[:-1])
    assert len(route) == 0 and route.internal_ids == {}


@pytest.mark.parametrize("per_step", [1, 2])
def test_a_token_id_the_tokenizer_cannot_take_is_counted_not_shown(tokenizer, per_step):
    """As vLLM's detokenizer: an id past the vocabulary (or negative) decodes to nothing, with a
    warning, and the stream goes on; alone in its step (the inline decode step) or with another."""
    from vllm.v1.engine import FinishReason

    ids = tokenizer.encode("Hello world", add_special_tokens=False)
    bad = [-1] if per_step == 1 else [-1, ids[1]]
    route = DirectRoute(StandInProcessor(), tokenizer)
    stream = add(route, _request("r-1", [1, 2, 3]), "r", GenerationParams(max_tokens=8))
    route.process_outputs([_output("r-1", ids[:1])])
    route.process_outputs([_output("r-1", bad)])
    route.process_outputs([_output("r-1", ids[-1:], FinishReason.LENGTH)])
    deltas = _drain(stream)
    first = tokenizer.decode(ids[:1])
    assert [d.num_tokens for d in deltas] == [1, len(bad), 1]
    assert text_of(deltas[0]) == first
    assert text_of(deltas[1]) == ("" if per_step == 1 else tokenizer.decode(ids[:2])[len(first):])
    assert deltas[-1].finish_reason == "length"


@pytest.mark.parametrize("include", [False, True])
def test_stop_token_counted_not_shown_unless_asked(tokenizer, include):
    from vllm.v1.engine import FinishReason

    eos = tokenizer.eos_token_id
    ids = tokenizer.encode(" the end", add_special_tokens=False)
    route = DirectRoute(StandInProcessor(), tokenizer)
    params = GenerationParams(max_tokens=9, include_stop_str_in_output=include, skip_special_tokens=False)
    stream = add(route, _request("s-1", [1, 2]), "s", params)
    route.process_outputs([_output("s-1", ids)])
    route.process_outputs([_output("s-1", [eos], FinishReason.STOP)])
    deltas = _drain(stream)
    expected = _vllm_text(tokenizer, [1, 2], [ids, [eos]], True, include_stop_str_in_output=include, skip_special_tokens=False)
    assert "".join(text_of(d) for d in deltas) == expected
    assert expected.endswith(tokenizer.eos_token) is include
    assert deltas[-1].finish_reason == "stop" and deltas[-1].token_ids == [eos]
    assert sum(d.num_tokens for d in deltas) == len(ids) + 1


def test_mixed_batch_other_requests_reach_vllm(tokenizer):
    vllm_side = StandInProcessor()
    route = DirectRoute(vllm_side, tokenizer)
    stream = add(route, _request("d-1", [5]), "d", GenerationParams(max_tokens=4))
    ids = tokenizer.encode(" hi", add_special_tokens=False)
    result = route.process_outputs([_output("x-1", [7]), _output("d-1", ids), _output("y-1", [8])])
    assert vllm_side.seen == [["x-1", "y-1"]]  # in order, without the direct one
    assert result.reqs_to_abort == ["from-vllm"]  # vLLM's answer, passed back as it is
    assert [d.text for d in _drain_pending(stream)] == [" hi"]
    # Only direct outputs: vLLM's processor is not called, the handler gets an empty result.
    result = route.process_outputs([_output("d-1", ids)])
    assert vllm_side.seen == [["x-1", "y-1"]] and result.request_outputs == [] and result.reqs_to_abort == []
    route.uninstall()
    method = vllm_side.process_outputs
    assert isinstance(method, types.MethodType) and method.__self__ is vllm_side  # its own bound method again


def _drain_pending(stream) -> list[Delta]:
    got = stream.get_nowait()
    assert got is not None
    return got


def test_discard_and_errors_end_direct_streams(tokenizer):
    vllm_side = StandInProcessor()
    route = DirectRoute(vllm_side, tokenizer)
    a = add(route, _request("a-1", [5]), "a", GenerationParams(max_tokens=4))
    b = add(route, _request("b-1", [5]), "b", GenerationParams(max_tokens=4))
    assert route.discard("a") == ["a-1"] and route.discard("a") is None
    assert a.finished and len(route) == 1
    # An output for a discarded request is vLLM's business (it ignores unknown ids).
    route.process_outputs([_output("a-1", [9])])
    assert vllm_side.seen == [["a-1"]]
    boom = RuntimeError("engine core died")
    route.propagate_error(boom)
    assert vllm_side.errors == [boom] and len(route) == 0
    with pytest.raises(EngineFailure, match="engine core died"):
        b.get_nowait()


def test_a_failing_output_ends_its_stream_not_the_handler(tokenizer):
    route = DirectRoute(StandInProcessor(), tokenizer)
    bad = add(route, _request("bad-1", [5]), "bad", GenerationParams(max_tokens=4))
    good = add(route, _request("good-1", [5]), "good", GenerationParams(max_tokens=4))
    odd = add(route, _request("odd-1", [5]), "odd", GenerationParams(max_tokens=4))
    route.requests["bad-1"].decoder = object()  # its decoder breaks
    ok = tokenizer.encode(" ok", add_special_tokens=False)
    route.process_outputs([_output("bad-1", ok), _output("good-1", ok), _output("odd-1", ["not a token id"])])  # type: ignore[list-item]  # a bad token id on purpose
    assert [d.text for d in good.get_nowait()] == [" ok"]
    with pytest.raises(EngineFailure, match="AttributeError"):
        bad.get_nowait()
    assert "bad-1" not in route.requests and "bad" not in route.internal_ids
    got = odd.get_nowait()  # an id the tokenizer cannot take decodes to nothing (as vLLM) and the stream goes on
    assert got is not None and got[0].text == "" and got[0].num_tokens == 1


def test_unsupported_names_what_is_missing(monkeypatch):
    from engine_adapter import vllm_direct

    class Part:
        output_processor: object
        input_processor: Part
        engine_core: Part

        def __init__(self, *names):
            for n in names:
                setattr(self, n, lambda *a, **k: None)

    class Processor:
        def process_outputs(self, engine_core_outputs, engine_core_timestamp=None, iteration_stats=None, weight_version=None):
            return None

        def propagate_error(self, e):
            return None

    llm = Part("_run_output_handler", "check_admission")
    llm.output_processor = Processor()
    llm.input_processor = Part("process_inputs", "assign_request_id")
    llm.engine_core = Part("add_request_async", "abort_requests_async")
    gate = vllm_compat.direct_route_gate()  # this release's own: None on a supported one
    assert vllm_direct.unsupported(llm) == gate
    if gate is None:
        delattr(llm.engine_core, "abort_requests_async")
        assert vllm_direct.unsupported(llm) == "EngineCoreClient has no abort_requests_async"
    monkeypatch.setattr(vllm_compat, "release", lambda: "0.1.0")
    assert vllm_direct.unsupported(llm) == "vLLM 0.1.0 is not a release it was checked against (0.32.x, 0.33.x)"


def test_the_supported_releases_and_what_is_said_outside_them():
    assert [vllm_compat.supported(v) for v in ("0.32.0", "0.33.1", "0.33.0.dev5+gabc", "0.31.2", "0.34.0")] == [
        True, True, True, False, False]
    assert vllm_compat.release_warning("0.33.0") is None and vllm_compat.direct_route_gate("0.32.0") is None
    warning = vllm_compat.release_warning("0.34.0")
    assert warning is not None and "vLLM 0.34.0" in warning and "0.32.x, 0.33.x" in warning and "\n" not in warning
    assert vllm_compat.in_release("0.33", None, "0.33.0") and not vllm_compat.in_release("0.33", None, "0.32.0")
    assert vllm_compat.in_release(None, "0.33", "0.32.0") and not vllm_compat.in_release(None, "0.33", "0.33.0")


def _error_output(request_id: str, code: str, message: str, retryable: bool = False):
    """0.33's EngineCoreOutput for a request the engine core rejected on arrival (FinishReason.ERROR with `error`)."""
    from vllm.outputs import RequestError
    from vllm.v1.engine import EngineCoreOutput, FinishReason

    return EngineCoreOutput(request_id=request_id, new_token_ids=[], finish_reason=FinishReason.ERROR,
                            error=RequestError(code=code, message=message, retryable=retryable))


@pytest.mark.parametrize(("code", "retryable", "raised"), [
    ("validation_error", False, EngineRejected), ("engine_paused", True, EngineFailure), ("multimodal_cache_miss", True, EngineFailure),
])
def test_a_request_the_engine_core_rejects_ends_with_vllms_message(tokenizer, code, retryable, raised):
    from vllm.v1.engine import EngineCoreOutput

    if "error" not in EngineCoreOutput.__struct_fields__:  # (a msgspec Struct)
        pytest.skip(f"vLLM {vllm_compat.release()}'s EngineCoreOutput carries no error (from 0.33)")
    vllm_side = StandInProcessor()
    route = DirectRoute(vllm_side, tokenizer)
    rejected = add(route, _request("r-1", [5]), "r", GenerationParams(max_tokens=4))
    both = route.add(_request("n-1", [5], "n", n=2), "n", GenerationParams(max_tokens=4, n=2))[0]
    going = add(route, _request("g-1", [5]), "g", GenerationParams(max_tokens=4))
    message = "Generation is paused. Please retry after it resumes." if code == "engine_paused" else "Invalid structured outputs: bad"
    result = route.process_outputs([_error_output("r-1", code, message, retryable), _error_output("0_n-1", code, message, retryable),
                                    _output("g-1", tokenizer.encode(" ok", add_special_tokens=False))])
    with pytest.raises(raised) as err:
        rejected.get_nowait()
    assert str(err.value) == message
    if raised is EngineFailure:
        assert isinstance(err.value, EngineFailure) and (err.value.retryable, err.value.code) == (retryable, code)
    with pytest.raises(raised):  # n = 2: one child rejected ends the request, and its other child is aborted
        both.get_nowait()
    assert result.reqs_to_abort == ["1_n-1"]
    assert [d.text for d in _drain_pending(going)] == [" ok"]  # the others go on
    assert set(route.requests) == {"g-1"} and vllm_side.seen == []


# Stop strings: the route against vLLM's own OutputProcessor, fed the same engine-core outputs.
STOP_CASES: dict[str, dict[str, Any]] = {
    "mid-text, one token a step": dict(stop=["wörld"], per_step=1),
    "surplus tokens in the step": dict(stop=["日本"], per_step=4),
    "kept in the output": dict(stop=["日本"], per_step=3, include_stop_str_in_output=True),
    "never found: the hold-back comes out at the end": dict(stop=["zzz", "Hé!"], per_step=2),
    "min_tokens skips the early matches": dict(stop=["l"], per_step=1, min_tokens=6),
    "several, the first to appear wins": dict(stop=["🎉", "wörld", "done"], per_step=2),
}


def _steps(ids: list[int], per_step: int) -> list[list[int]]:
    return [ids[i:i + per_step] for i in range(0, len(ids), per_step)]


@pytest.mark.parametrize("case", list(STOP_CASES))
def test_stop_strings_as_vllms_output_processor(tokenizer, case):
    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine import FinishReason
    from vllm.v1.engine.output_processor import OutputProcessor

    spec = dict(STOP_CASES[case])
    per_step = spec.pop("per_step")
    prompt = tokenizer.encode("A prompt: ", add_special_tokens=False)
    steps = _steps(tokenizer.encode(TEXT, add_special_tokens=False), per_step)

    def finish(i: int):
        return FinishReason.LENGTH if i == len(steps) - 1 else None

    # vLLM's path.
    processor = OutputProcessor(tokenizer, log_stats=False)
    processor.add_request(_request("v-1", prompt, "v", output_kind=RequestOutputKind.DELTA, **spec), None)
    v_text, v_ids, v_finish, v_aborted = "", [], None, False
    for i, step in enumerate(steps):
        result = processor.process_outputs([_output("v-1", list(step), finish(i))])
        v_aborted |= "v-1" in result.reqs_to_abort
        for out in result.request_outputs:
            v_text += out.outputs[0].text
            v_ids += list(out.outputs[0].token_ids)
            v_finish = out.outputs[0].finish_reason or v_finish
    # The direct route.
    route = DirectRoute(StandInProcessor(), tokenizer)
    params = GenerationParams(max_tokens=len(steps) * per_step, stop=spec["stop"], min_tokens=spec.get("min_tokens", 0),
                              include_stop_str_in_output=spec.get("include_stop_str_in_output", False))
    stream = add(route, _request("d-1", prompt, **spec), "d", params)
    d_aborted = False
    for i, step in enumerate(steps):
        result = route.process_outputs([_output("d-1", list(step), finish(i))])
        d_aborted |= "d-1" in result.reqs_to_abort
    deltas = _drain(stream)
    assert "".join(text_of(d) for d in deltas) == v_text
    assert [t for d in deltas for t in d.token_ids or ()] == v_ids
    assert sum(d.num_tokens for d in deltas) == len(v_ids)
    assert deltas[-1].finish_reason == v_finish and d_aborted == v_aborted
    assert len(route) == 0
    if case == "mid-text, one token a step":  # the oracle itself is not vacuous
        assert v_text == "Héllo, " and v_finish == "stop" and v_aborted
    if case == "never found: the hold-back comes out at the end":
        assert v_text == TEXT and v_finish == "length" and not v_aborted


def test_a_failing_last_output_ends_its_stream_and_nothing_escapes(tokenizer):
    from vllm.v1.engine import FinishReason

    route = DirectRoute(StandInProcessor(), tokenizer)
    stream = add(route, _request("f-1", [5]), "f", GenerationParams(max_tokens=4))
    route.requests["f-1"].decoder = object()  # breaks on the request's last output
    result = route.process_outputs([_output("f-1", tokenizer.encode(" ok", add_special_tokens=False), FinishReason.LENGTH)])
    assert result.reqs_to_abort == []  # the engine core already finished it
    with pytest.raises(EngineFailure, match="AttributeError"):
        stream.get_nowait()
    assert len(route) == 0 and route.internal_ids == {}


# vLLM's per-request stats: the route fills vLLM's IterationStats as vLLM's OutputProcessor does.
# Both run on one real OutputProcessor (log_stats on) with the route installed, fed the same batches.
ARRIVAL = 1000.0  # wall clock, as the frontend's arrival_time
ITERATION = 1003.0  # each batch's IterationStats.iteration_timestamp, pinned (vLLM takes time.time())


def _stats_batches(tokenizer, end: str):
    """(engine-core timestamp, [(token ids, finish, events, prefill_stats)]) per batch of one request;
    the first output carries QUEUED/SCHEDULED and the prefill stats, a later one a preemption."""
    from vllm.v1.engine import EngineCoreEvent, EngineCoreEventType, FinishReason
    from vllm.v1.metrics.stats import PrefillStats

    ids = tokenizer.encode(TEXT, add_special_tokens=False)
    prefill = PrefillStats()
    prefill.set(num_prompt_tokens=5, num_local_cached_tokens=2, num_external_cached_tokens=0)
    queued = [EngineCoreEvent(EngineCoreEventType.QUEUED, 10.0), EngineCoreEvent(EngineCoreEventType.SCHEDULED, 10.5)]
    last = {"length": (ids[6:7], FinishReason.LENGTH), "eos": ([tokenizer.eos_token_id], FinishReason.STOP),
            "engine abort": ([], FinishReason.ABORT), "stop string": (ids[6:7], None)}[end]
    return [
        (11.0, [(ids[0:1], None, queued, prefill)]),
        (11.25, [(ids[1:2], None, None, None)]),
        (11.75, [(ids[2:4], None, None, None)]),
        (12.5, [(ids[4:5], None, [EngineCoreEvent(EngineCoreEventType.PREEMPTED, 12.0)], None)]),
        (13.0, [(ids[5:6], None, None, None)]),
        (14.0, [(last[0], last[1], None, None)]),
    ]


def _run_stats(tokenizer, route_ids: dict[str, str], batches, direct_ids: set[str], stop: list[str] | None = None) -> list[dict]:
    """Feed `batches` to every request in `route_ids` (internal -> external id); the ones in
    `direct_ids` take the route, the rest vLLM's processor. The IterationStats of each batch, as dicts."""
    import copy

    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine import EngineCoreOutput
    from vllm.v1.engine.output_processor import OutputProcessor
    from vllm.v1.metrics.stats import IterationStats

    processor = OutputProcessor(tokenizer, log_stats=True)
    route = DirectRoute(processor, tokenizer)
    prompt = [1, 2, 3, 4, 5]
    sampling = dict(max_tokens=16, stop=stop)
    for internal, external in route_ids.items():
        request = _request(internal, prompt, external, output_kind=RequestOutputKind.DELTA, **sampling)
        request.arrival_time = ARRIVAL
        if internal in direct_ids:
            add(route, request, external, GenerationParams(max_tokens=16, stop=stop or []))
        else:
            processor.add_request(request, None)
    got = []
    for timestamp, outputs in batches:
        stats = IterationStats()
        stats.iteration_timestamp = ITERATION
        batch = [EngineCoreOutput(request_id=internal, new_token_ids=list(ids), finish_reason=finish,
                                  events=copy.deepcopy(events), prefill_stats=copy.deepcopy(prefill))
                 for internal in route_ids for ids, finish, events, prefill in outputs]
        route.process_outputs(batch, timestamp, stats)
        got.append({k: v for k, v in vars(stats).items()})
    assert not processor.request_states and len(route) == 0
    return got


@pytest.mark.parametrize("end", ["length", "eos", "engine abort", "stop string"])
def test_stats_as_vllms_output_processor(tokenizer, end):
    from vllm.v1.engine import FinishReason

    batches = _stats_batches(tokenizer, end)
    stop = None
    if end == "stop string":  # found in the last batch (TEXT's 7th token ends "wörld"); the engine core would go on
        stop = ["ld"]
        assert "ld" not in tokenizer.decode([t for _, outs in batches[:-1] for t in outs[0][0]])
    vllm_side = _run_stats(tokenizer, {"v-1": "r"}, batches, set(), stop)
    direct = _run_stats(tokenizer, {"d-1": "r"}, batches, {"d-1"}, stop)
    assert direct == vllm_side
    # The oracle is not vacuous: every kind of entry is there.
    first, last = vllm_side[0], vllm_side[-1]
    assert first["time_to_first_tokens_iter"] == [ITERATION - ARRIVAL] and first["prompt_token_stats"].total == 5
    assert vllm_side[1]["inter_token_latencies_iter"] == [0.25] and vllm_side[3]["num_preempted_reqs"] == 1
    [finished] = last["finished_requests"]
    reason = {"length": FinishReason.LENGTH, "eos": FinishReason.STOP, "engine abort": FinishReason.ABORT,
              "stop string": FinishReason.STOP}[end]
    assert finished.finish_reason == reason and finished.request_id == "r"
    assert (finished.queued_time, finished.prefill_time, finished.e2e_latency) == (0.5, 0.5, ITERATION - ARRIVAL)
    assert finished.num_prompt_tokens == 5 and finished.num_cached_tokens == 2 and finished.max_tokens_param == 16
    assert finished.num_preemptions == 1 and finished.decode_time == 3.0
    assert last["n_params_iter"] == [1] and last["max_num_generation_tokens_iter"] == [finished.num_generation_tokens]
    assert finished.num_generation_tokens == 6 + (0 if end == "engine abort" else 1)


def test_stats_mixed_batches_count_each_request_once(tokenizer):
    """Direct and vLLM-path requests in the same batches: each counted once, none twice."""
    batches = _stats_batches(tokenizer, "length")
    alone = _run_stats(tokenizer, {"v-1": "a"}, batches, set())
    mixed = _run_stats(tokenizer, {"v-1": "a", "d-1": "b", "v-2": "c", "d-2": "d"}, batches, {"d-1", "d-2"})
    for one, four in zip(alone, mixed, strict=True):
        assert four["num_generation_tokens"] == 4 * one["num_generation_tokens"]
        assert four["prompt_token_stats"].total == 4 * one["prompt_token_stats"].total
        for key in ("time_to_first_tokens_iter", "inter_token_latencies_iter", "n_params_iter",
                    "max_num_generation_tokens_iter"):
            assert four[key] == one[key] * 4, key
        assert sorted(f.request_id for f in four["finished_requests"]) == (["a", "b", "c", "d"] if one["finished_requests"] else [])


def test_a_client_abort_is_no_finished_request(tokenizer):
    """Aborted by us (client gone), as vLLM's abort_requests: the tokens and TTFT seen count, no finish."""
    from vllm.v1.engine import EngineCoreOutput
    from vllm.v1.engine.output_processor import OutputProcessor
    from vllm.v1.metrics.stats import IterationStats

    processor = OutputProcessor(tokenizer, log_stats=True)
    route = DirectRoute(processor, tokenizer)
    request = _request("d-1", [1, 2, 3], "d", max_tokens=8)
    request.arrival_time = ARRIVAL
    add(route, request, "d", GenerationParams(max_tokens=8))
    stats = IterationStats()
    route.process_outputs([EngineCoreOutput(request_id="d-1", new_token_ids=[7])], 11.0, stats)
    assert stats.num_generation_tokens == 1 and len(stats.time_to_first_tokens_iter) == 1
    assert route.discard("d") == ["d-1"]
    stats = IterationStats()
    route.process_outputs([EngineCoreOutput(request_id="d-1", new_token_ids=[8])], 11.5, stats)  # already in flight
    assert stats.finished_requests == [] and stats.num_generation_tokens == 0 and stats.n_params_iter == []


# n > 1, logprobs and prompt logprobs: the route against vLLM's own path as the server runs it (a real
# OutputProcessor putting RequestOutputs into a RequestOutputCollector, whose put vllm_stream.into_queue took),
# fed the same engine-core outputs: the same Deltas (index, text, token ids, finish reason, logprob values,
# top-k token strings, bytes and ranks), prompt logprobs, usage counts, engine-core aborts and vLLM stats.
WIDTH = 8  # columns of the engine core's logprob rows: the batch's largest k + 1 (wider than any request's here)
BYTE_TEXT = "🎉🎉 日本"  # byte-level pieces that are no whole character alone


def _logprob_row(rng, token: int, k: int, pool: list[int]) -> tuple[list[int], list[float], int]:
    """One position's row as the engine core sends it: the token first with its rank, then the top k (padded to
    WIDTH). Four shapes: the token among the top k (its logprob there differs a little, so a mix-up shows), ranked
    beyond k, ranked within k without being among the top k (a tie), and k = 0."""
    others = rng.sample([t for t in pool if t != token], WIDTH)
    shape = rng.randrange(3) if k else 1
    top = others[:k]
    if shape == 0:
        rank = rng.randint(1, k)
        top[rank - 1] = token
    else:
        rank = rng.randint(k + 1, k + 40) if shape == 1 else rng.randint(1, k)
    row = [token, *top, *others[k:WIDTH - 1]]
    values = sorted((-rng.random() * 8 for _ in range(WIDTH - 1)), reverse=True)
    own = values[rank - 1] - 1e-3 if rank <= len(values) else -9.5
    return row, [own, *values], rank


def _sample_lists(rng, ids: list[int], k: int, pool: list[int]):
    import numpy as np
    from vllm.v1.outputs import LogprobsLists

    rows = [_logprob_row(rng, t, k, pool) for t in ids]
    return LogprobsLists(np.array([r[0] for r in rows], dtype=np.int64), np.array([r[1] for r in rows], dtype=np.float32),
                         np.array([r[2] for r in rows], dtype=np.int64))


def _prompt_tensors(rng, prompt: list[int], k: int, pool: list[int]):
    import torch
    from vllm.v1.outputs import LogprobsTensors

    rows = [_logprob_row(rng, t, max(k, 0), pool) for t in prompt[1:]]
    return LogprobsTensors(torch.tensor([r[0] for r in rows]), torch.tensor([r[1] for r in rows], dtype=torch.float32),
                           torch.tensor([r[2] for r in rows]))


MIXED_CASES: dict[str, tuple[dict[str, Any], int]] = {  # name: (sampling kwargs, tokens per step)
    "n=2": (dict(n=2, seed=7), 2),
    "logprobs=5": (dict(logprobs=5), 1),
    "logprobs=0": (dict(logprobs=0), 3),
    "prompt_logprobs=3": (dict(prompt_logprobs=3), 2),
    "prompt_logprobs=-1": (dict(prompt_logprobs=-1), 2),
    "n=2, logprobs=5, prompt_logprobs=2": (dict(n=2, logprobs=5, prompt_logprobs=2), 1),
    "n=2, logprobs=3, stop strings": (dict(n=2, logprobs=3, stop=["wörld", "日本"]), 3),
    "n=3, stop string kept, an engine-core abort": (dict(n=3, logprobs=2, stop=["🎉"], include_stop_str_in_output=True), 2),
}


def _mixed_batches(tokenizer, sampling: dict, per_step: int, prompt: list[int], request_id: str):
    """(timestamp, [EngineCoreOutput]) per step for every choice: choice 0 says TEXT to its length limit, choice 1
    BYTE_TEXT then EOS, choice 2 a few tokens then an abort from the engine core; logprob rows when asked."""
    import random

    from vllm.v1.engine import EngineCoreEvent, EngineCoreEventType, EngineCoreOutput, FinishReason
    from vllm.v1.metrics.stats import PrefillStats

    rng = random.Random(17)
    texts = [tokenizer.encode(TEXT, add_special_tokens=False), tokenizer.encode(BYTE_TEXT, add_special_tokens=False),
             tokenizer.encode(" and so on", add_special_tokens=False)]
    pool = sorted(set(texts[0] + texts[1] + texts[2]))
    n = sampling.get("n", 1)
    ids = [request_id] if n == 1 else [f"{i}_{request_id}" for i in range(n)]
    plans = []
    for i, internal in enumerate(ids):
        steps = _steps(texts[i], per_step)
        ends = [None] * (len(steps) - 1) + [FinishReason.LENGTH]
        if i == 1:
            steps.append([tokenizer.eos_token_id])
            ends[-1] = None
            ends.append(FinishReason.STOP)
        if i == 2:
            steps, ends = steps[:2] + [[]], [None, None, FinishReason.ABORT]
        plans.append((internal, steps, ends))
    batches = []
    for step in range(max(len(p[1]) for p in plans)):
        outputs = []
        for i, (internal, steps, ends) in enumerate(plans):
            if step >= len(steps):
                continue
            out = EngineCoreOutput(request_id=internal, new_token_ids=list(steps[step]), finish_reason=ends[step])
            if sampling.get("logprobs") is not None and steps[step]:
                out.new_logprobs = _sample_lists(rng, steps[step], sampling["logprobs"], pool)
            if step == 0:
                out.events = [EngineCoreEvent(EngineCoreEventType.QUEUED, 10.0), EngineCoreEvent(EngineCoreEventType.SCHEDULED, 10.5)]
                out.prefill_stats = PrefillStats()
                out.prefill_stats.set(num_prompt_tokens=len(prompt), num_local_cached_tokens=2 * i, num_external_cached_tokens=0)
                if sampling.get("prompt_logprobs") is not None:
                    out.new_prompt_logprobs_tensors = _prompt_tensors(rng, prompt, sampling["prompt_logprobs"], pool)
            outputs.append(out)
        batches.append((11.0 + step * 0.25, outputs))
    return batches


def _as_tuples(logprobs) -> list | None:
    if logprobs is None:
        return None
    return [(t.token_id, t.token, t.bytes, t.logprob, t.rank, _as_tuples(list(t.top))) for t in logprobs]


def _run_mixed(tokenizer, sampling: dict, batches, prompt: list[int], direct: bool) -> dict:
    """One request with `sampling` through vLLM's path or the route; everything the server reads of it."""
    import copy

    from vllm.sampling_params import RequestOutputKind
    from vllm.v1.engine.output_processor import OutputProcessor, RequestOutputCollector
    from vllm.v1.engine.parallel_sampling import ParentRequest
    from vllm.v1.metrics.stats import IterationStats

    from engine_adapter.token_bytes import TokenBytes
    from engine_adapter.vllm_stream import into_queue

    processor = OutputProcessor(tokenizer, log_stats=True)
    route = DirectRoute(processor, tokenizer)
    request = _request("m-1", prompt, "m", output_kind=RequestOutputKind.DELTA, max_tokens=64, **sampling)
    request.arrival_time = ARRIVAL
    keys = ("n", "logprobs", "prompt_logprobs", "stop", "include_stop_str_in_output")
    params = GenerationParams(max_tokens=64, **{k: v for k, v in sampling.items() if k in keys})
    stream: DeltaQueue
    if direct:
        stream, sent = route.add(request, "m", params)
        assert [r.request_id for r in sent] == [b.request_id for b in batches[0][1]]
        if "seed" in sampling:  # vLLM's own child params: a seed each
            assert [r.sampling_params.seed for r in sent] == [sampling["seed"] + i for i in range(params.n)]
        assert len({id(r) for r in sent}) == params.n and all(r.sampling_params.n == 1 for r in sent)
    else:
        token_bytes = TokenBytes(tokenizer)
        collector = RequestOutputCollector(RequestOutputKind.DELTA, "m-1")
        stream = into_queue(collector, None if params.logprobs is None else (token_bytes, params.logprobs),
                            None if params.prompt_logprobs is None else (token_bytes, params.prompt_logprobs))
        stream.prompt_tokens = len(prompt)
        if params.n == 1:
            processor.add_request(request, None, None, 0, collector)
        else:  # as AsyncLLM.add_request fans it out
            parent = ParentRequest(request)
            for index in range(params.n):
                child_id, child_params = parent.get_child_info(index)
                child = request if index == params.n - 1 else copy.copy(request)
                child.request_id, child.sampling_params = child_id, child_params
                processor.add_request(child, None, parent, index, collector)
    deltas, stats, aborts = [], [], []
    for timestamp, outputs in batches:
        iteration = IterationStats()
        iteration.iteration_timestamp = ITERATION
        result = processor.process_outputs(copy.deepcopy(outputs), timestamp, iteration)
        aborts.append(sorted(result.reqs_to_abort))
        stats.append(vars(iteration))
        try:
            got = stream.get_nowait()
        except StopAsyncIteration:
            got = None
        for d in got or []:
            deltas.append((d.index, d.text, d.num_tokens, d.finish_reason, list(d.token_ids or ()), _as_tuples(d.logprobs)))
    with pytest.raises(StopAsyncIteration):
        stream.get_nowait()
    assert not processor.request_states and len(route) == 0 and route.internal_ids == {}
    return {"deltas": deltas, "prompt_logprobs": _as_tuples(stream.prompt_logprobs), "prompt_tokens": stream.prompt_tokens,
            "cached_tokens": stream.cached_tokens, "aborts": aborts, "stats": stats}


@pytest.mark.parametrize("case", list(MIXED_CASES))
def test_n_and_logprobs_as_vllms_path(tokenizer, case):
    sampling, per_step = MIXED_CASES[case]
    prompt = tokenizer.encode("A prompt with 🎉: ", add_special_tokens=False)
    batches = _mixed_batches(tokenizer, sampling, per_step, prompt, "m-1")
    vllm_side = _run_mixed(tokenizer, sampling, batches, prompt, direct=False)
    direct = _run_mixed(tokenizer, sampling, batches, prompt, direct=True)
    for key in vllm_side:
        assert direct[key] == vllm_side[key], key
    # The oracle is not vacuous.
    deltas = vllm_side["deltas"]
    n = sampling.get("n", 1)
    assert {d[0] for d in deltas} == set(range(n)) and sum(d[3] is not None for d in deltas) == n
    finished = [f for s in vllm_side["stats"] for f in s["finished_requests"]]
    assert len(finished) == n and [p for s in vllm_side["stats"] for p in s["n_params_iter"]] == [n]
    if sampling.get("logprobs") is not None:
        entries = [e for d in deltas for e in d[5]]
        assert len(entries) == sum(d[2] for d in deltas) and all(len(e[5]) == sampling["logprobs"] for e in entries)
        if sampling["logprobs"] >= 3:
            assert any("\\x" in e[1] for e in entries) and any(any("\\x" in a[1] for a in e[5]) for e in entries)
    if sampling.get("prompt_logprobs") is not None:
        plp = vllm_side["prompt_logprobs"]
        assert len(plp) == len(prompt) and plp[0][3] is None and all(e[3] is not None and e[4] >= 1 for e in plp[1:])
    if "stop" in sampling:
        assert any(vllm_side["aborts"]) and deltas[-1][3] is not None


def _lora_states(processor) -> tuple[dict[str, int], dict[str, int]]:
    """What vLLM's processor writes into a batch's SchedulerStats (-> vllm:lora_requests_info): (waiting, running)."""
    from vllm.v1.metrics.stats import SchedulerStats

    stats = SchedulerStats()
    processor.update_scheduler_stats(stats)
    return stats.waiting_lora_adapters, stats.running_lora_adapters


@pytest.mark.parametrize("end", ["finished", "client abort", "failed"])
def test_lora_request_states_as_vllms_output_processor(tokenizer, end):
    """An adapter's requests are waiting, then running, then gone from vLLM's LoRARequestStates, batch by
    batch as for vLLM's own path (the processor's states feed vllm:lora_requests_info)."""
    from vllm.lora.request import LoRARequest
    from vllm.v1.engine import EngineCoreEvent, EngineCoreEventType, EngineCoreOutput, FinishReason
    from vllm.v1.engine.output_processor import OutputProcessor
    from vllm.v1.metrics.stats import IterationStats

    ids = tokenizer.encode(TEXT, add_special_tokens=False)

    def run(direct: bool) -> list[tuple[dict[str, int], dict[str, int]]]:
        processor = OutputProcessor(tokenizer, log_stats=True)
        route = DirectRoute(processor, tokenizer)
        for internal, name in (("a-1", "ad"), ("a-2", "ad"), ("b-1", None)):
            request = _request(internal, [1, 2, 3], internal, max_tokens=8)
            request.lora_request = LoRARequest(name, 1, "/nowhere") if name else None
            request.arrival_time = ARRIVAL
            if direct:
                route.add(request, internal, GenerationParams(max_tokens=8))
            else:
                processor.add_request(request, None)
        seen = [_lora_states(processor)]

        def step(outputs) -> None:
            route.process_outputs(outputs, 11.0, IterationStats())
            seen.append(_lora_states(processor))

        queued, scheduled = EngineCoreEventType.QUEUED, EngineCoreEventType.SCHEDULED
        # a-1 queued and scheduled at once; a-2 queued first, scheduled a step later.
        step([EngineCoreOutput(request_id="a-1", new_token_ids=ids[:1], events=[EngineCoreEvent(queued, 10.0), EngineCoreEvent(scheduled, 10.1)]),
              EngineCoreOutput(request_id="a-2", new_token_ids=[], events=[EngineCoreEvent(queued, 10.0)]),
              EngineCoreOutput(request_id="b-1", new_token_ids=ids[:1], events=[EngineCoreEvent(queued, 10.0), EngineCoreEvent(scheduled, 10.1)])])
        step([EngineCoreOutput(request_id="a-2", new_token_ids=ids[:1], events=[EngineCoreEvent(scheduled, 10.5)])])
        if end == "client abort":
            if direct:
                route.discard("a-1")
            else:
                processor.abort_requests(["a-1"], internal=True)
            step([EngineCoreOutput(request_id="a-2", new_token_ids=ids[1:2])])
        elif end == "failed":  # an output the route cannot decode ends its request; vLLM's path has no such case
            if direct:
                route.requests["a-1"].decoder = object()
                step([EngineCoreOutput(request_id="a-1", new_token_ids=ids[1:2])])
            else:
                processor.abort_requests(["a-1"], internal=True)
                step([])
        else:
            step([EngineCoreOutput(request_id="a-1", new_token_ids=ids[1:2], finish_reason=FinishReason.LENGTH)])
        step([EngineCoreOutput(request_id="a-2", new_token_ids=ids[2:3], finish_reason=FinishReason.LENGTH),
              EngineCoreOutput(request_id="b-1", new_token_ids=ids[1:2], finish_reason=FinishReason.LENGTH)])
        return seen

    direct = run(True)
    assert direct == run(False)
    # Not vacuous: the adapter went through every state, and ended in none.
    assert direct[1] == ({"ad": 1}, {"ad": 1}) and direct[2] == ({"ad": 0}, {"ad": 2})
    assert direct[3] == ({"ad": 0}, {"ad": 1}) and direct[-1] == ({}, {})


def test_a_front_end_behind_the_engine_writes_waiting_steps_at_once(tokenizer):
    """While later engine-core batches already wait (vLLM's client received them, its output handler has
    not taken them), steps after the first are held instead of pushed one write per step; the first step
    taken once current again takes them with it, and after that each step goes through the sink as it comes."""
    from vllm.v1.engine import FinishReason

    waiting = [2]
    route = DirectRoute(StandInProcessor(), tokenizer, backlog=lambda: waiting[0])
    stream = add(route, _request("b-1", [1, 2]), "b", GenerationParams(max_tokens=4))
    pushed: list[list[Delta]] = []
    assert stream.arm(keep(pushed))
    ids = tokenizer.encode(" one two three four", add_special_tokens=False)[:4]
    for step in ids[:3]:  # batches taken one after the other while later ones wait: 2, 1, then none
        route.process_outputs([_output("b-1", [step])])
        waiting[0] = max(waiting[0] - 1, 0)
    # The first output goes out at once even so (a time to first token never waits for the backlog);
    # the second is held and goes out with the third, the first step taken once current: one piece.
    assert [[d.token_ids for d in piece] for piece in pushed] == [[[ids[0]]], [[ids[1]], [ids[2]]]]
    assert stream.get_nowait() is None
    route.process_outputs([_output("b-1", [ids[3]], FinishReason.LENGTH)])
    assert [d.token_ids for d in pushed[2]] == [[ids[3]]] and pushed[2][0].finish_reason == "length"


def test_held_steps_wake_the_writer_once_the_route_is_current(tokenizer):
    """Behind the engine, a waiting writer is not woken per held step (it would write each alone): it
    sleeps while batches still wait, is woken on the first loop iteration that finds none, and takes
    every held step in one go."""
    import asyncio

    async def main() -> None:
        waiting = [2]
        route = DirectRoute(StandInProcessor(), tokenizer, backlog=lambda: waiting[0])
        stream = add(route, _request("h-1", [1, 2]), "h", GenerationParams(max_tokens=4))
        first, *ids = tokenizer.encode(" one two three", add_special_tokens=False)[:3]
        route.process_outputs([_output("h-1", [first])])  # a first output is never held
        assert [d.token_ids for d in stream.get_nowait() or []] == [[first]]
        writer = asyncio.ensure_future(stream.get())
        await asyncio.sleep(0)
        for step in ids:
            route.process_outputs([_output("h-1", [step])])
            await asyncio.sleep(0)  # vLLM's handler yields between chunks: the writer must not run
        assert not writer.done()
        waiting[0] = 0
        held = await writer
        assert [d.token_ids for d in held] == [[i] for i in ids]
        # With the writer's sink armed, the release pushes them in one piece, with no wake-up.
        pushed: list[list[Delta]] = []
        assert stream.arm(keep(pushed))
        waiting[0] = 2
        more = tokenizer.encode(" four five", add_special_tokens=False)[:2]
        for step in more:
            route.process_outputs([_output("h-1", [step])])
        await asyncio.sleep(0)
        assert pushed == []
        waiting[0] = 0
        await asyncio.sleep(0)
        assert [[d.token_ids for d in piece] for piece in pushed] == [[[i] for i in more]]

    asyncio.run(main())

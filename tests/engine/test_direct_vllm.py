"""The direct output route (engine_adapter/vllm_direct.py) against vLLM's own classes.

No engine is started here: `EngineCoreOutput`s are built by hand and fed to a
`DirectRoute` installed on a stand-in OutputProcessor, with the default
model's real tokenizer. The text must equal what vLLM's own
`FastIncrementalDetokenizer` makes of the same tokens (also for characters
split across tokens and for a stop token), other requests' outputs must reach
vLLM's processor untouched, and errors must end direct streams, never the
output handler. tests/engine/test_real_engine.py checks the same route end to
end against vLLM's path on the running engine.
"""

from __future__ import annotations

import pytest

from engine_adapter.base import Delta, EngineFailure, GenerationParams
from engine_adapter.vllm_direct import DirectRoute, eligible

pytestmark = pytest.mark.engine

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


def _output(request_id: str, ids: list[int], finish=None):
    from vllm.v1.engine import EngineCoreOutput

    return EngineCoreOutput(request_id=request_id, new_token_ids=ids, finish_reason=finish)


def _vllm_text(tokenizer, prompt_ids: list[int], steps: list[list[int]], stop_terminated_last: bool, **sampling) -> str:
    from vllm.v1.engine.detokenizer import FastIncrementalDetokenizer

    detok = FastIncrementalDetokenizer(tokenizer, _request("v", prompt_ids, **sampling))
    for i, ids in enumerate(steps):
        detok.update(list(ids), stop_terminated_last and i == len(steps) - 1)
    return detok.output_text


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
    stream = route.add(_request("r-1", prompt), "r", GenerationParams(max_tokens=len(ids)))
    for i, step in enumerate(steps):
        last = i == len(steps) - 1
        route.process_outputs([_output("r-1", step, FinishReason.LENGTH if last else None)])
    deltas = _drain(stream)
    assert "".join(d.text for d in deltas) == _vllm_text(tokenizer, prompt, steps, False) == TEXT
    assert sum(d.num_tokens for d in deltas) == len(ids)
    assert deltas[-1].finish_reason == "length" and all(d.finish_reason is None for d in deltas[:-1])
    assert len(route) == 0 and route.internal_ids == {}


@pytest.mark.parametrize("include", [False, True])
def test_stop_token_counted_not_shown_unless_asked(tokenizer, include):
    from vllm.v1.engine import FinishReason

    eos = tokenizer.eos_token_id
    ids = tokenizer.encode(" the end", add_special_tokens=False)
    route = DirectRoute(StandInProcessor(), tokenizer)
    params = GenerationParams(max_tokens=9, include_stop_str_in_output=include, skip_special_tokens=False)
    stream = route.add(_request("s-1", [1, 2]), "s", params)
    route.process_outputs([_output("s-1", ids)])
    route.process_outputs([_output("s-1", [eos], FinishReason.STOP)])
    deltas = _drain(stream)
    expected = _vllm_text(tokenizer, [1, 2], [ids, [eos]], True, include_stop_str_in_output=include, skip_special_tokens=False)
    assert "".join(d.text for d in deltas) == expected
    assert expected.endswith(tokenizer.eos_token) is include
    assert deltas[-1].finish_reason == "stop" and deltas[-1].token_ids == [eos]
    assert sum(d.num_tokens for d in deltas) == len(ids) + 1


def test_mixed_batch_other_requests_reach_vllm(tokenizer):
    vllm_side = StandInProcessor()
    route = DirectRoute(vllm_side, tokenizer)
    stream = route.add(_request("d-1", [5]), "d", GenerationParams(max_tokens=4))
    ids = tokenizer.encode(" hi", add_special_tokens=False)
    result = route.process_outputs([_output("x-1", [7]), _output("d-1", ids), _output("y-1", [8])])
    assert vllm_side.seen == [["x-1", "y-1"]]  # in order, without the direct one
    assert result.reqs_to_abort == ["from-vllm"]  # vLLM's answer, passed back as it is
    assert [d.text for d in _drain_pending(stream)] == [" hi"]
    # Only direct outputs: vLLM's processor is not called, the handler gets an empty result.
    result = route.process_outputs([_output("d-1", ids)])
    assert vllm_side.seen == [["x-1", "y-1"]] and result.request_outputs == [] and result.reqs_to_abort == []
    route.uninstall()
    assert vllm_side.process_outputs.__self__ is vllm_side


def _drain_pending(stream) -> list[Delta]:
    got = stream.get_nowait()
    assert got is not None
    return got


def test_discard_and_errors_end_direct_streams(tokenizer):
    vllm_side = StandInProcessor()
    route = DirectRoute(vllm_side, tokenizer)
    a = route.add(_request("a-1", [5]), "a", GenerationParams(max_tokens=4))
    b = route.add(_request("b-1", [5]), "b", GenerationParams(max_tokens=4))
    assert route.discard("a") == "a-1" and route.discard("a") is None
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
    bad = route.add(_request("bad-1", [5]), "bad", GenerationParams(max_tokens=4))
    good = route.add(_request("good-1", [5]), "good", GenerationParams(max_tokens=4))
    odd = route.add(_request("odd-1", [5]), "odd", GenerationParams(max_tokens=4))
    route.requests["bad-1"].decoder = object()  # its decoder breaks
    ok = tokenizer.encode(" ok", add_special_tokens=False)
    route.process_outputs([_output("bad-1", ok), _output("good-1", ok), _output("odd-1", ["not a token id"])])
    assert [d.text for d in good.get_nowait()] == [" ok"]
    with pytest.raises(EngineFailure, match="AttributeError"):
        bad.get_nowait()
    assert "bad-1" not in route.requests and "bad" not in route.internal_ids
    got = odd.get_nowait()  # an id the tokenizer cannot take decodes to nothing (as vLLM) and the stream goes on
    assert got is not None and got[0].text == "" and got[0].num_tokens == 1


def test_eligible():
    assert eligible(GenerationParams(max_tokens=1))
    assert eligible(GenerationParams(max_tokens=1, structured={"json": {}}, stop_token_ids=[3]))
    assert not eligible(GenerationParams(max_tokens=1, n=2))
    assert eligible(GenerationParams(max_tokens=1, stop=["x"]))
    assert not eligible(GenerationParams(max_tokens=1, logprobs=0))
    assert not eligible(GenerationParams(max_tokens=1, prompt_logprobs=0))  # only vLLM's OutputProcessor makes them


def test_unsupported_names_what_is_missing(monkeypatch):
    from engine_adapter import vllm_direct

    class Part:
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
    assert vllm_direct.unsupported(llm) is None
    del llm.engine_core.abort_requests_async
    assert vllm_direct.unsupported(llm) == "EngineCoreClient has no abort_requests_async"
    monkeypatch.setattr(vllm_direct, "CHECKED_VLLM", ("0.1.",))
    assert "is not a release it was checked against" in vllm_direct.unsupported(llm)


# Stop strings: the route against vLLM's own OutputProcessor, fed the same engine-core outputs.
STOP_CASES = {
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
    stream = route.add(_request("d-1", prompt, **spec), "d", params)
    d_aborted = False
    for i, step in enumerate(steps):
        result = route.process_outputs([_output("d-1", list(step), finish(i))])
        d_aborted |= "d-1" in result.reqs_to_abort
    deltas = _drain(stream)
    assert "".join(d.text for d in deltas) == v_text
    assert [t for d in deltas for t in d.token_ids] == v_ids
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
    stream = route.add(_request("f-1", [5]), "f", GenerationParams(max_tokens=4))
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
            route.add(request, external, GenerationParams(max_tokens=16, stop=stop or []))
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
    route.add(request, "d", GenerationParams(max_tokens=8))
    stats = IterationStats()
    route.process_outputs([EngineCoreOutput(request_id="d-1", new_token_ids=[7])], 11.0, stats)
    assert stats.num_generation_tokens == 1 and len(stats.time_to_first_tokens_iter) == 1
    assert route.discard("d") == "d-1"
    stats = IterationStats()
    route.process_outputs([EngineCoreOutput(request_id="d-1", new_token_ids=[8])], 11.5, stats)  # already in flight
    assert stats.finished_requests == [] and stats.num_generation_tokens == 0 and stats.n_params_iter == []


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

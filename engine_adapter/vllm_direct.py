"""A short path from vLLM's engine core to our streams, for every untraced generation request.

`DirectRoute` wraps the `OutputProcessor`'s `process_outputs` and `propagate_error`: per output one dict
lookup, one `DecodeStream.step` per new token and one `DeltaQueue.put`, which, while the client keeps
up, writes the frame from this very call; no `RequestOutput`. `n > 1` fans out as vLLM does
(`ParentRequest`, children `{index}_{id}` sharing one stream); logprobs are read from the engine core's
arrays (`vllm_logprobs`); stop strings use vLLM's own incremental detokenizer and abort through
`reqs_to_abort`. Other outputs (embeddings, traced requests) still take vLLM's path. Engine-wide
conditions are checked once at start (`unsupported`).

Output matches vLLM's path token for token (tests/engine/test_direct_vllm.py), and so do the `vllm:*`
metrics: each request fills vLLM's `RequestStateStats`, `IterationStats` and `LoRARequestStates` as
the processor does (the per-token decode case inline); a request we abort is not a finished one. Not
mirrored: `--stream-interval`, tracing spans, `check_admission`.
"""

from __future__ import annotations

import asyncio
import copy
import logging
from collections.abc import Callable
from time import perf_counter
from typing import Any

from prometheus_client import Counter

from .base import Delta, DeltaQueue, EngineFailure, GenerationParams
from .token_bytes import TokenBytes
from .vllm_compat import direct_route_gate, output_error
from .vllm_logprobs import LogprobTokens, prompt_logprobs, sample_logprobs

log = logging.getLogger("streamproxy.engine.vllm")

# Which route a request took shows nowhere else (vLLM's series count both alike).
DIRECT_REQUESTS = Counter(
    "streamproxy_direct_requests",
    "Requests whose outputs took the direct route from vLLM's engine core; the rest took vLLM's OutputProcessor",
)

# The longest a held step waits for the route to be current (a front end that never catches up still writes).
HOLD_BOUND = 0.05

# FinishReason (an IntEnum) -> its API string, by value.
_FINISH = ("stop", "length", "abort", "error", "repetition")
_STOP = 0


def unsupported(llm: Any) -> str | None:
    """Why the direct route cannot be used with this engine (None: it can)."""
    import inspect

    # Only on the releases whose AsyncLLM internals it was checked against (tests/engine/test_direct_vllm.py,
    # test_real_engine.py, and `make check-vllm` for those without a CPU build): were vLLM's output handler to
    # stop calling `process_outputs`, a direct request would wait forever.
    gate = direct_route_gate()
    if gate is not None:
        return gate
    needed = {
        "AsyncLLM": (llm, ("_run_output_handler", "check_admission", "output_processor", "input_processor", "engine_core")),
        "OutputProcessor": (getattr(llm, "output_processor", None), ("process_outputs", "propagate_error")),
        "InputProcessor": (getattr(llm, "input_processor", None), ("process_inputs", "assign_request_id")),
        "EngineCoreClient": (getattr(llm, "engine_core", None), ("add_request_async", "abort_requests_async")),
    }
    for owner, (obj, names) in needed.items():
        missing = [n for n in names if not hasattr(obj, n)]
        if missing:
            return f"{owner} has no {', '.join(missing)}"
    params = list(inspect.signature(llm.output_processor.process_outputs).parameters)
    if params[:3] != ["engine_core_outputs", "engine_core_timestamp", "iteration_stats"]:
        return f"OutputProcessor.process_outputs takes {params}"
    return None


class DirectRequest:
    """One direct request (or one child of an n > 1 request): its stream, its choice index, its
    decoder, what the first output sets, and vLLM's stats."""

    __slots__ = ("stream", "index", "decoder", "stop_detokenizer", "external_id", "prefilling", "include_stop",
                 "skip_special", "stats", "max_tokens", "lora_name", "parent", "top", "prompt_top", "prompt_ids",
                 "cached")

    def __init__(self, stream: DeltaQueue, decoder: Any, external_id: str, params: GenerationParams,
                 stop_detokenizer: Any = None, stats: Any = None, max_tokens: int | None = None,
                 lora_name: str | None = None, index: int = 0, parent: Any = None) -> None:
        self.stream = stream
        self.index = index  # the choice index
        self.decoder = decoder  # a DecodeStream; None with stop strings
        self.stop_detokenizer = stop_detokenizer  # vLLM's incremental detokenizer, with stop strings
        self.external_id = external_id
        self.prefilling = True
        self.include_stop = params.include_stop_str_in_output
        self.skip_special = params.skip_special_tokens
        self.stats = stats  # vLLM's RequestStateStats (None when vLLM logs no stats)
        self.max_tokens = max_tokens  # the request's SamplingParams.max_tokens, for vLLM's histogram
        self.lora_name = lora_name
        self.parent = parent  # vLLM's ParentRequest when n > 1 (its child_requests: the children still running)
        self.top = params.logprobs  # sampled tokens' top logprobs (None: none asked)
        self.prompt_top = params.prompt_logprobs
        self.prompt_ids: list[int] | None = None  # kept only for prompt logprobs
        self.cached = 0  # prompt tokens the engine core found cached


def _no_backlog() -> int:
    return 0


def outputs_waiting(engine_core: Any) -> Callable[[], int]:
    """How many engine-core output batches vLLM's client has received and its output handler has not
    taken yet: the size of `AsyncMPClient.outputs_queue` (an asyncio.Queue its socket task fills,
    draining every message the socket holds at once; made on the first output). 0 without one."""

    def waiting() -> int:
        queue = getattr(engine_core, "outputs_queue", None)
        return queue.qsize() if queue is not None else 0

    return waiting


class DirectRoute:
    """Serves direct requests' outputs in vLLM's output-handler task; passes the rest on."""

    def __init__(self, output_processor: Any, tokenizer: Any, token_bytes: Callable[[int], bytes] | None = None,
                 backlog: Callable[[], int] | None = None) -> None:
        import tokenizers
        from vllm import envs
        from vllm.v1.engine import FinishReason
        from vllm.v1.engine.detokenizer import FastIncrementalDetokenizer
        from vllm.v1.engine.output_processor import OutputProcessorOutput
        from vllm.v1.engine.parallel_sampling import ParentRequest
        from vllm.v1.metrics.stats import LoRARequestStates, RequestStateStats

        assert tuple(str(FinishReason(i)) for i in range(len(_FINISH))) == _FINISH, "vLLM's FinishReason changed"
        self._reasons = tuple(FinishReason(i) for i in range(len(_FINISH)))
        self._processor = output_processor
        # vLLM's per-request stats, kept as its OutputProcessor keeps them (see the module's comment).
        self._log_stats = bool(getattr(output_processor, "log_stats", False))
        self._request_stats = RequestStateStats
        self._lora_states = getattr(output_processor, "lora_states", None) or LoRARequestStates(False)
        self._parent = ParentRequest
        self._observe_finished = ParentRequest.observe_finished_request
        # With NaN counting on, every output takes vLLM's own update (it checks each one).
        self._all_outputs_by_vllm = bool(envs.VLLM_COMPUTE_NANS_IN_LOGITS)
        self._tokenizer = tokenizer
        self._stop_detokenizer = FastIncrementalDetokenizer
        self._rust_tokenizer = tokenizer._tokenizer
        self._decode_stream = tokenizers.decoders.DecodeStream
        self._result = OutputProcessorOutput
        # Logprobs' token strings, from the vocabulary as on vLLM's path (vllm_stream); made on first use.
        self._token_bytes = token_bytes
        # How many engine-core batches are already waiting behind the one being processed (see `process_outputs`).
        self._backlog = backlog or _no_backlog
        self._logprob_tokens: LogprobTokens | None = None
        # Streams with held steps, and the callback that releases them once the route is current.
        self._held: list[DeltaQueue] = []
        self._release: asyncio.Handle | None = None
        self._held_since = 0.0
        self._calls = self._calls_seen = 0  # process_outputs calls, and as many as the release last saw
        self.requests: dict[str, DirectRequest] = {}  # by vLLM's internal request id (a child's, when n > 1)
        self.internal_ids: dict[str, list[str]] = {}  # external (ours) -> internal (the children's, when n > 1)
        self._vllm_process_outputs = output_processor.process_outputs
        self._vllm_propagate_error = output_processor.propagate_error
        output_processor.process_outputs = self.process_outputs
        output_processor.propagate_error = self.propagate_error

    def uninstall(self) -> None:
        processor = self._processor
        processor.process_outputs = self._vllm_process_outputs
        processor.propagate_error = self._vllm_propagate_error

    def __len__(self) -> int:
        return len(self.requests)

    # -- requests ---------------------------------------------------------
    def add(self, request: Any, external_id: str, params: GenerationParams) -> tuple[DeltaQueue, list[Any]]:
        """Register an `EngineCoreRequest` (before it is sent to the engine core): its stream and the
        engine-core requests to send, the request itself or, when n > 1, its children (as AsyncLLM.add_request)."""
        stream = DeltaQueue()
        stream.prompt_tokens = len(request.prompt_token_ids)
        sampling = request.sampling_params
        if sampling.n == 1:
            children = [(request, None)]
        else:
            parent = self._parent(request)
            children = []
            for index in range(sampling.n):
                child_id, child_params = parent.get_child_info(index)
                child = request if index == sampling.n - 1 else copy.copy(request)
                child.request_id = child_id
                child.sampling_params = child_params
                children.append((child, parent))
        if (params.logprobs is not None or params.prompt_logprobs is not None) and self._logprob_tokens is None:
            self._logprob_tokens = LogprobTokens(self._token_bytes or TokenBytes(self._tokenizer))
        for index, (child, parent) in enumerate(children):
            self.requests[child.request_id] = self._direct_request(child, stream, external_id, params, index, parent)
        self.internal_ids[external_id] = [child.request_id for child, _ in children]
        DIRECT_REQUESTS.inc()
        return stream, [child for child, _ in children]

    def _direct_request(self, request: Any, stream: DeltaQueue, external_id: str, params: GenerationParams,
                        index: int, parent: Any) -> DirectRequest:
        stats = self._request_stats(arrival_time=request.arrival_time) if self._log_stats else None
        lora = request.lora_request
        extra = (stats, request.sampling_params.max_tokens, lora.lora_name if lora is not None else None, index, parent)
        if params.stop:
            req = DirectRequest(stream, None, external_id, params, self._stop_detokenizer(self._tokenizer, request), *extra)
        else:
            decoder = self._decode_stream(ids=request.prompt_token_ids, skip_special_tokens=params.skip_special_tokens)
            req = DirectRequest(stream, decoder, external_id, params, None, *extra)
        if params.prompt_logprobs is not None:
            req.prompt_ids = request.prompt_token_ids
        return req

    def discard(self, external_id: str) -> list[str] | None:
        """Forget a request (aborted by us); the internal ids to abort in the engine core (its children still
        running, when n > 1), None when it is not a direct request (or no longer one)."""
        internals = self.internal_ids.pop(external_id, None)
        if internals is None:
            return None
        running = []
        for internal in internals:
            req = self.requests.pop(internal, None)
            if req is not None:
                running.append(internal)
                self._lora_states.request_finished(internal, req.lora_name)  # as vLLM's abort_requests
                req.stream.close()
        return running

    def fail_all(self, error: BaseException) -> None:
        if self._release is not None:
            self._release.cancel()
            self._release = None
        self._held = []
        requests, self.requests = self.requests, {}
        self.internal_ids = {}
        for req in requests.values():
            req.stream.close(error)

    # -- vLLM's output handler calls these ----------------------------------
    def propagate_error(self, e: Exception) -> None:
        self._vllm_propagate_error(e)
        self.fail_all(EngineFailure(f"{type(e).__name__}: {e}"))

    def process_outputs(self, engine_core_outputs: list[Any], engine_core_timestamp: float | None = None,
                        iteration_stats: Any = None, weight_version: str | None = None) -> Any:
        requests = self.requests
        if not requests:
            return self._vllm_process_outputs(engine_core_outputs, engine_core_timestamp, iteration_stats, weight_version=weight_version)
        rest = []
        aborts: list[str] = []  # stopped on a stop string while the engine core goes on
        # vLLM's stats for this batch (the handler makes them only when vLLM logs stats), filled per output.
        stats = iteration_stats if self._log_stats else None
        timestamp = 0.0 if engine_core_timestamp is None else engine_core_timestamp
        # The front end is behind the engine (later batches already received): hold this step and hand
        # it on only once the route is current again (the stream's next put, or `_release_when_current`),
        # so one write carries every step that came meanwhile, as vLLM's collectors merge them, through
        # the armed sink (no wake-up). Woken at once, the writers ran between vLLM's 128-output chunks and
        # wrote each step alone, through the pull path. Current, it writes each step from here as before.
        self._calls += 1
        holding = self._backlog() > 0
        if holding and self._release is None:
            self._held_since = perf_counter()
            self._schedule_release()
        by_vllm = self._all_outputs_by_vllm
        rust = self._rust_tokenizer
        for output in engine_core_outputs:
            req = requests.get(output.request_id)
            if req is None:
                rest.append(output)
                continue
            if output.finish_reason is not None and (error := output_error(output)) is not None:
                self._reject(req, output.request_id, error, aborts)
                continue
            try:
                ids = output.new_token_ids
                # Most outputs, inline: one decoded token of a running request (no stop strings, no
                # logprobs, no events for vLLM's stats), what `_count`, `_text` and `_step` do for it.
                if (output.finish_reason is None and len(ids) == 1 and not req.prefilling and req.top is None
                        and (decoder := req.decoder) is not None and output.events is None and not by_vllm):
                    if stats is not None:
                        rs = req.stats
                        stats.num_generation_tokens += 1
                        rs.num_generation_tokens += 1
                        stats.inter_token_latencies_iter.append(timestamp - rs.last_token_ts)
                        rs.last_token_ts = timestamp
                    try:
                        text = decoder.step(rust, ids[0]) or ""
                    except Exception as exc:
                        text = self._step_failed(req, ids[0], exc)
                    if holding:
                        req.stream.hold([Delta(req.index, text, 1, None, ids)])
                        self._held.append(req.stream)
                    else:
                        req.stream.put([Delta(req.index, text, 1, None, ids)])
                    continue
                # A request's first output is never held: its time to first token does not wait for the backlog.
                held = holding and not req.prefilling
                if stats is not None:
                    self._count(req, output, timestamp, stats)
                elif req.prefilling:
                    self._first_output(req, output)
                if req.stop_detokenizer is None:
                    text, ids, reason = self._text(req, output)
                else:
                    text, ids, reason = self._text_with_stop_strings(req, output, aborts)
                logprobs = None
                if req.top is not None:
                    assert self._logprob_tokens is not None
                    logprobs = sample_logprobs(ids, output.new_logprobs, req.top, self._logprob_tokens)
                if reason is None:
                    if held:
                        req.stream.hold([Delta(req.index, text, len(ids), None, ids, logprobs)])
                        self._held.append(req.stream)
                    else:
                        req.stream.put([Delta(req.index, text, len(ids), None, ids, logprobs)])
                    continue
                last = self._forget(output.request_id, req)
                if stats is not None:
                    self._count_finished(req, output.request_id, reason, stats)
                req.stream.cached_tokens = req.cached  # the last choice's, as vLLM's last RequestOutput
                if held:
                    req.stream.hold([Delta(req.index, text, len(ids), _FINISH[reason], ids, logprobs)])
                else:
                    req.stream.put([Delta(req.index, text, len(ids), _FINISH[reason], ids, logprobs)])
                if last:
                    req.stream.close()
                elif held:
                    self._held.append(req.stream)
            except Exception as exc:  # never into vLLM's output handler
                log.exception("direct output of request %s failed", req.external_id)
                running = self.discard(req.external_id) or []  # the whole request ends, every choice
                req.stream.close(EngineFailure(f"{type(exc).__name__}: {exc}"))
                aborts.extend(i for i in running if i != output.request_id)
                if output.finish_reason is None and output.request_id not in aborts:
                    aborts.append(output.request_id)
        if rest:
            result = self._vllm_process_outputs(rest, engine_core_timestamp, iteration_stats, weight_version=weight_version)
            result.reqs_to_abort.extend(aborts)
            return result
        return self._result(request_outputs=[], reqs_to_abort=aborts)

    def _schedule_release(self) -> None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:  # called outside a loop (tests): released when a call finds the route current
            return
        self._release = loop.call_soon(self._release_when_current)

    def _release_when_current(self) -> None:
        """Once per loop iteration while steps are held: hand them on when vLLM's output handler is idle
        (no batch waits, and no chunk was processed since the last look: a batch's chunks come one loop
        iteration apart, and its next step for each stream takes the held ones with it), or once they
        have waited HOLD_BOUND seconds."""
        self._release = None
        calls = self._calls
        if (self._backlog() or calls != self._calls_seen) and perf_counter() - self._held_since < HOLD_BOUND:
            self._calls_seen = calls
            self._schedule_release()
            return
        self._release_held()

    def _release_held(self) -> None:
        held, self._held = self._held, []
        for stream in held:
            stream.release()

    def _reject(self, req: DirectRequest, internal_id: str, error: Exception, aborts: list[str]) -> None:
        """The engine core refused the request on arrival (its output's `error`; nothing ran): the
        stream ends with that error, and the request's other choices are aborted (as vLLM's
        processor puts the error in the request's queue and forgets it, without stats)."""
        req.stream.close(error)
        running = self.discard(req.external_id) or []
        aborts.extend(i for i in running if i != internal_id)

    def _forget(self, internal_id: str, req: DirectRequest) -> bool:
        """A finished request (or child) leaves; True when it was its request's last."""
        self.requests.pop(internal_id, None)
        parent = req.parent
        if parent is not None:
            parent.child_requests.discard(internal_id)  # before vLLM's stats read it (as get_outputs)
            if parent.child_requests:
                return False
        self.internal_ids.pop(req.external_id, None)
        return True

    def _first_output(self, req: DirectRequest, output: Any) -> None:
        """The cached prompt tokens and the prompt's logprobs, from the first output."""
        req.prefilling = False
        prefill = output.prefill_stats
        if prefill is not None:
            req.cached = req.stream.cached_tokens = prefill.num_cached_tokens
        if req.prompt_ids is not None and req.stream.prompt_logprobs is None:  # the first choice's (as vllm_stream)
            assert self._logprob_tokens is not None
            req.stream.prompt_logprobs = prompt_logprobs(req.prompt_ids, output.new_prompt_logprobs_tensors,
                                                         req.prompt_top or 0, self._logprob_tokens)

    def _count(self, req: DirectRequest, output: Any, timestamp: float, stats: Any) -> None:
        """One output into vLLM's IterationStats and the request's RequestStateStats, as vLLM's processor."""
        rs = req.stats
        if req.prefilling or output.events is not None or self._all_outputs_by_vllm:
            stats.update_from_output(output, timestamp, req.prefilling, rs, self._lora_states, req.lora_name)
            if req.prefilling:
                self._first_output(req, output)
            return
        # A decode step without events: what update_from_output does for it.
        n = len(output.new_token_ids)
        stats.num_generation_tokens += n
        rs.num_generation_tokens += n
        stats.inter_token_latencies_iter.append(timestamp - rs.last_token_ts)
        rs.last_token_ts = timestamp

    def _count_finished(self, req: DirectRequest, internal_id: str, reason: int, stats: Any) -> None:
        """The finished request into vLLM's IterationStats, as OutputProcessor._update_stats_from_finished."""
        rs = req.stats
        stats.update_from_finished_request(
            finish_reason=self._reasons[reason],
            request_id=req.external_id,
            num_prompt_tokens=req.stream.prompt_tokens,
            max_tokens_param=req.max_tokens,
            req_stats=rs,
            num_cached_tokens=req.cached,
        )
        self._lora_states.request_finished(internal_id, req.lora_name)
        self._observe_finished(req.parent, stats, rs.num_generation_tokens)

    def _text(self, req: DirectRequest, output: Any) -> tuple[str, list[int], int | None]:
        """The step's text by the bare DecodeStream; its token ids and finish reason as they came."""
        ids = output.new_token_ids
        reason = output.finish_reason
        decode = ids
        if reason == _STOP and ids and not req.include_stop:
            decode = ids[:-1]  # the EOS / stop token is counted, not shown (as vLLM)
        if len(decode) == 1:
            return self._step(req, decode[0]), ids, reason
        return "".join([self._step(req, token) for token in decode]), ids, reason

    @staticmethod
    def _text_with_stop_strings(req: DirectRequest, output: Any, aborts: list[str]) -> tuple[str, list[int], int | None]:
        """The same through vLLM's own detokenizer: what OutputProcessor.process_outputs does for text."""
        ids = output.new_token_ids
        reason = output.finish_reason
        detok = req.stop_detokenizer
        before = detok.num_output_tokens()
        if detok.update(ids, reason == _STOP):  # a stop string: the output ends here
            if reason is None:
                aborts.append(output.request_id)  # the engine core would go on
            reason = _STOP
        kept = detok.num_output_tokens() - before  # tokens past the stop string are dropped (as vLLM)
        if kept < len(ids):
            ids = ids[:kept]
        return detok.get_next_output_text(reason is not None, True), ids, reason

    def _step(self, req: DirectRequest, token: int) -> str:
        try:
            return req.decoder.step(self._rust_tokenizer, token) or ""
        except Exception as exc:
            return self._step_failed(req, token, exc)

    def _step_failed(self, req: DirectRequest, token: int, exc: Exception) -> str:
        """What a failed `DecodeStream.step` of `token` gives (or raises), as vLLM's detokenizer."""
        if isinstance(exc, (OverflowError, TypeError)):  # as vLLM: a token id the tokenizer cannot take
            log.warning("invalid token id %r in request %s", token, req.external_id)
            return ""
        # As vLLM: a tokenizer that produced a non-monotonic UTF-8 prefix breaks the
        # stream's state; start a fresh one (vllm-project/vllm#17448).
        if not str(exc).startswith("Invalid prefix encountered"):
            raise exc
        req.decoder = self._decode_stream(skip_special_tokens=req.skip_special)
        return req.decoder.step(self._rust_tokenizer, token) or ""

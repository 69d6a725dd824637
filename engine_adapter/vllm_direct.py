"""A short path from vLLM's engine core to our streams, for the common request.

vLLM's `OutputProcessor` builds a `CompletionOutput` and a `RequestOutput`
per request and step, keeps stats and the whole text, and puts it in a
collector that we then turn into `Delta`s. `DirectRoute` takes the outputs
of the requests that need none of that (one choice, no logprobs or prompt
logprobs, a fast tokenizer; see `eligible`): installed on the engine's `OutputProcessor`
instance (its `process_outputs` and `propagate_error` wrapped), per output
it does one dict lookup, one `DecodeStream.step` per new token (primed with
the prompt, as vLLM's detokenizer is) and one `DeltaQueue.put([Delta])`,
which, while the client keeps up, writes the frame from this very call.
Requests with stop strings use vLLM's own incremental detokenizer (its
stop-string search, hold-back, truncation, `min_tokens` and surplus-token
trimming, unchanged), and a stop string it finds is aborted in the engine
core through `reqs_to_abort`, as vLLM's processor does. Every other request
still takes vLLM's path; both share one engine-core client and output task.

Same text as vLLM's path, token for token (tests/engine/test_direct_vllm.py).

Same `vllm:*` metrics too: vLLM's output handler makes one `IterationStats`
per engine-core batch, hands it to `process_outputs` and then to its stat
loggers (Prometheus among them); each direct request keeps vLLM's
`RequestStateStats` and fills that same object as vLLM's processor does
(`IterationStats.update_from_output` on a request's first output and on any
output with engine-core events, `update_from_finished_request` and
`ParentRequest.observe_finished_request` at its end). A decode output without
events, the per-token case, gets the same three updates inline (token counts,
one inter-token latency, the last token's time) instead of the method call.
A request we abort (client gone) is not a finished request, as in vLLM
(`OutputProcessor.abort_requests` records none); an abort the engine core
reports (`FinishReason.ABORT`) is. The adapter of a LoRA request is counted
in vLLM's own `LoRARequestStates` (the processor's `lora_states`: waiting and
running from the engine core's events, forgotten when the request finishes,
is aborted or fails), which feed `vllm:lora_requests_info` as for vLLM's
path. Not mirrored: vLLM's tracing spans and its admission count of
unfinished requests (`check_admission`).
"""

from __future__ import annotations

import logging
from typing import Any

from prometheus_client import Counter

from .base import Delta, DeltaQueue, EngineFailure, GenerationParams

log = logging.getLogger("streamproxy.engine.vllm")

# Which route a request took shows nowhere else (vLLM's series count both alike).
DIRECT_REQUESTS = Counter(
    "streamproxy_direct_requests",
    "Requests whose outputs took the direct route from vLLM's engine core; the rest took vLLM's OutputProcessor",
)

# The vLLM releases whose AsyncLLM internals this module was checked against
# (tests/engine/test_direct_vllm.py and the end-to-end test in test_real_engine.py).
# On any other release the route stays off: were vLLM's output handler to stop
# calling `process_outputs`, a direct request would wait forever.
CHECKED_VLLM = ("0.32.",)

# FinishReason (an IntEnum) -> its API string, by value.
_FINISH = ("stop", "length", "abort", "error", "repetition")
_STOP = 0


def unsupported(llm: Any) -> str | None:
    """Why the direct route cannot be used with this engine (None: it can)."""
    import inspect

    import vllm

    if not vllm.__version__.startswith(CHECKED_VLLM):
        return f"vLLM {vllm.__version__} is not a release it was checked against ({', '.join(CHECKED_VLLM)}x)"
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


def eligible(params: GenerationParams) -> bool:
    """Requests the direct route can serve with output identical to vLLM's own path
    (prompt logprobs come from vLLM's OutputProcessor: those requests take its path)."""
    return params.n == 1 and params.logprobs is None and params.prompt_logprobs is None


class DirectRequest:
    """One direct request: its stream, its decoder, what the first output sets, and vLLM's stats."""

    __slots__ = ("stream", "decoder", "stop_detokenizer", "external_id", "prefilling", "include_stop", "skip_special",
                 "stats", "max_tokens", "lora_name")

    def __init__(self, stream: DeltaQueue, decoder: Any, external_id: str, params: GenerationParams,
                 stop_detokenizer: Any = None, stats: Any = None, max_tokens: int | None = None,
                 lora_name: str | None = None) -> None:
        self.stream = stream
        self.decoder = decoder  # a DecodeStream; None with stop strings
        self.stop_detokenizer = stop_detokenizer  # vLLM's incremental detokenizer, with stop strings
        self.external_id = external_id
        self.prefilling = True
        self.include_stop = params.include_stop_str_in_output
        self.skip_special = params.skip_special_tokens
        self.stats = stats  # vLLM's RequestStateStats (None when vLLM logs no stats)
        self.max_tokens = max_tokens  # the request's SamplingParams.max_tokens, for vLLM's histogram
        self.lora_name = lora_name


class DirectRoute:
    """Serves direct requests' outputs in vLLM's output-handler task; passes the rest on."""

    def __init__(self, output_processor: Any, tokenizer: Any) -> None:
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
        self._observe_finished = ParentRequest.observe_finished_request
        # With NaN counting on, every output takes vLLM's own update (it checks each one).
        self._all_outputs_by_vllm = bool(envs.VLLM_COMPUTE_NANS_IN_LOGITS)
        self._tokenizer = tokenizer
        self._stop_detokenizer = FastIncrementalDetokenizer
        self._rust_tokenizer = tokenizer._tokenizer
        self._decode_stream = tokenizers.decoders.DecodeStream
        self._result = OutputProcessorOutput
        self.requests: dict[str, DirectRequest] = {}  # by vLLM's internal request id
        self.internal_ids: dict[str, str] = {}  # external (ours) -> internal
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
    def add(self, request: Any, external_id: str, params: GenerationParams) -> DeltaQueue:
        """Register an `EngineCoreRequest` (before it is sent to the engine core)."""
        stream = DeltaQueue()
        stream.prompt_tokens = len(request.prompt_token_ids)
        stats = self._request_stats(arrival_time=request.arrival_time) if self._log_stats else None
        lora = request.lora_request
        extra = (stats, request.sampling_params.max_tokens, lora.lora_name if lora is not None else None)
        if params.stop:
            req = DirectRequest(stream, None, external_id, params, self._stop_detokenizer(self._tokenizer, request), *extra)
        else:
            decoder = self._decode_stream(ids=request.prompt_token_ids, skip_special_tokens=params.skip_special_tokens)
            req = DirectRequest(stream, decoder, external_id, params, None, *extra)
        self.requests[request.request_id] = req
        self.internal_ids[external_id] = request.request_id
        DIRECT_REQUESTS.inc()
        return stream

    def discard(self, external_id: str) -> str | None:
        """Forget a request (aborted by us); its internal id, to abort in the engine core."""
        internal = self.internal_ids.pop(external_id, None)
        if internal is not None:
            req = self.requests.pop(internal, None)
            if req is not None:
                self._lora_states.request_finished(internal, req.lora_name)  # as vLLM's abort_requests
                req.stream.close()
        return internal

    def fail_all(self, error: BaseException) -> None:
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
        for output in engine_core_outputs:
            req = requests.get(output.request_id)
            if req is None:
                rest.append(output)
                continue
            try:
                if stats is not None:
                    self._count(req, output, timestamp, stats)
                elif req.prefilling:
                    self._first_output(req, output)
                if req.stop_detokenizer is None:
                    text, ids, reason = self._text(req, output)
                else:
                    text, ids, reason = self._text_with_stop_strings(req, output, aborts)
                if reason is not None and stats is not None:
                    self._count_finished(req, output.request_id, reason, stats)
                self._emit(req, output.request_id, text, ids, reason)
            except Exception as exc:  # never into vLLM's output handler
                log.exception("direct output of request %s failed", req.external_id)
                self._forget(output.request_id, req)
                self._lora_states.request_finished(output.request_id, req.lora_name)  # no longer running
                req.stream.close(EngineFailure(f"{type(exc).__name__}: {exc}"))
                if output.finish_reason is None:
                    aborts.append(output.request_id)
        if rest:
            result = self._vllm_process_outputs(rest, engine_core_timestamp, iteration_stats, weight_version=weight_version)
            result.reqs_to_abort.extend(aborts)
            return result
        return self._result(request_outputs=[], reqs_to_abort=aborts)

    def _forget(self, internal_id: str, req: DirectRequest) -> None:
        self.requests.pop(internal_id, None)
        self.internal_ids.pop(req.external_id, None)

    @staticmethod
    def _first_output(req: DirectRequest, output: Any) -> None:
        """The cached prompt tokens, from the first output."""
        req.prefilling = False
        prefill = output.prefill_stats
        if prefill is not None:
            req.stream.cached_tokens = prefill.num_cached_tokens

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
            num_cached_tokens=req.stream.cached_tokens,
        )
        self._lora_states.request_finished(internal_id, req.lora_name)
        self._observe_finished(None, stats, rs.num_generation_tokens)  # one choice: n = 1

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

    def _emit(self, req: DirectRequest, internal_id: str, text: str, ids: list[int], reason: int | None) -> None:
        if reason is None:
            req.stream.put([Delta(0, text, len(ids), None, ids)])
            return
        self._forget(internal_id, req)
        req.stream.put([Delta(0, text, len(ids), _FINISH[reason], ids)])
        req.stream.close()

    def _step(self, req: DirectRequest, token: int) -> str:
        try:
            return req.decoder.step(self._rust_tokenizer, token) or ""
        except (OverflowError, TypeError):  # as vLLM: a token id the tokenizer cannot take
            log.warning("invalid token id %r in request %s", token, req.external_id)
            return ""
        except Exception as exc:
            # As vLLM: a tokenizer that produced a non-monotonic UTF-8 prefix breaks the
            # stream's state; start a fresh one (vllm-project/vllm#17448).
            if not str(exc).startswith("Invalid prefix encountered"):
                raise
            req.decoder = self._decode_stream(skip_special_tokens=req.skip_special)
            return req.decoder.step(self._rust_tokenizer, token) or ""

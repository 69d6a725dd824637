"""vLLM's `AsyncLLM`, in-process, behind the engine contract.

vLLM is imported lazily in `start`, which builds the engine from vLLM's `AsyncEngineArgs` in a daemon
thread (spawned.py) so the loop keeps answering while weights load; `close()` during it aborts the start
within `ABORT_BOUND` s by killing every process started since. Requests go in as token ids with
`RequestOutputKind.DELTA` (their `SamplingParams` from vllm_params.SamplingBuilder; vLLM's EOS-id
read made cheap once it is up, vllm_reads.py); vLLM's collector feeds a `DeltaQueue` (`vllm_stream.into_queue`), or, for
every untraced generation request, `vllm_direct.DirectRoute` skips the OutputProcessor
(`--no-direct-outputs`, or an unchecked vLLM release, turns it off). Structured outputs and their
compile errors (`EngineRejected`) translate in vllm_params.py; LoRA goes in as `LoRARequest` on both
paths. With `client=(index, count, config)` (`--api-server-count`) the engine cores belong to the
parent (vllm_shared.py). `close()` kills whatever engine-core or worker process outlives vLLM's
shutdown: an orphaned worker spins at full CPU with the weights still mapped.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any

from . import spawned, vllm_parsers
from .base import (
    Adapter,
    DeltaQueue,
    EngineFailure,
    EngineRejected,
    EngineState,
    GenerationParams,
    ModelInfo,
    OutputStream,
)
from .fast_encode import Encode, fast_encoder
from .first_call import first_call
from .token_bytes import TokenBytes
from .vllm_compat import engine_exception
from .vllm_direct import DirectRoute, outputs_waiting, unsupported
from .vllm_itl import batch_inter_token_latencies
from .vllm_params import SamplingBuilder, eos_ids, lora_request, rejected
from .vllm_reads import cheap_eos_id
from .vllm_stream import into_queue

log = logging.getLogger("streamproxy.engine.vllm")

# Seconds `close()` keeps killing what an aborted start starts, waiting for its thread to end.
ABORT_BOUND = 15.0

class VllmEngine:
    def __init__(self, engine_args: Any, served_names: list[str], root: str, *, direct_outputs: bool = True,
                 client: tuple[int, int, dict[str, Any]] | None = None) -> None:
        vllm_parsers.add()  # vLLM's parser names join ours (no vLLM import yet)
        self._args = engine_args
        # (index, count, client config): one of `count` API servers sharing engine cores started by
        # the parent (vllm_shared.py), as vLLM's own API servers do; None: this process starts its own.
        self._client = client
        self._llm: Any = None
        # Plain requests' outputs straight from the engine core (vllm_direct.py), when possible.
        self._want_direct = direct_outputs
        self._direct: DirectRoute | None = None
        self._supported_tasks: Any = None
        self._tokenizer: Any = None
        self._encode: Encode | None = None  # the tokenizer's Rust fast path (fast_encode.py), when it has one
        self._token_bytes: TokenBytes | None = None
        self._sampling = SamplingBuilder()  # GenerationParams -> vLLM's SamplingParams (its EOS ids once up)
        self._state: EngineState = "loading"
        self._processes: list[Any] = []  # psutil handles of the processes the engine started
        # While `start()` runs: its thread's future, the processes since it began, and the abort flag.
        self._starting: tuple[Any, spawned.Spawned] | None = None
        self._aborted = threading.Event()
        # Filled in properly once the engine is up.
        self.info = ModelInfo(name=served_names[0], served_names=served_names, root=root, max_model_len=0, created=int(time.time()))

    @property
    def state(self) -> EngineState:
        if self._state == "ready" and self._llm.errored:
            return "dead"
        return self._state

    async def start(self) -> None:
        processes = spawned.Spawned()
        future = spawned.in_thread(self._build, "vllm-engine-start")
        self._starting = (future, processes)
        try:
            self._llm = await asyncio.wrap_future(future)
        except BaseException:
            self._state = "dead"
            raise
        self._starting = None
        self._processes = processes.processes()
        self._tokenizer = self._llm.get_tokenizer()
        self._encode = fast_encoder(self._tokenizer)
        cheap_eos_id(self._tokenizer)  # vLLM's input processor reads it per request (vllm_reads.py)
        self._sampling = SamplingBuilder(eos_ids(self._tokenizer, self._llm.input_processor))
        config = self._llm.model_config
        self.info.max_model_len = config.max_model_len
        self.info.runner = "pooling" if config.runner_type == "pooling" else "generate"
        self.info.vocab_size = config.get_vocab_size()
        batch_inter_token_latencies(self._llm)
        template = getattr(self._tokenizer, "chat_template", None)
        self.info.chat_template = template if isinstance(template, str) else None
        self.info.model_type = getattr(config.hf_config, "model_type", None)
        if self._want_direct and self.info.runner == "generate":
            from vllm.v1.engine.detokenizer import uses_fast_detokenizer

            reason = unsupported(self._llm)
            if reason is None and not uses_fast_detokenizer(self._tokenizer):
                reason = "the tokenizer has no fast incremental decoder"
            if reason is None:
                self._supported_tasks = await first_call(self._llm.get_supported_tasks, "get_supported_tasks")
                self._direct = DirectRoute(self._llm.output_processor, self._tokenizer, lambda tid: self.token_bytes()(tid),
                                           outputs_waiting(self._llm.engine_core))
                log.info("direct outputs on: generation requests skip vLLM's OutputProcessor")
            else:
                log.warning("direct outputs off (every request takes vLLM's output path): %s", reason)
        self._state = "ready"

    @property
    def engine_args(self) -> Any:
        return self._args

    def _build(self) -> Any:
        """The AsyncLLM (in the start's thread): `AsyncLLM.from_engine_args`, or with a client config
        client `index` of `count` of engine cores started elsewhere (vLLM's
        `build_async_engine_client_from_engine_args`); an abort between the config and the engine
        starts no engine core, one after it is `close()`'s to kill."""
        from vllm.usage.usage_lib import UsageContext
        from vllm.v1.engine.async_llm import AsyncLLM

        args = self._args
        extra: dict[str, Any] = {}
        usage = UsageContext.ENGINE_CONTEXT
        if self._client is not None:
            index, count, config = self._client
            args._api_process_count, args._api_process_rank = count, index
            usage = UsageContext.OPENAI_API_SERVER
            extra = {"aggregate_engine_logging": args.aggregate_engine_logging, "client_addresses": dict(config),
                     "client_count": count, "client_index": index}
        vllm_config = args.create_engine_config(usage_context=usage)
        if self._aborted.is_set():
            raise EngineFailure("the engine's start was aborted")
        llm = AsyncLLM.from_vllm_config(vllm_config=vllm_config, usage_context=usage,
                                        enable_log_requests=args.enable_log_requests,
                                        disable_log_stats=args.disable_log_stats, **extra)
        if self._aborted.is_set():
            llm.shutdown()
            raise EngineFailure("the engine's start was aborted")
        return llm

    def kill(self, reason: str = "the engine died") -> None:
        """The engine died where this process cannot see it (the parent saw the shared engine cores
        go): state "dead" at once, and every request in flight ends with an error."""
        llm = self._llm
        if llm is None:
            self._state = "dead"
            return
        llm.engine_core.resources.engine_dead = True
        self._fail_all(llm, EngineFailure(reason))

    def _fail_all(self, llm: Any, error: EngineFailure) -> None:
        if self._direct is not None:
            self._direct.fail_all(error)
        # Requests on vLLM's own output path too: their collectors would never hear another word.
        processor = getattr(llm, "output_processor", None)
        states = getattr(processor, "request_states", None)
        if states:
            for state in list(states.values()):
                if state.queue is not None:
                    state.queue.put(error)

    async def close(self) -> None:
        if self._starting is not None:
            await self._abort_start(*self._starting)
        llm, self._llm = self._llm, None
        died = llm is not None and llm.errored  # its engine core is gone: what is left is orphaned
        self._state = "dead"
        gone = EngineFailure("the engine was shut down")
        if llm is None:
            if self._direct is not None:
                self._direct.fail_all(gone)
        else:
            # shutdown() cancels the output handler: every request still in flight ends now.
            self._fail_all(llm, gone)
            llm.shutdown()
        processes, self._processes = self._processes, []
        if processes:
            await asyncio.to_thread(spawned.reap, processes, 1.0 if died else 5.0)

    async def _abort_start(self, future: Any, processes: spawned.Spawned) -> None:
        """`close()` before `start()` finished (or after it failed): no process of it may stay."""
        self._starting = None
        self._aborted.set()
        if not future.done():
            log.info("the engine is still starting: aborting its start")
        await asyncio.to_thread(processes.kill_until, future, ABORT_BOUND)
        if future.done() and not future.cancelled() and future.exception() is None:
            future.result().shutdown()  # it finished just now: its processes are gone, its sockets go too

    # -- tokenizer ------------------------------------------------------
    @property
    def tokenizer(self) -> Any:
        return self._tokenizer

    def token_bytes(self) -> TokenBytes:
        if self._token_bytes is None:
            self._token_bytes = TokenBytes(self._tokenizer)
        return self._token_bytes

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        if self._encode is not None and type(text) is str:
            return self._encode(text, add_special_tokens)
        return list(self._tokenizer.encode(text, add_special_tokens=add_special_tokens))

    def decode(self, token_ids: Sequence[int]) -> str:
        return self._tokenizer.decode(list(token_ids))

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
        text = self._tokenizer.apply_chat_template(
            messages,
            chat_template=chat_template,
            tokenize=False,
            add_generation_prompt=add_generation_prompt and not continue_final_message,
            continue_final_message=continue_final_message,
            tools=tools,
            **(chat_template_kwargs or {}),
        )
        return self.encode(text, add_special_tokens=False)

    # -- generation -----------------------------------------------------
    async def generate(self, request_id: str, prompt_ids: list[int], params: GenerationParams) -> OutputStream:
        from vllm.inputs import tokens_input

        llm = self._llm
        if llm is None or llm.errored:
            raise EngineFailure("the engine is not running")
        from vllm.exceptions import VLLMValidationError

        try:
            sampling = self._sampling(params)
            # With --reasoning-parser, vLLM's structured outputs wait for the thinking to end;
            # its parser must know the request's template switch (enable_thinking), as in vllm serve.
            extra: dict[str, Any] = {}
            if params.adapter is not None:
                extra["lora_request"] = lora_request(params.adapter)
            if params.trace_headers is not None:
                extra["trace_headers"] = params.trace_headers
            if params.structured is not None and params.template_kwargs is not None:
                extra["reasoning_parser_kwargs"] = {"chat_template_kwargs": params.template_kwargs}
            # A traced request takes vLLM's own output route: its output processor makes the engine's
            # `llm_request` span (queue, prefill, decode times), which the direct route does not.
            if self._direct is not None and params.trace_headers is None:
                return await self._generate_direct(request_id, tokens_input(prompt_ids), sampling, params, extra)
            collector = await llm.add_request(request_id, tokens_input(prompt_ids), sampling, **extra)
        except VLLMValidationError as exc:
            raise rejected(str(exc.args[0]) if exc.args else str(exc), exc.parameter, params) from exc
        except Exception as exc:
            if llm.errored:  # the engine died meanwhile (EngineDeadError, a closed socket): not the request's fault
                raise EngineFailure(f"the engine died: {type(exc).__name__}: {exc}") from exc
            error = engine_exception(exc)
            if isinstance(error, EngineFailure) and error.retryable:  # e.g. --max-num-queued-reqs reached: a 503
                raise error from exc
            if isinstance(error, EngineRejected) or isinstance(exc, (ValueError, TypeError, RuntimeError)):
                raise rejected(str(exc), None, params) from exc
            raise
        logprobs = None if params.logprobs is None else (self.token_bytes(), params.logprobs)
        prompt_logprobs = None if params.prompt_logprobs is None else (self.token_bytes(), params.prompt_logprobs)
        stream = into_queue(collector, logprobs, prompt_logprobs)
        stream.prompt_tokens = len(prompt_ids)
        return stream

    async def _generate_direct(self, request_id: str, prompt: Any, sampling: Any, params: GenerationParams,
                               extra: dict[str, Any]) -> DeltaQueue:
        """AsyncLLM.add_request for one choice, with the outputs routed to us (vllm_direct.py)."""
        llm, direct = self._llm, self._direct
        assert direct is not None
        processor = llm.input_processor
        request = processor.process_inputs(request_id, prompt, sampling, supported_tasks=self._supported_tasks,
                                           lora_request=extra.get("lora_request"), trace_headers=extra.get("trace_headers"))
        if "reasoning_parser_kwargs" in extra:
            request.reasoning_parser_kwargs = extra["reasoning_parser_kwargs"]
        processor.assign_request_id(request)  # vLLM's internal id: ours plus a random suffix
        llm.check_admission(params.n, request.request_id)  # n > 1 takes n places, as in add_request
        llm._run_output_handler()  # started lazily, as add_request does
        stream, engine_requests = direct.add(request, request_id, params)  # n > 1: its children
        try:
            for engine_request in engine_requests:
                await llm.engine_core.add_request_async(engine_request)
        except BaseException:
            sent = direct.discard(request_id)
            if sent and len(engine_requests) > 1:  # the children already sent (as add_request's abort)
                await llm.engine_core.abort_requests_async(sent)
            raise
        return stream

    async def embed(self, request_id: str, prompt_ids: list[int], dimensions: int | None = None) -> list[float]:
        """One embedding from vLLM's pooling runner (an aborted wait aborts the request)."""
        from vllm.exceptions import VLLMClientError
        from vllm.inputs import tokens_input
        from vllm.pooling_params import PoolingParams

        llm = self._llm
        if llm is None or llm.errored:
            raise EngineFailure("the engine is not running")
        final = None
        try:
            async for out in llm.encode(tokens_input(prompt_ids), PoolingParams(task="embed", dimensions=dimensions), request_id):
                final = out
        except (VLLMClientError, ValueError) as exc:
            raise EngineRejected(str(exc)) from exc
        if final is None:
            raise EngineFailure("the engine returned no embedding")
        return final.outputs.data.tolist()

    async def load_adapter(self, adapter: Adapter, *, replace: bool = False) -> None:
        """vLLM's `add_lora`: the engine core loads (and checks) the weights now, as `vllm serve` does."""
        llm = self._llm
        if llm is None or llm.errored:
            raise EngineFailure("the engine is not running")
        if llm.vllm_config.lora_config is None:
            raise EngineRejected("LoRA adapters are not enabled: start the server with --enable-lora", "lora_path")
        try:
            await llm.add_lora(lora_request(adapter, replace=replace))
        except Exception as exc:
            if llm.errored:
                raise EngineFailure(f"the engine died: {type(exc).__name__}: {exc}") from exc
            raise EngineRejected(f"{type(exc).__name__}: {exc}", "lora_path") from exc

    async def abort(self, request_id: str) -> None:
        llm = self._llm
        if llm is None or llm.errored:
            return
        if self._direct is not None:
            internals = self._direct.discard(request_id)  # n > 1: every child still running
            if internals is not None:
                if internals:
                    await llm.engine_core.abort_requests_async(internals)
                return
        await llm.abort(request_id)

    @property
    def num_running(self) -> int:
        if self._llm is None:
            return 0
        return self._llm.get_num_unfinished_requests() + (len(self._direct) if self._direct is not None else 0)


if TYPE_CHECKING:
    from .base import Engine

    def _conforms(engine: VllmEngine) -> Engine:  # mypy proves it
        return engine

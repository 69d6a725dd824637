"""Our request parameters in vLLM's terms, and vLLM's refusals in ours.

`sampling_params`: a `GenerationParams` as vLLM's `SamplingParams` (deltas,
made for this one request); `SamplingBuilder`: the same, cheaper (below);
`lora_request`: an `Adapter` as vLLM's
`LoRARequest`; `rejected`: an add_request refusal as `EngineRejected` (a
400), naming the structured-output constraint when that is what vLLM's
grammar backend could not compile. vLLM is imported inside each function:
importing this module costs nothing.

`SamplingBuilder` (one per engine) keeps, per distinct set of request
parameters other than `max_tokens` and `seed`, one `SamplingParams` built and
validated by vLLM's constructor, and answers a request with a shallow copy of
it (`copy.copy`, as vLLM's own `clone` does for `skip_clone` params) carrying
the request's `max_tokens` and `seed` and its own `stop` and `stop_token_ids`
lists, without the constructor's validation per request (about 35 Python
calls). A request whose `max_tokens` or `seed` the constructor would refuse
or change, or that carries `logit_bias` or a structured-output constraint, is
built from scratch. The copies of one entry share one set, vLLM's stop ids
(private to `SamplingParams`), to which vLLM's input processor adds the
engine's EOS ids (the tokenizer's and the generation config's, the same for
every request) on each copy: so once an entry has served a request its copies
hold those ids before the input processor adds them again, and the params
that reach the engine core are the constructor's in every field
(tests/unit/test_vllm_sampling_identity.py pins both, and against vLLM's
server). An entry whose shared set holds anything else is built again.
"""

from __future__ import annotations

import copy
from collections.abc import Iterable
from typing import Any

from .base import Adapter, EngineRejected, GenerationParams

_GRAMMAR_WORDS = ("grammar", "schema", "regex", "structured", "choice", "json", "xgrammar", "guidance")


def rejected(message: str, param: str | None, params: GenerationParams) -> EngineRejected:
    """An add_request refusal as a client error; say so when the structured-output constraint is the cause."""
    if params.structured and any(word in message.lower() for word in _GRAMMAR_WORDS):
        return EngineRejected(f"the structured-output constraint cannot be compiled: {message}", param)
    return EngineRejected(message, param)


def sampling_params(params: GenerationParams) -> Any:
    # From the submodule: `from vllm import SamplingParams` goes through vllm's lazy module
    # __getattr__ on every call (about 7 µs, once per request).
    from vllm.sampling_params import RequestOutputKind, SamplingParams, StructuredOutputsParams

    structured = StructuredOutputsParams(**params.structured) if params.structured else None
    return SamplingParams(
        n=params.n,
        max_tokens=params.max_tokens,
        temperature=params.temperature,
        top_p=params.top_p,
        top_k=params.top_k,  # 0: disabled, vLLM's default (as its server sends when a request has no top_k)
        min_p=params.min_p,
        presence_penalty=params.presence_penalty,
        frequency_penalty=params.frequency_penalty,
        repetition_penalty=params.repetition_penalty,
        seed=params.seed,
        stop=params.stop or None,
        stop_token_ids=params.stop_token_ids or None,
        ignore_eos=params.ignore_eos,
        min_tokens=params.min_tokens,
        logit_bias=params.logit_bias,
        logprobs=params.logprobs,
        prompt_logprobs=params.prompt_logprobs,
        include_stop_str_in_output=params.include_stop_str_in_output,
        skip_special_tokens=params.skip_special_tokens,
        structured_outputs=structured,
        output_kind=RequestOutputKind.DELTA,
        # Made for this request alone: vLLM's input processor may copy it shallowly instead of
        # its deepcopy per request (vLLM's own server marks its per-request params the same way).
        skip_clone=True,
    )


# Entries a builder keeps before it starts again (distinct parameter sets seen; a few in practice).
MAX_ENTRIES = 1024


class SamplingBuilder:
    def __init__(self, eos_ids: Iterable[int] = ()) -> None:
        self._made: dict[tuple[Any, ...], Any] = {}
        self._eos_ids = frozenset(eos_ids)  # what vLLM's input processor adds to every request's stop ids

    def __call__(self, params: GenerationParams) -> Any:
        if params.structured is not None or params.logit_bias is not None:
            return sampling_params(params)
        max_tokens, seed, min_tokens = params.max_tokens, params.seed, params.min_tokens
        if max_tokens < 1 or min_tokens > max_tokens or seed == -1:  # the constructor's to refuse or change
            return sampling_params(params)
        key = (params.n, params.temperature, params.top_p, params.top_k, params.min_p, params.presence_penalty,
               params.frequency_penalty, params.repetition_penalty, seed is None, tuple(params.stop),
               tuple(params.stop_token_ids), params.ignore_eos, min_tokens, params.logprobs, params.prompt_logprobs,
               params.include_stop_str_in_output, params.skip_special_tokens)
        made = self._made.get(key)
        if made is None or not made.all_stop_token_ids <= self._eos_ids.union(made.stop_token_ids):
            if len(self._made) >= MAX_ENTRIES:
                self._made.clear()
            made = self._made[key] = sampling_params(params)  # vLLM validates it (or raises) once
        out = copy.copy(made)
        out.max_tokens = max_tokens
        out.seed = seed
        out.stop = list(made.stop)
        out.stop_token_ids = list(made.stop_token_ids)
        return out


def eos_ids(tokenizer: Any, input_processor: Any) -> set[int]:
    """The ids vLLM's input processor adds to every request's stop ids: the tokenizer's EOS id and its
    generation config's (`update_from_generation_config`)."""
    ids: set[int] = set()
    eos = getattr(tokenizer, "eos_token_id", None)
    if isinstance(eos, int):
        ids.add(eos)
    config = getattr(input_processor, "generation_config_fields", None) or {}
    more = config.get("eos_token_id")
    ids.update([more] if isinstance(more, int) else more or ())
    return ids


def lora_request(adapter: Adapter, *, replace: bool = False) -> Any:
    from vllm.lora.request import LoRARequest

    return LoRARequest(lora_name=adapter.name, lora_int_id=adapter.id, lora_path=adapter.path,
                       base_model_name=adapter.parent, load_inplace=replace)

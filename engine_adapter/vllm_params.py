"""Our request parameters in vLLM's terms, and vLLM's refusals in ours.

`sampling_params`: a `GenerationParams` as vLLM's `SamplingParams` (deltas,
made for this one request); `lora_request`: an `Adapter` as vLLM's
`LoRARequest`; `rejected`: an add_request refusal as `EngineRejected` (a
400), naming the structured-output constraint when that is what vLLM's
grammar backend could not compile. vLLM is imported inside each function:
importing this module costs nothing.
"""

from __future__ import annotations

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
        top_k=params.top_k if params.top_k > 0 else -1,
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


def lora_request(adapter: Adapter, *, replace: bool = False) -> Any:
    from vllm.lora.request import LoRARequest

    return LoRARequest(lora_name=adapter.name, lora_int_id=adapter.id, lora_path=adapter.path,
                       base_model_name=adapter.parent, load_inplace=replace)

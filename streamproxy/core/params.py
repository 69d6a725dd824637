"""Request structs -> engine-neutral `GenerationParams` and chat messages.

Pure functions, no I/O: every rule about defaults, bounds and aliases lives
here (`max_completion_tokens` is `max_tokens`; an omitted `max_tokens` means
"the rest of the context"; `top_k=-1` means disabled, as in vLLM). A value out
of range raises `InvalidRequest` naming the parameter, so the client gets a
400 that says which field and why.
"""

from __future__ import annotations

from typing import Any

from engine_adapter.base import GenerationParams
from streamproxy.errors import ContextLengthExceeded, InvalidRequest
from streamproxy.protocol.openai_chat import ChatCompletionRequest, ChatMessage
from streamproxy.protocol.openai_completions import CompletionRequest

ROLES = frozenset({"system", "developer", "user", "assistant", "tool", "function"})
REASONING_EFFORTS = ("none", "minimal", "low", "medium", "high", "xhigh", "max")


def _check_range(name: str, value: float | None, low: float, high: float) -> None:
    if value is not None and not (low <= value <= high):
        raise InvalidRequest(f"'{name}' must be between {low:g} and {high:g}, got {value:g}", param=name)


def _stop_list(stop: str | list[str] | None) -> list[str]:
    if stop is None:
        return []
    stops = [stop] if isinstance(stop, str) else stop
    for i, s in enumerate(stops):
        if not s:
            raise InvalidRequest("stop sequences must be non-empty strings", param=f"stop[{i}]" if isinstance(stop, list) else "stop")
    return stops


def _logit_bias(bias: dict[str, float] | None, vocab_size: int | None) -> dict[int, float] | None:
    if not bias:
        return None
    out: dict[int, float] = {}
    for key, value in bias.items():
        try:
            token = int(key)
        except ValueError:
            raise InvalidRequest(f"logit_bias keys must be token ids, got '{key}'", param="logit_bias") from None
        if token < 0 or (vocab_size is not None and token >= vocab_size):
            raise InvalidRequest(f"token id {token} in logit_bias is out of vocabulary", param="logit_bias")
        if not -100 <= value <= 100:
            raise InvalidRequest(f"logit_bias values must be between -100 and 100, got {value:g}", param="logit_bias")
        out[token] = value
    return out


def sampling_params(
    req: ChatCompletionRequest | CompletionRequest,
    *,
    prompt_len: int,
    max_model_len: int,
    requested_max_tokens: int | None,
    max_n: int,
    vocab_size: int | None = None,
    logprobs: int | None = None,
) -> GenerationParams:
    """Validate sampling fields shared by chat and completions."""
    if prompt_len >= max_model_len:
        raise ContextLengthExceeded(
            f"This model's maximum context length is {max_model_len} tokens, "
            f"but the prompt has {prompt_len} tokens. Please shorten the prompt.",
            param="messages" if isinstance(req, ChatCompletionRequest) else "prompt",
        )
    room = max_model_len - prompt_len
    if requested_max_tokens is None:
        max_tokens = room
    else:
        if requested_max_tokens < 1:
            raise InvalidRequest(f"'max_tokens' must be at least 1, got {requested_max_tokens}", param="max_tokens")
        if requested_max_tokens > room:
            raise ContextLengthExceeded(
                f"This model's maximum context length is {max_model_len} tokens. However, you requested "
                f"{prompt_len + requested_max_tokens} tokens ({prompt_len} in the prompt, "
                f"{requested_max_tokens} for the completion). Please reduce the prompt or max_tokens.",
                param="max_tokens",
            )
        max_tokens = requested_max_tokens
    n = choices(req)
    if not 1 <= n <= max_n:
        raise InvalidRequest(f"'n' must be between 1 and {max_n}, got {n}", param="n")
    _check_range("temperature", req.temperature, 0.0, 2.0)
    if req.top_p is not None and not 0.0 < req.top_p <= 1.0:
        raise InvalidRequest(f"'top_p' must be in (0, 1], got {req.top_p:g}", param="top_p")
    if req.top_k is not None and req.top_k < -1:
        raise InvalidRequest(f"'top_k' must be -1 (disabled) or at least 0, got {req.top_k}", param="top_k")
    _check_range("min_p", req.min_p, 0.0, 1.0)
    _check_range("presence_penalty", req.presence_penalty, -2.0, 2.0)
    _check_range("frequency_penalty", req.frequency_penalty, -2.0, 2.0)
    if req.repetition_penalty is not None and not 0.0 < req.repetition_penalty <= 2.0:
        raise InvalidRequest(f"'repetition_penalty' must be in (0, 2], got {req.repetition_penalty:g}", param="repetition_penalty")
    if req.min_tokens < 0 or req.min_tokens > max_tokens:
        raise InvalidRequest(f"'min_tokens' must be between 0 and max_tokens ({max_tokens})", param="min_tokens")
    if req.seed is not None and not -(2**63) <= req.seed < 2**64:
        raise InvalidRequest("'seed' is out of range", param="seed")
    params = GenerationParams(
        max_tokens=max_tokens,
        n=n,
        stop=_stop_list(req.stop),
        stop_token_ids=list(req.stop_token_ids or ()),
        ignore_eos=req.ignore_eos,
        min_tokens=req.min_tokens,
        seed=req.seed,
        logit_bias=_logit_bias(req.logit_bias, vocab_size),
        logprobs=logprobs,
        include_stop_str_in_output=req.include_stop_str_in_output,
        skip_special_tokens=req.skip_special_tokens,
    )
    # Only fields the client set override the engine's defaults.
    if req.temperature is not None:
        params.temperature = req.temperature
    if req.top_p is not None:
        params.top_p = req.top_p
    if req.top_k is not None:
        params.top_k = max(req.top_k, 0)
    if req.min_p is not None:
        params.min_p = req.min_p
    if req.presence_penalty is not None:
        params.presence_penalty = req.presence_penalty
    if req.frequency_penalty is not None:
        params.frequency_penalty = req.frequency_penalty
    if req.repetition_penalty is not None:
        params.repetition_penalty = req.repetition_penalty
    return params


def choices(req: ChatCompletionRequest | CompletionRequest) -> int:
    """`n`, where null means the default, 1."""
    return 1 if req.n is None else req.n


def template_kwargs(req: ChatCompletionRequest, defaults: dict[str, Any] | None,
                    effort_map: dict[str, str] | None = None) -> dict[str, Any]:
    """The chat template's kwargs: the server's defaults < what `reasoning_effort` implies < the request's own.

    An effort goes to the template as `reasoning_effort` and turns thinking on
    (`enable_thinking`, off for "none") unless the request sets it itself, as
    vLLM does; so a server started with thinking off thinks for a request that
    asks for an effort. `effort_map` (--reasoning-effort-map) rewrites a valid
    effort first, as vLLM's `map_reasoning_effort`: the template sees the mapped one.
    """
    out = dict(defaults) if defaults else {}
    effort = req.reasoning_effort
    own = req.chat_template_kwargs or {}
    if effort is not None:
        if effort not in REASONING_EFFORTS:
            raise InvalidRequest(
                f"invalid 'reasoning_effort' value '{effort}': expected one of {', '.join(REASONING_EFFORTS)}", param="reasoning_effort"
            )
        if effort_map:
            effort = effort_map.get(effort, effort)
        out["reasoning_effort"] = effort
        if "enable_thinking" not in own:
            out["enable_thinking"] = effort != "none"
    out.update(own)
    return out


def chat_max_tokens(req: ChatCompletionRequest) -> int | None:
    if req.max_completion_tokens is not None:
        return req.max_completion_tokens
    return req.max_tokens


def chat_logprobs(req: ChatCompletionRequest) -> int | None:
    if req.top_logprobs is not None:
        if not 0 <= req.top_logprobs <= 20:
            raise InvalidRequest(f"'top_logprobs' must be between 0 and 20, got {req.top_logprobs}", param="top_logprobs")
        if not req.logprobs:
            raise InvalidRequest("'top_logprobs' requires 'logprobs' to be true", param="top_logprobs")
    if not req.logprobs:
        return None
    return req.top_logprobs or 0


def completion_logprobs(req: CompletionRequest) -> int | None:
    """Legacy `logprobs: N`: the N most likely tokens per position (0..20), or None."""
    if req.logprobs is not None and not 0 <= req.logprobs <= 20:
        raise InvalidRequest(f"'logprobs' must be between 0 and 20, got {req.logprobs}", param="logprobs")
    return req.logprobs


def _content_text(message: ChatMessage, index: int) -> str | None:
    texts = _content_texts(message, index)
    return texts if texts is None or isinstance(texts, str) else "\n".join(texts)


def _content_texts(message: ChatMessage, index: int) -> str | list[str] | None:
    content = message.content
    if content is None or isinstance(content, str):
        return content
    texts: list[str] = []
    for j, part in enumerate(content):
        where = f"messages[{index}].content[{j}]"
        if part.type == "text":
            if part.text is None:
                raise InvalidRequest("a text content part needs 'text'", param=f"{where}.text")
            texts.append(part.text)
        elif part.type in ("image_url", "input_image", "input_audio", "audio_url", "video_url", "file"):
            raise InvalidRequest(
                f"the served model is text-only and cannot take '{part.type}' content parts", param=f"{where}.type"
            )
        else:
            raise InvalidRequest(f"unknown content part type '{part.type}'", param=f"{where}.type")
    return texts


def chat_messages(messages: list[ChatMessage], content_format: str = "string") -> list[dict[str, Any]]:
    """Validate roles and flatten content into the dicts chat templates expect: each message's
    content one string, or with `content_format` "openai" a list of text parts (as vLLM passes them)."""
    if not messages:
        raise InvalidRequest("'messages' must contain at least one message", param="messages")
    out: list[dict[str, Any]] = []
    for i, m in enumerate(messages):
        if m.role not in ROLES:
            raise InvalidRequest(
                f"invalid role '{m.role}': expected one of system, developer, user, assistant, tool, function",
                param=f"messages[{i}].role",
            )
        item: dict[str, Any] = {"role": "system" if m.role == "developer" else m.role}
        if content_format == "openai":
            texts = _content_texts(m, i)
            texts = [] if texts is None else [texts] if isinstance(texts, str) else texts
            item["content"] = [{"type": "text", "text": t} for t in texts]
        else:
            text = _content_text(m, i)
            item["content"] = text if text is not None else ""
        if m.name is not None:
            item["name"] = m.name
        if m.tool_calls:
            item["tool_calls"] = [
                {"id": c.id, "type": c.type, "function": {"name": c.function.name, "arguments": c.function.arguments}}
                for c in m.tool_calls
            ]
        if m.tool_call_id is not None:
            item["tool_call_id"] = m.tool_call_id
        reasoning = m.reasoning if m.reasoning is not None else m.reasoning_content
        if reasoning is not None:
            item["reasoning_content"] = reasoning
        out.append(item)
    return out


# At most this many prompts in one completions request (vLLM's VLLM_MAX_COMPLETION_PROMPTS default).
MAX_PROMPTS = 1024


def completion_prompts(prompt: str | list[Any]) -> list[str | list[int]]:
    """Normalise `prompt` (str, [str], [int] or [[int]]) to a list of single prompts, none empty."""
    if isinstance(prompt, str):
        prompts: list[str | list[int]] = [prompt]
    elif not prompt:
        raise InvalidRequest("'prompt' must not be empty", param="prompt")
    elif all(type(p) is int for p in prompt):
        prompts = [prompt]
    elif all(isinstance(p, str) for p in prompt) or all(isinstance(p, list) for p in prompt):
        prompts = list(prompt)
    else:
        raise InvalidRequest(
            "'prompt' must be a string, a list of strings, a list of token ids or a list of token-id lists", param="prompt"
        )
    if len(prompts) > MAX_PROMPTS:
        raise InvalidRequest(f"'prompt' holds {len(prompts)} prompts; at most {MAX_PROMPTS} are allowed in one request", param="prompt")
    for i, p in enumerate(prompts):
        if not p:
            raise InvalidRequest("the prompt is empty" if len(prompts) == 1 else f"prompt {i} of the list is empty", param="prompt")
    return prompts


def prompt_logprobs(req: ChatCompletionRequest | CompletionRequest) -> int | None:
    """vLLM's `prompt_logprobs: k` (k >= 0, or -1 for all): non-stream only, as in vLLM."""
    k = req.prompt_logprobs
    if k is None:
        return None
    if k < -1:
        raise InvalidRequest(f"'prompt_logprobs' must be -1 (all) or at least 0, got {k}", param="prompt_logprobs")
    if req.stream and k != 0:
        raise InvalidRequest("'prompt_logprobs' are not available when 'stream' is true", param="prompt_logprobs")
    return k

"""Which streams the gateway cannot continue exactly, and why (resume.py asks).

`refusal(path, body)` says it at request time for every replica (None: a stream of it can be
continued; the gateway then asks the replica for token ids); `parser_refusal` what only a `vllm serve`
replica's stream cannot (a completions continuation has no parser state; a `streamproxy serve`
replica's `continue_token_ids` brings its own forward). Responses and Anthropic Messages streams are
continued on serve replicas only (`BLOCKS`: vLLM's events carry no ids); what their requests can ask
that serve's `continue_token_ids` refuses is `_block_refusal`'s.
"""

from __future__ import annotations

from typing import Any

CHAT = "/v1/chat/completions"
COMPLETIONS = "/v1/completions"
RESPONSES = "/v1/responses"
MESSAGES = "/v1/messages"
BLOCKS = (RESPONSES, MESSAGES)  # their events are made of blocks (core/blockstream.py): serve replicas only
CONTINUED = (CHAT, COMPLETIONS, *BLOCKS)

_STRUCTURED = ("structured_outputs", "guided_json", "guided_regex", "guided_choice", "guided_grammar", "guided_whitespace_pattern",
               "guided_decoding_backend", "grammar", "json_schema", "regex", "choice")
# Every field `refusal` looks at but the messages.
_CHECKED = frozenset((
    *_STRUCTURED, "n", "best_of", "use_beam_search", "response_format", "logprobs", "top_logprobs", "prompt_logprobs",
    "tools", "functions", "stop", "presence_penalty", "frequency_penalty", "bad_words", "truncate_prompt_tokens",
    "kv_transfer_params", "stream_options", "echo", "suffix", "prompt_embeds", "prompt",
))


def refusal(path: str, body: dict[str, Any]) -> str | None:
    """Why this request's stream cannot be continued exactly on another replica; None: it can."""
    chat = path == CHAT
    if path in BLOCKS:
        return _block_refusal(path, body)
    if not chat and path != COMPLETIONS:
        return "only chat, completions, Responses and Messages streams are continued"
    if body.keys().isdisjoint(_CHECKED):  # most requests: none of the fields below (one set operation)
        return _multimodal(body) if chat else None
    if _number(body.get("n"), 1) != 1 or _number(body.get("best_of"), 1) != 1 or body.get("use_beam_search"):
        return "n > 1, best_of and beam search (several sequences)"
    if any(body.get(k) is not None for k in _STRUCTURED):
        return "structured outputs (the grammar's state is the replica's)"
    fmt = body.get("response_format")
    if fmt is not None and not (isinstance(fmt, dict) and fmt.get("type") == "text"):
        return "structured outputs (the grammar's state is the replica's)"
    if (chat and (body.get("logprobs") or body.get("top_logprobs"))) or (not chat and body.get("logprobs") is not None) \
            or body.get("prompt_logprobs") is not None:
        return "logprobs"
    if chat and (body.get("tools") or body.get("functions")) and body.get("tool_choice") not in (None, "none", "auto"):
        return "tool_choice required or named (a grammar's state is the replica's)"
    if body.get("stop"):
        return "stop strings (the replica holds back text that may begin one)"
    if body.get("presence_penalty") or body.get("frequency_penalty"):
        return "presence and frequency penalties (counted over generated tokens only)"
    if body.get("bad_words") or body.get("truncate_prompt_tokens") is not None or body.get("kv_transfer_params") is not None:
        return "bad_words, truncate_prompt_tokens and kv_transfer_params"
    options = body.get("stream_options")
    if isinstance(options, dict) and options.get("continuous_usage_stats"):
        return "continuous usage stats"
    if chat:
        return _multimodal(body)
    else:
        prompt = body.get("prompt")
        if body.get("echo") or body.get("suffix") or body.get("prompt_embeds") is not None:
            return "echo, suffix and prompt embeddings"
        if isinstance(prompt, list) and prompt and not all(isinstance(t, int) for t in prompt):
            return "several prompts in one request"
    return None


def parser_refusal(path: str, body: dict[str, Any]) -> str | None:
    """Why a vLLM replica's stream of this request cannot be continued (a serve replica's can)."""
    if path == CHAT and (body.get("tools") or body.get("functions")) and body.get("tool_choice") != "none":
        return "tool calls (the replica's parser state)"
    return None


def _block_refusal(path: str, body: dict[str, Any]) -> str | None:
    """A Responses or Messages request's: what serve's `continue_token_ids` refuses (and background)."""
    choice = body.get("tool_choice")
    if path == RESPONSES:
        text = body.get("text")
        fmt = text.get("format") if isinstance(text, dict) else None
        if isinstance(fmt, dict) and fmt.get("type") not in (None, "text"):
            return "structured outputs (the grammar's state is the replica's)"
        if body.get("tools") and choice not in (None, "auto", "none"):
            return "tool_choice required or named (a grammar's state is the replica's)"
        if body.get("background") or body.get("previous_response_id") is not None:
            return "background responses and previous_response_id (the replica's store)"
        if body.get("top_logprobs") or any("logprobs" in str(x) for x in body.get("include") or ()):
            return "logprobs"
        items = body.get("input")
        parts = [p for item in items if isinstance(item, dict) for p in _list(item.get("content"))] if isinstance(items, list) else []
        if any(isinstance(p, dict) and p.get("type") not in ("input_text", "output_text", "text") for p in parts):
            return "multimodal input (the prompt's ids alone are not the input)"
        return None
    if body.get("stop_sequences"):
        return "stop strings (the replica holds back text that may begin one)"
    if body.get("tools") and isinstance(choice, dict) and choice.get("type") in ("any", "tool"):
        return "tool_choice any or tool (a grammar's state is the replica's)"
    for message in body.get("messages") or ():
        blocks = _list(message.get("content")) if isinstance(message, dict) else []
        if any(isinstance(b, dict) and b.get("type") in ("image", "document") for b in blocks):
            return "multimodal input (the prompt's ids alone are not the input)"
    return None


def _list(value: Any) -> list[Any]:
    return value if isinstance(value, list) else []


def _multimodal(body: dict[str, Any]) -> str | None:
    for message in body.get("messages") or ():
        content = message.get("content") if isinstance(message, dict) else None
        if isinstance(content, list) and any(not (isinstance(p, dict) and p.get("type") == "text") for p in content):
            return "multimodal input (the prompt's ids alone are not the input)"
    return None


def _number(value: Any, default: int) -> Any:
    return default if value is None else value

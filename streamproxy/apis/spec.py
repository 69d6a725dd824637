"""Each API's stream facts, one object per API: what serve's encoders and the gateway's relay share.

                 OPENAI (chat, completions)   RESPONSES                      ANTHROPIC (Messages)
    end          data: [DONE]                 response.completed|incomplete  message_stop, error
                                              |failed
    deltas       (every data event)           output_text, reasoning_text,   content_block_delta
                                              function_call_arguments .delta
    usage        the chunk's `usage`          the final event's              message_start's message.usage,
                                              response.usage                 message_delta's usage
    error        an error chunk, [DONE]       error, response.failed         error
    keep-alive   `: keepalive` comment        `: keepalive` comment          ping event
    worst case   max_completion_tokens or     max_output_tokens              max_tokens
                 max_tokens, x max(n, best_of)
    finish       a choice's `finish_reason`   the terminal response's        message_delta's
                                              status (incomplete: its reason) delta.stop_reason

`ApiSpec` is what serve's encoders (keep-alive, end, in-band error), the gateway's relay (markers,
usage and finish readers) and its budget holds (worst case) all read; Responses' and Anthropic's live in
`apis/<api>/spec.py`. Markers are the bytes an event starts with on the wire.
Sans-IO.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, Protocol

from streamproxy.core import sse
from streamproxy.core.stream import error_frames
from streamproxy.errors import APIError


@dataclass(slots=True)
class Usage:
    """A request's tokens as the replica reported them (`billed`), or as the gateway counted events."""

    prompt_tokens: int = 0
    completion_tokens: int = 0
    cached_tokens: int = 0
    billed: bool = False  # True: the replica reported it; False: the gateway counted events


class ApiSpec(Protocol):
    """The three subclass it for its defaults (what most APIs have)."""

    name: str
    done: tuple[bytes, ...]  # one of these is in the last event of a complete stream
    deltas: tuple[bytes, ...] = ()  # the events that carry generated text (none: every data event does)
    keepalive: bytes = sse.KEEPALIVE  # what a silent stream sends
    usage_only: bytes | None = None  # marks the usage-only chunk a client did not ask for (the gateway asked for it)
    kept: tuple[bytes, ...] = ()  # the events the in-band error is made of (Responses: the response and its items so far)
    finish: tuple[bytes, ...] = ()  # in the events that end a choice (and say why): the relay decodes only those

    def read_finish(self, body: dict[str, Any], into: dict[int, str]) -> None:
        """Why each choice one event (or a non-stream answer) ended, if it says: `into[index]`, in the
        access log's words (serve's: the engine's `stop`, `length`, ...; OpenAI's own are those)."""
        return None

    def read_usage(self, body: dict[str, Any], into: Usage) -> None:
        """Take the usage one event (or a non-stream answer) carries, if it carries one."""
        ...

    def error(self, exc: APIError, sequence_number: int = 0, kept: Sequence[dict[str, Any]] = ()) -> bytes:
        """The in-band error that ends a stream after its first byte. A Responses stream counts its
        events (`sequence_number`: this one's) and ends with its response failed, made of the `kept`
        events that went by (without its response.created: `error` alone); the others need neither."""
        ...

    def cap(self, body: dict[str, Any]) -> tuple[int | None, int]:
        """The request's own cap on what it generates per choice (None: it names none), and its choices."""
        ...


def positive(value: Any) -> int | None:
    return value if isinstance(value, int) and not isinstance(value, bool) and value > 0 else None


def count(value: Any) -> int:
    return int(value or 0) if isinstance(value, int | float) else 0


class _OpenAI(ApiSpec):
    name = "openai"
    done = (sse.DONE.rstrip(),)
    usage_only = b'"choices":[]'
    finish = (b'"finish_reason":"', b'"finish_reason": "')  # (null in every other chunk)

    def read_finish(self, body: dict[str, Any], into: dict[int, str]) -> None:
        choices = body.get("choices")
        if not isinstance(choices, list):
            return
        for position, choice in enumerate(choices):
            if isinstance(choice, dict) and isinstance(reason := choice.get("finish_reason"), str):
                index = choice.get("index")
                into[index if isinstance(index, int) else position] = reason

    def read_usage(self, body: dict[str, Any], into: Usage) -> None:
        usage = body.get("usage")
        if not isinstance(usage, dict):
            return
        into.prompt_tokens = count(usage.get("prompt_tokens"))
        into.completion_tokens = count(usage.get("completion_tokens"))
        into.cached_tokens = count((usage.get("prompt_tokens_details") or {}).get("cached_tokens"))
        into.billed = True

    def error(self, exc: APIError, sequence_number: int = 0, kept: Sequence[dict[str, Any]] = ()) -> bytes:
        return error_frames(exc)

    def cap(self, body: dict[str, Any]) -> tuple[int | None, int]:
        cap = positive(body.get("max_completion_tokens")) or positive(body.get("max_tokens"))
        return cap, max(positive(body.get("n")) or 1, positive(body.get("best_of")) or 1)


OPENAI = _OpenAI()

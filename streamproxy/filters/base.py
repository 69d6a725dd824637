"""Parts, the filter protocol, and the per-choice pipeline that chains filters.

Each choice may run a chain of response filters speaking in `Part`s (CONTENT, REASONING, TOOL_CALL,
TOOL_ARGS). A filter consumes the kinds it understands and passes the rest through in order, so they
compose: `feed(parts)` (what can be said now), `flush()` (the end), `finish_reason(reason)`. `Pipeline`
owns the choice's UTF-8 carry and filters: `feed` a Delta's text, `finish` flushes in order and maps the
reason; `reasoning_tokens` sums the splitters' counts. Sans-IO.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from typing import Protocol

from streamproxy.core.utf8 import Utf8Carry

CONTENT = 0
TOOL_CALL = 1  # first fragment of a tool call: index, id, name
TOOL_ARGS = 2  # a piece of a tool call's arguments: index, text
REASONING = 3  # a run of the model's reasoning (thinking) text


class Part:
    __slots__ = ("kind", "text", "index", "id", "name", "token_ids")

    def __init__(
        self,
        kind: int,
        text: str = "",
        index: int = 0,
        id: str | None = None,
        name: str | None = None,
        token_ids: Sequence[int] | None = None,
    ) -> None:
        self.kind = kind
        self.text = text
        self.index = index
        self.id = id
        self.name = name
        self.token_ids = token_ids

    def __repr__(self) -> str:
        if self.kind == CONTENT:
            return f"Content({self.text!r})"
        if self.kind == TOOL_CALL:
            return f"ToolCall({self.index}, {self.name!r})"
        if self.kind == REASONING:
            return f"Reasoning({self.text!r})"
        return f"ToolArgs({self.index}, {self.text!r})"

    # Defining __eq__ leaves `__hash__ = None`: a Part (mutable) is not hashable.
    def __eq__(self, other: object) -> bool:
        # Ids are random: compare what a client sees apart from them.
        return isinstance(other, Part) and (self.kind, self.text, self.index, self.name) == (
            other.kind,
            other.text,
            other.index,
            other.name,
        )


def content(text: str) -> Part:
    return Part(CONTENT, text)


def reasoning(text: str) -> Part:
    return Part(REASONING, text)


def new_call_id() -> str:
    return "call_" + os.urandom(12).hex()


def tool_call(index: int, name: str, call_id: str | None = None) -> list[Part]:
    """The first fragment of a call (the encoders give it `arguments: ""`)."""
    return [Part(TOOL_CALL, "", index, call_id or new_call_id(), name)]


def tool_args(index: int, text: str) -> Part:
    return Part(TOOL_ARGS, text, index)


class Filter(Protocol):
    def feed(self, parts: list[Part]) -> list[Part]: ...

    def flush(self) -> list[Part]: ...

    def finish_reason(self, reason: str) -> str: ...


class ContentFilter:
    """Base of the filters that work on CONTENT parts: `feed` hands each one to
    `content(part, out)` and passes every other part through, in order."""

    __slots__ = ()

    def feed(self, parts: list[Part]) -> list[Part]:
        out: list[Part] = []
        for p in parts:
            if p.kind == CONTENT:
                self.content(p, out)
            else:
                out.append(p)
        return out

    def content(self, part: Part, out: list[Part]) -> None:
        raise NotImplementedError

    def finish_reason(self, reason: str) -> str:
        return reason


# Makes one fresh chain per choice.
FilterFactory = Callable[[], "list[Filter]"]


class Pipeline:
    """One choice's carry plus filter chain."""

    __slots__ = ("carry", "filters")

    def __init__(self, filters: Sequence[Filter]) -> None:
        self.carry = Utf8Carry()
        self.filters = list(filters)

    def feed(self, text: str | bytes, token_ids: Sequence[int] | None = None) -> list[Part]:
        chunk = self.carry.feed(text)
        parts = [Part(CONTENT, chunk, token_ids=token_ids)] if chunk or token_ids else []
        if not parts:
            return parts
        for f in self.filters:
            parts = f.feed(parts)
        return [p for p in parts if p.text or p.kind != CONTENT]

    def finish(self, reason: str) -> tuple[list[Part], str]:
        tail = self.carry.flush()
        parts = [Part(CONTENT, tail)] if tail else []
        for f in self.filters:
            parts = f.feed(parts) if parts else []
            parts += f.flush()
            reason = f.finish_reason(reason)
        return [p for p in parts if p.text or p.kind != CONTENT], reason

    @property
    def reasoning_tokens(self) -> int | None:
        """Tokens the chain's reasoning splitters counted as thinking; None without one."""
        counts = [n for f in self.filters if (n := getattr(f, "reasoning_tokens", None)) is not None]
        return sum(counts) if counts else None


def merge_content(parts: list[Part]) -> list[Part]:
    """Join neighbouring CONTENT parts and neighbouring argument pieces of one call."""
    out: list[Part] = []
    for p in parts:
        last = out[-1] if out else None
        if last is not None and last.kind == p.kind and p.kind != TOOL_CALL and last.index == p.index:
            out[-1] = Part(p.kind, last.text + p.text, p.index)
        else:
            out.append(p)
    return out

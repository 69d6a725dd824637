"""Reasoning splitters: a model's `<think>...</think>` -> REASONING parts, the rest CONTENT.

First in the choice's chain (`chain.reasoning_spec`), so the tool parser sees only the answer; rules as
vLLM's (vllm/reasoning/, vllm/parser/qwen3.py):
    deepseek_r1  output starts inside the thinking; a first `<think>` is dropped; `</think>` ends it,
                 everything after is content; no `</think>`: all reasoning.
    qwen3        the same, but every `<think>` inside and any `</think>` after are dropped, and a
                 `<tool_call>` ends the thinking (the tag goes on as content); `enable_thinking: false`:
                 no splitter (`for_request` returns None).
A tail that could start a tag is held until the next text decides; nothing else is held or changed.
`reasoning_tokens` counts the tokens of parts that left still thinking, as vLLM does.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from streamproxy.filters.base import CONTENT, ContentFilter, Part, content, reasoning
from streamproxy.filters.toolparse import tag_overlap

START = "<think>"
END = "</think>"


class ThinkSplitter(ContentFilter):
    """One choice's splitter; the flags carry the model family's rules (module docstring)."""

    __slots__ = ("every_start", "drop_late_ends", "implicit_ends", "thinking", "opened", "buf", "reasoning_tokens")

    def __init__(self, *, every_start: bool = False, drop_late_ends: bool = False, implicit_ends: tuple[str, ...] = ()) -> None:
        self.every_start = every_start  # drop every <think> while thinking, not only the first
        self.drop_late_ends = drop_late_ends  # drop a </think> after the thinking ended
        self.implicit_ends = implicit_ends  # tags that end the thinking and stay in the content
        self.thinking = True
        self.opened = False  # a <think> was dropped already
        self.buf = ""  # text not said yet: a possible tag's beginning
        self.reasoning_tokens = 0

    # -- the Filter protocol ------------------------------------------
    def content(self, part: Part, out: list[Part]) -> None:
        if not self.thinking and not self.drop_late_ends:
            out.append(part)  # the answer, as it comes (token ids and all)
            return
        self.buf += part.text
        said = len(out)
        self._scan(out)
        if part.token_ids:
            if self.thinking and part.text.strip() != START:
                self.reasoning_tokens += len(part.token_ids)
            for q in out[said:]:
                if q.kind == CONTENT:
                    q.token_ids = part.token_ids  # for a parser after this one that reads ids
                    break

    def flush(self) -> list[Part]:
        out: list[Part] = []
        if self.buf:
            out.append(reasoning(self.buf) if self.thinking else content(self.buf))
            self.buf = ""
        return out

    # -- the state machine --------------------------------------------
    def _tags(self) -> list[str]:
        if not self.thinking:
            return [END]
        tags = [END, *self.implicit_ends]
        if self.every_start or not self.opened:
            tags.append(START)
        return tags

    def _scan(self, out: list[Part]) -> None:
        while self.buf:
            buf = self.buf
            tags = self._tags()
            at, tag = min(((i, t) for t in tags if (i := buf.find(t)) >= 0), default=(-1, ""))
            if at < 0:
                keep = max(tag_overlap(buf, t) for t in tags)
                self._say(out, buf[: len(buf) - keep])
                self.buf = buf[len(buf) - keep :]
                return
            self._say(out, buf[:at])
            if tag == START:
                self.opened = True
                self.buf = buf[at + len(START) :]
            elif tag == END:
                self.buf = buf[at + len(END) :]
                if not self.thinking:
                    continue  # a late </think>: dropped
                self.thinking = False
                if not self.drop_late_ends:
                    if self.buf:
                        out.append(content(self.buf))
                    self.buf = ""
                    return
            else:  # a tag that ends the thinking and belongs to the answer
                self.thinking = False
                self.buf = buf[at:]
                if not self.drop_late_ends:
                    out.append(content(self.buf))
                    self.buf = ""
                    return
                # The answer's own scan (for late </think>) must not stall on this tag.
                self._say(out, self.buf[: len(tag)])
                self.buf = self.buf[len(tag) :]

    def _say(self, out: list[Part], text: str) -> None:
        if text:
            out.append(reasoning(text) if self.thinking else content(text))


def deepseek_r1(template_kwargs: dict[str, Any]) -> Callable[[], ThinkSplitter] | None:
    return ThinkSplitter


def qwen3(template_kwargs: dict[str, Any]) -> Callable[[], ThinkSplitter] | None:
    if template_kwargs.get("enable_thinking", True) is False:
        return None  # the template closed the think block for the model: all content
    return lambda: ThinkSplitter(every_start=True, drop_late_ends=True, implicit_ends=("<tool_call>",))


# --reasoning-parser NAME -> (the request's chat template kwargs -> a splitter factory, or None)
OWN_REASONING: dict[str, Callable[[dict[str, Any]], Callable[[], ThinkSplitter] | None]] = {
    "deepseek_r1": deepseek_r1,
    "qwen3": qwen3,
}

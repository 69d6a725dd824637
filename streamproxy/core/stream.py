"""Per-request streaming state machines: engine Deltas -> SSE bytes (chat, completions).

Sans-IO: `start()`, `step(deltas)`, `finish()` and `error(exc)` each return the bytes to write, one
write per call (`StreamEncoder`, implemented here by `ChunkEncoder` and by `blockstream.BlockEncoder`).
Chunks come from templates encoded once per stream, so per token only the delta text is encoded; a
`Utf8Carry` per choice keeps half characters back. With no filters and no logprobs `_one_plain` maps a
Delta straight to a content chunk; otherwise each choice runs a `filters.base.Pipeline` and `_one_parts`
renders content, reasoning, tool-call fragments. A step's logprobs ride on the first chunk it produces,
or the next one: each token's entry is sent once, in order. `return_ids` (vLLM's `return_token_ids`)
takes the parts path too: a step's token ids ride on the last chunk it produces (`"token_ids":[...]`
after the finish reason; `[]` on the others: a chunk with ids ends its step, which a gateway that
continues streams by their ids needs), a step that produces none sends an id-only chunk (chat
`"delta":{}`, completions `"text":""`), and the prompt's ids go once, on chat's role chunk and on each
completions choice's first chunk. `prime(pieces)` (continuation.py) feeds a continued stream's earlier
tokens through the choice's carry and filters without a byte out.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol

import orjson

from engine_adapter.base import Delta, TokenLogprob
from streamproxy.core import sse
from streamproxy.core.deltas import merge_by_index as _merge_by_index
from streamproxy.core.logprobs import CompletionLogprobs, chat_entries
from streamproxy.core.utf8 import Utf8Carry
from streamproxy.errors import APIError
from streamproxy.filters.base import CONTENT, REASONING, TOOL_CALL, FilterFactory, Part, Pipeline, merge_content

_dumps = orjson.dumps
_NULL = b"null"


def _usage_json(prompt: int, completion: int, cached: int | None, reasoning: int | None = None) -> bytes:
    usage: dict[str, int | dict[str, int]] = {
        "prompt_tokens": prompt, "completion_tokens": completion, "total_tokens": prompt + completion
    }
    if cached is not None:
        usage["prompt_tokens_details"] = {"cached_tokens": cached}
    if reasoning is not None:
        usage["completion_tokens_details"] = {"reasoning_tokens": reasoning}
    return _dumps(usage)


class _ChoiceState:
    __slots__ = ("carry", "tokens", "finish_reason", "pipeline", "logprobs", "legacy", "prompt_sent")

    def __init__(self, pipeline: Pipeline | None = None) -> None:
        self.carry = Utf8Carry()
        self.tokens = 0
        self.finish_reason: str | None = None
        self.pipeline = pipeline
        self.logprobs: list[TokenLogprob] = []  # not sent yet
        self.legacy: CompletionLogprobs | None = None
        self.prompt_sent = False  # return_ids: the prompt's ids went out (completions: on the choice's first chunk)


class StreamEncoder(Protocol):
    """What the writer needs to turn one request's engine steps into its stream.

    Every method returns the bytes to write next (maybe empty) and does no I/O. The writer sets
    `prompt_tokens` (and at the end `cached_tokens`) before `step`/`finish`; `completion_tokens` and
    `finish_reasons` (in this API's words) go to the access log; `keepalive` is what a silent stream sends.
    """

    prompt_tokens: int
    cached_tokens: int

    @property
    def keepalive(self) -> bytes: ...

    @property
    def completion_tokens(self) -> int: ...

    @property
    def finish_reasons(self) -> Sequence[str | None]: ...

    def start(self) -> bytes:
        """The stream's opening frames (headers are out before them)."""
        ...

    def step(self, deltas: Sequence[Delta]) -> bytes:
        """One engine step (several, when the writer fell behind)."""
        ...

    def finish(self) -> bytes:
        """After the engine's last step: the closing frames."""
        ...

    def error(self, exc: APIError) -> bytes:
        """An in-band error after the first byte; the stream ends after it."""
        ...


def error_frames(exc: APIError) -> bytes:
    """Chat's and completions' in-band error after the first byte, then a clean end of stream
    (`apis.spec.OPENAI.error`: the gateway's too)."""
    return sse.frame(exc.to_json()) + sse.DONE


class ChunkEncoder:
    """A `StreamEncoder` of OpenAI chunks (chat.completion.chunk, text_completion).

    Shared machinery; subclasses define the object name and choice bodies.
    """

    keepalive = sse.KEEPALIVE

    object_name = b""
    # How a text delta sits in a choice: b'"delta":{"content":' or b'"text":'.
    text_open = b""
    text_close = b""
    finish_body = b""  # the choice body of the finish chunk, before the reason
    # The end of the common chunk after its JSON text (text_close, null logprobs and finish, closing braces).
    _text_tail = b""
    token_ids = False  # --return-tokens-as-token-ids: logprobs name tokens `token_id:N`
    id_only = b""  # the choice body of a chunk that carries only token ids (return_ids)

    def __init_subclass__(cls, **kwargs: object) -> None:
        super().__init_subclass__(**kwargs)
        cls._text_tail = cls.text_close + b',"logprobs":null,"finish_reason":null}]}\n\n'

    def __init__(
        self,
        *,
        response_id: str,
        created: int,
        model: str,
        n: int,
        include_usage: bool = False,
        continuous_usage: bool = False,
        system_fingerprint: str | None = None,
        filters: FilterFactory | None = None,
        logprobs: bool = False,
        return_ids: bool = False,
        prompt_ids: Sequence[Sequence[int]] | None = None,
    ) -> None:
        self.logprobs = logprobs
        self.return_ids = return_ids
        self.prompt_ids = prompt_ids  # return_ids: each choice's prompt ids
        self.continued = False  # a continuation (`prime`): no role chunk, the earlier tokens counted
        if filters is None and not logprobs and not return_ids:
            self.choices = [_ChoiceState() for _ in range(n)]
            self._one = self._one_plain
        else:
            self.choices = [_ChoiceState(Pipeline(filters() if filters else ())) for _ in range(n)]
            self._one = self._one_parts
        self.include_usage = include_usage
        self.continuous_usage = include_usage and continuous_usage
        self.prompt_tokens = 0
        self.cached_tokens = 0
        head = b'{"id":' + _dumps(response_id) + b',"object":"' + self.object_name + b'","created":'
        head += str(created).encode() + b',"model":' + _dumps(model)
        if system_fingerprint is not None:
            head += b',"system_fingerprint":' + _dumps(system_fingerprint)
        head = b"data: " + head
        # The head is kept once, as the start of each choice's opening (see `_head`; n >= 1).
        self._head_len = len(head)
        self._choice_open = [head + b',"choices":[{"index":' + str(i).encode() + b"," for i in range(n)]
        self._tail_plain = b'}]}\n\n'  # see `_text_tail`
        # The common chunk (one plain choice's text, no running usage) is a template:
        # opening + JSON string + tail. The openings are made at the first such chunk
        # (an idle stream does not keep them).
        self._plain = filters is None and not logprobs and not self.continuous_usage and not return_ids
        self._text_openings: list[bytes] | None = None

    # -- helpers --------------------------------------------------------
    @property
    def _head(self) -> bytes:
        """`data: {"id":...,"model":...`: what every chunk of the stream starts with."""
        return self._choice_open[0][: self._head_len]

    def _close(self) -> bytes:
        """End of one chunk: plain, or with the running usage (continuous_usage_stats)."""
        if not self.continuous_usage:
            return self._tail_plain
        completion = sum(c.tokens for c in self.choices)
        return b'}],"usage":' + _usage_json(self.prompt_tokens, completion, None) + b"}\n\n"

    def _text_chunk(self, index: int, text: str) -> bytes:
        return (
            self._choice_open[index]
            + self.text_open
            + _dumps(text)
            + self.text_close
            + b',"logprobs":null,"finish_reason":null'
            + self._close()
        )

    def _finish_chunk(self, index: int, reason: str, logprobs: bytes = _NULL) -> bytes:
        return (
            self._choice_open[index]
            + self.finish_body
            + b',"logprobs":'
            + logprobs
            + b',"finish_reason":"'
            + reason.encode()
            + b'"'
            + (self._ids_field(index) if self.return_ids else b"")
            + self._close()
        )

    def _chunk(self, index: int, body: bytes, logprobs: bytes) -> bytes:
        """A chunk whose choice body (`"delta":{...}` or `"text":...`) is ready-made."""
        ids = self._ids_field(index) if self.return_ids else b""
        return self._choice_open[index] + body + b',"logprobs":' + logprobs + b',"finish_reason":null' + ids + self._close()

    def _ids_field(self, index: int) -> bytes:
        """return_ids: the choice's `"token_ids"`, `[]` until `_one_parts` puts the step's on its last chunk."""
        return b',"token_ids":[]'

    def prime(self, pieces: Sequence[tuple[str, int]]) -> None:
        """A continuation: choice 0 has had these tokens (text, id), as if generated and sent; nothing goes out."""
        self.continued = True
        choice = self.choices[0]
        choice.tokens += len(pieces)
        choice.prompt_sent = True
        pipeline = choice.pipeline
        for text, token in pieces:
            if pipeline is not None:
                pipeline.feed(text, [token])

    def _part_body(self, part: Part) -> bytes:
        """The choice body of one (merged) part; chat adds tool calls."""
        return self.text_open + _dumps(part.text) + self.text_close

    def _logprobs_json(self, choice: _ChoiceState) -> bytes:
        """The pending tokens' logprobs as this endpoint's JSON, and forget them."""
        raise NotImplementedError

    # -- the protocol ---------------------------------------------------
    def start(self) -> bytes:
        return b""

    def step(self, deltas: Sequence[Delta]) -> bytes:
        if len(deltas) == 1:
            delta = deltas[0]
            text = delta.text
            if self._plain and delta.finish_reason is None and type(text) is str:
                # The common chunk, inlined: `_one_plain` for str text with nothing carried over.
                choice = self.choices[delta.index]
                if choice.carry.clean:
                    choice.tokens += delta.num_tokens
                    if not text:
                        return b""
                    openings = self._text_openings
                    if openings is None:
                        openings = self._text_openings = [o + self.text_open for o in self._choice_open]
                    return b"".join((openings[delta.index], _dumps(text), self._text_tail))
            return self._one(delta)
        return b"".join([self._one(d) for d in _merge_by_index(deltas)])

    def _one_plain(self, delta: Delta) -> bytes:
        choice = self.choices[delta.index]
        choice.tokens += delta.num_tokens
        text = choice.carry.feed(delta.text)
        out = self._text_chunk(delta.index, text) if text else b""
        reason = delta.finish_reason
        if reason is not None:
            tail = choice.carry.flush()
            if tail:
                out += self._text_chunk(delta.index, tail)
            choice.finish_reason = reason = self.map_finish_reason(reason)
            out += self._finish_chunk(delta.index, reason)
        return out

    def _one_parts(self, delta: Delta) -> bytes:
        index = delta.index
        choice = self.choices[index]
        choice.tokens += delta.num_tokens
        if self.logprobs and delta.logprobs:
            choice.logprobs.extend(delta.logprobs)
        pipeline = choice.pipeline
        assert pipeline is not None
        out = self._render(index, choice, pipeline.feed(delta.text, delta.token_ids))
        reason = delta.finish_reason
        if reason is not None:
            tail, reason = pipeline.finish(self.map_finish_reason(reason))
            out += self._render(index, choice, tail)
            choice.finish_reason = reason
            out += self._finish_chunk(index, reason, self._logprobs_json(choice) if choice.logprobs else _NULL)
        if self.return_ids and delta.token_ids:
            ids = b',"token_ids":' + _dumps(list(delta.token_ids))
            at = out.rfind(b',"token_ids":[]')
            if at < 0:  # the step said nothing (a parser holds its text): its ids alone
                return out + self._chunk(index, self.id_only, _NULL).replace(b',"token_ids":[]', ids)
            out = out[:at] + ids + out[at + 15 :]
        return out

    def _render(self, index: int, choice: _ChoiceState, parts: list[Part]) -> bytes:
        if not parts:
            return b""
        chunks = []
        for part in merge_content(parts):
            lp = self._logprobs_json(choice) if choice.logprobs else _NULL
            chunks.append(self._chunk(index, self._part_body(part), lp))
        return b"".join(chunks)

    def map_finish_reason(self, reason: str) -> str:
        return reason

    def usage_json(self) -> bytes:
        completion = sum(c.tokens for c in self.choices)
        # Cached prompt tokens as in the non-stream answer (OpenAI and vLLM send them in both).
        return _usage_json(self.prompt_tokens, completion, self.cached_tokens, self.reasoning_tokens)

    @property
    def reasoning_tokens(self) -> int | None:
        """Thinking tokens the choices' reasoning splitters counted; None without one."""
        counts = [n for c in self.choices if c.pipeline is not None and (n := c.pipeline.reasoning_tokens) is not None]
        return sum(counts) if counts else None

    def finish(self) -> bytes:
        """After the engine's last step: usage chunk (if asked) and [DONE]."""
        out = b""
        if self.include_usage:
            out = self._head + b',"choices":[],"usage":' + self.usage_json() + b"}\n\n"
        return out + sse.DONE

    def error(self, exc: APIError) -> bytes:
        return error_frames(exc)

    @property
    def completion_tokens(self) -> int:
        return sum(c.tokens for c in self.choices)

    @property
    def finish_reasons(self) -> list[str | None]:
        return [c.finish_reason for c in self.choices]


class ChatStreamEncoder(ChunkEncoder):
    object_name = b"chat.completion.chunk"
    text_open = b'"delta":{"content":'
    text_close = b"}"
    finish_body = b'"delta":{}'
    id_only = b'"delta":{}'

    # Reasoning also under its older name, `reasoning_content` (--no-reasoning-content-field: off).
    reasoning_content = True

    def _part_body(self, part: Part) -> bytes:
        if part.kind == CONTENT:
            return self.text_open + _dumps(part.text) + b"}"
        if part.kind == REASONING:
            text = _dumps(part.text)
            if self.reasoning_content:
                return b'"delta":{"reasoning":' + text + b',"reasoning_content":' + text + b"}"
            return b'"delta":{"reasoning":' + text + b"}"
        if part.kind == TOOL_CALL:
            call = {
                "index": part.index,
                "id": part.id,
                "type": "function",
                "function": {"name": part.name, "arguments": ""},
            }
        else:
            call = {"index": part.index, "function": {"arguments": part.text}}
        return b'"delta":{"tool_calls":[' + _dumps(call) + b"]}"

    def _logprobs_json(self, choice: _ChoiceState) -> bytes:
        entries = chat_entries(choice.logprobs, self.token_ids)
        choice.logprobs = []
        return b'{"content":' + _dumps(entries) + b',"refusal":null}'

    # The role chunk's content: "" (text may follow), or null when the answer
    # is known to be tool calls (tool_choice required or named), as OpenAI sends.
    role_content = b'""'
    # The answer's role (--response-role), as JSON.
    role = b'"assistant"'

    def start(self) -> bytes:
        if self.continued:
            return b""  # the role chunk went out with the stream's first part
        role = b'"delta":{"role":' + self.role + b',"content":' + self.role_content + b'},"logprobs":null,"finish_reason":null'
        close = self._close()
        if self.return_ids and self.prompt_ids:  # vLLM's: the prompt's ids on the first chunk, after the choices
            close = close[:-3] + b',"prompt_token_ids":' + _dumps(list(self.prompt_ids[0])) + b"}\n\n"
        return b"".join([opening + role + close for opening in self._choice_open])


class CompletionStreamEncoder(ChunkEncoder):
    object_name = b"text_completion"
    text_open = b'"text":'
    text_close = b""
    finish_body = b'"text":""'
    id_only = b'"text":""'

    def _ids_field(self, index: int) -> bytes:
        """vLLM's: each choice's first chunk carries its prompt's ids before its own."""
        choice = self.choices[index]
        if choice.prompt_sent or not self.prompt_ids:
            return super()._ids_field(index)
        choice.prompt_sent = True
        return b',"prompt_token_ids":' + _dumps(list(self.prompt_ids[index])) + super()._ids_field(index)

    def _logprobs_json(self, choice: _ChoiceState) -> bytes:
        if choice.legacy is None:
            choice.legacy = CompletionLogprobs(self.token_ids)
        data = choice.legacy.add(choice.logprobs)
        choice.logprobs = []
        return _dumps(data)

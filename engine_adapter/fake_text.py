"""What the fake engine's tokens say: its words, its one-character tokenizer, its
logprobs, and the holding back of text that may start a stop string.

Pure functions of a script and a position, shared by every request (`fake.py`
runs the step loop). Logprobs are deterministic: token number p of a choice has
logprob `script[p % len]` (default -0.25 * (p % 4 + 1)), the scripted token's
own bytes, and a top-k list of the token then made-up " alt1", " alt2", ...
each one less likely by 1.0; prompt token p > 0 has `-(p % 4 + 1) / 8`, rank 1.
"""

from __future__ import annotations

import functools
import re
from collections.abc import Sequence

from .base import TokenLogprob, token_text


def split_words(text: str) -> list[str]:
    return re.findall(r"\s*\S+|\s+", text) or [text]


@functools.lru_cache(maxsize=16)
def script_words(text: str) -> tuple[str, ...]:
    """`split_words`, once per script text: every request shares the same (immutable) words."""
    return tuple(split_words(text))


def char(token_id: int) -> str:
    """The fake tokenizer's text of one id: its code point (U+FFFD for a lone surrogate)."""
    return "\ufffd" if 0xD800 <= token_id < 0xE000 else chr(token_id)


def sample_logprobs(tokens: Sequence[str | bytes], position: int, script: list[float] | None, k: int,
                    token_id: int | None = None) -> list[TokenLogprob]:
    """The logprobs of a choice's token number `position` (the script repeats; its id `token_id`), with `k` top entries."""
    token_id = position if token_id is None else token_id
    token = tokens[position % len(tokens)]
    data = token if isinstance(token, bytes) else token.encode()
    value = script[position % len(script)] if script else -0.25 * (position % 4 + 1)
    sampled = TokenLogprob(token_id, token_text(data), data, value)
    top = [sampled] + [TokenLogprob(-i, f" alt{i}", f" alt{i}".encode(), value - i) for i in range(1, k)]
    return [TokenLogprob(token_id, sampled.token, data, value, top[:k])]


def prompt_logprobs(prompt_ids: list[int], k: int) -> list[TokenLogprob]:
    """The fake's prompt logprobs: none for the first token, then `-(p % 4 + 1) / 8`, rank 1."""
    out = []
    for p, token_id in enumerate(prompt_ids):
        text = char(token_id)
        data = text.encode()
        if p == 0:
            out.append(TokenLogprob(token_id, text, data, None))
            continue
        value = -(p % 4 + 1) / 8
        own = TokenLogprob(token_id, text, data, value, rank=1)
        top = [own] + [TokenLogprob(-i, f" alt{i}", f" alt{i}".encode(), value - i, rank=i + 1) for i in range(1, k)]
        out.append(TokenLogprob(token_id, text, data, value, top[:k], rank=1))
    return out


def release(text: str, sent: int, stops: Sequence[str], include_stop: bool, *, final: bool) -> tuple[str, int, bool]:
    """What of `text` (all a choice generated; `sent` of it already out) may go out now, as vLLM
    does it: text that could still turn out to start a stop string is held back (longest stop - 1
    characters) until it cannot, or until the output ends. Returns (out, sent now, stopped)."""
    longest = max(len(stop) for stop in stops)
    start = max(0, sent - longest + 1)
    hits = [(at, stop) for stop in stops if (at := text.find(stop, start)) >= 0]
    if hits:
        at, stop = min(hits)
        end = at + len(stop) if include_stop else at
        out = text[sent:end] if end > sent else ""
        return out, max(end, sent), True
    safe = len(text) if final or include_stop else len(text) - (longest - 1)
    if safe <= sent:
        return "", sent, False
    return text[sent:safe], safe, False


# The fake's generated token ids (fake.py): a script position as an id inside the vocabulary, and back.
SCRIPT_IDS = 0xF0000  # generated token ids: this + the token's position in the script (U+F0000 .. U+FFFFD)
_POSITIONS = 0xFFFFE - SCRIPT_IDS


def is_script_id(token: int) -> bool:
    return SCRIPT_IDS <= token < SCRIPT_IDS + _POSITIONS


def script_id(position: int) -> int:
    return SCRIPT_IDS + position % _POSITIONS


def split_tail(tokens: Sequence[str | bytes], end: int) -> bytes:
    """The bytes of an unfinished character at the end of the script's first `end` tokens (b"": none)."""
    data = b"".join(t if isinstance(t, bytes) else t.encode() for t in tokens[max(0, end - 4) : end])
    for back in range(1, min(4, len(data)) + 1):
        lead = data[-back]
        if lead & 0xC0 != 0x80:  # the last character's first byte
            need = 1 if lead < 0x80 else 2 if lead >> 5 == 6 else 3 if lead >> 4 == 14 else 4 if lead >> 3 == 30 else 1
            return data[-back:] if back < need else b""
    return b""


def resumes_at(prompt_ids: list[int]) -> int:
    """The script position after the prompt's last generated token (0: the prompt ends with none)."""
    last = prompt_ids[-1] if prompt_ids else 0
    return last - SCRIPT_IDS + 1 if SCRIPT_IDS <= last < SCRIPT_IDS + _POSITIONS else 0

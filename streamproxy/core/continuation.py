"""A continued stream (`continue_token_ids`): the request goes on after ids it already generated.

A gateway whose replica broke off a stream sends the same request to another replica with the ids
the client has had (docs/api.md, "Continuing a stream"). `check` refuses what cannot be continued
exactly (a 400 naming `continue_token_ids`); `apply` makes the engine's prompt the prompt's ids and
those ids, with `max_tokens` and `min_tokens` less what was generated; `pieces` is their text, token
by token, as an unbroken stream's detokenizer made it (vLLM's incremental rule: a token that ends
inside a character says nothing until one completes it; a character split at the very end is left
out: the engine, which has the ids in its prompt, sends it whole with the next token). The stream
encoder is `prime`d with the pieces, so its filters (tool-call parser, reasoning splitter, UTF-8
carry) stand where the broken stream's stood, and only what is new goes out, without a role chunk;
usage counts the earlier tokens as the answer's and the prompt as the client's own. Sans-IO.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from engine_adapter.base import GenerationParams
from streamproxy.errors import InvalidRequest

PARAM = "continue_token_ids"
# Prompt ids decoded before the generated ones, so the first one's text is read in context (a leading space).
_CONTEXT = 5


def check(ids: list[int], params: GenerationParams, *, stream: bool, vocab_size: int | None, several: bool = False,
          echo: bool = False) -> None:
    """Raise a 400 for a continuation that could not be exact."""
    why = None
    if not stream:
        why = "continues a stream only: send it with 'stream': true"
    elif params.n != 1 or several:
        why = "continues one sequence: not with 'n' > 1 or several prompts"
    elif echo:
        why = "cannot be combined with 'echo'"
    elif params.logprobs is not None or params.prompt_logprobs is not None:
        why = "cannot be combined with logprobs (the earlier tokens' are not known)"
    elif params.structured is not None:
        why = "cannot be combined with structured outputs (the grammar would start over)"
    elif params.stop:
        why = "cannot be combined with stop strings (the engine would not see a stop string that spans the break)"
    elif params.presence_penalty or params.frequency_penalty:
        why = "cannot be combined with presence or frequency penalties (the engine counts generated tokens only)"
    elif any(t < 0 or (vocab_size is not None and t >= vocab_size) for t in ids):
        why = f"token ids must be within the vocabulary (0 .. {(vocab_size or 0) - 1})"
    elif len(ids) >= params.max_tokens:
        why = f"holds {len(ids)} ids, but the request allows {params.max_tokens} tokens: nothing is left to generate"
    if why is not None:
        raise InvalidRequest(f"'{PARAM}' {why}", param=PARAM)


def apply(prompt_ids: list[int], params: GenerationParams, ids: list[int]) -> list[int]:
    """The engine's prompt, and `params` left what the earlier tokens did not use."""
    params.max_tokens -= len(ids)
    params.min_tokens = max(0, params.min_tokens - len(ids))
    return [*prompt_ids, *ids]


def pieces(decode: Callable[[Sequence[int]], str], prompt_ids: Sequence[int], ids: Sequence[int]) -> list[tuple[str, int]]:
    """Each earlier token's text (maybe "") and id, as the unbroken stream read them."""
    seq = [*prompt_ids[-_CONTEXT:], *ids]
    prefix = read = len(seq) - len(ids)
    out: list[tuple[str, int]] = []
    for i in range(read, len(seq)):
        before = decode(seq[prefix:read])
        now = decode(seq[prefix : i + 1])
        if len(now) > len(before) and not now.endswith("\ufffd"):
            out.append((now[len(before) :], seq[i]))
            prefix, read = read, i + 1
        else:
            out.append(("", seq[i]))
    return out

"""Prompt text -> token ids on the event loop, without transformers' per-call Python.

`fast_encoder(tokenizer)` gives a function that encodes with a private copy of a fast
tokenizer's Rust `tokenizers.Tokenizer` (`encode`, in the calling thread: the batch calls
hand even one text to rayon's pool and block the event loop until a worker ran it), set up
as transformers' `encode` sets the shared one for every call (no truncation, no padding,
its `split_special_tokens`): the same ids, a fraction of the CPU. The copy is ours alone, so
vLLM's threads never share its state. None for any other tokenizer: the caller keeps
`tokenizer.encode`.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

Encode = Callable[[str, bool], list[int]]


def fast_encoder(tokenizer: Any) -> Encode | None:
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return None
    shared = getattr(tokenizer, "_tokenizer", None)
    split = getattr(tokenizer, "split_special_tokens", False)
    if not isinstance(shared, Tokenizer) or not isinstance(split, bool):
        return None
    own = Tokenizer.from_str(shared.to_str())
    own.no_truncation()
    own.no_padding()
    own.encode_special_tokens = split
    one = own.encode

    def encode(text: str, add_special_tokens: bool) -> list[int]:
        return one(text, add_special_tokens=add_special_tokens).ids

    return encode

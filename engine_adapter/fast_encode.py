"""Prompt text -> token ids on the event loop, without transformers' per-call Python.

`fast_encoder(tokenizer)` gives a function that encodes with a private copy of a fast
tokenizer's Rust `tokenizers.Tokenizer` (`encode`, in the calling thread: the batch calls
hand even one text to rayon's pool and block the event loop until a worker ran it), set up
as transformers' `encode` sets the shared one for every call (no truncation, no padding,
its `split_special_tokens`): the same ids, a fraction of the CPU. The copy is ours alone, so
vLLM's threads never share its state. None for any other tokenizer: the caller keeps
`tokenizer.encode`.

Without special tokens added (a rendered chat), the text is encoded piece by piece between its
added tokens, each piece's ids kept (`Segments`): a chat template's system prompt, its role
headers and a conversation's earlier turns repeat from request to request, and their encoding
costs most of a request's tokenizer CPU (~80 µs for a 47-token chat on SmolLM2's tokenizer).
It gives the same ids because `tokenizers` does the same: it first cuts the text at its
added tokens that match unnormalized (leftmost-longest), then normalizes, pre-tokenizes and
runs the model on each piece on its own, and with `add_special_tokens=False` the post-processor
adds nothing. That holds only for tokenizers whose every step is per piece, so `segmentable`
checks the tokenizer's own description: no normalizer or a Unicode one, pre-tokenizers that
only split (no Metaspace: its "first" scheme depends on where a piece is), a deterministic
model (no BPE dropout), and added tokens matched verbatim (no lstrip / rstrip / single_word).
Anything else encodes the whole text as before.
"""

from __future__ import annotations

import json
import re
from collections.abc import Callable
from typing import Any

Encode = Callable[[str, bool], list[int]]

# Normalizers and pre-tokenizers that act on each piece alone, whatever comes before or after it.
_PIECEWISE_NORMALIZERS = {"NFC", "NFD", "NFKC", "NFKD"}
_PIECEWISE_PRE_TOKENIZERS = {"ByteLevel", "Split", "Digits", "Punctuation", "Whitespace", "WhitespaceSplit",
                             "UnicodeScripts", "BertPreTokenizer", "CharDelimiterSplit"}
# Bound on the characters kept (pieces' texts and ENTRY_CHARS each), then the oldest go first.
CACHE_CHARS = 4_000_000
# A piece longer than this is encoded each time (a long message seldom repeats; it would push out many short pieces).
MAX_PIECE = 65_536
# What an entry costs beyond its text, counted in characters against that bound.
ENTRY_CHARS = 64


def fast_encoder(tokenizer: Any) -> Encode | None:
    try:
        from tokenizers import Tokenizer
    except ImportError:
        return None
    shared = getattr(tokenizer, "_tokenizer", None)
    split = getattr(tokenizer, "split_special_tokens", False)
    if not isinstance(shared, Tokenizer) or not isinstance(split, bool):
        return None
    description = shared.to_str()
    own = Tokenizer.from_str(description)
    own.no_truncation()
    own.no_padding()
    own.encode_special_tokens = split
    one = own.encode
    pattern = None if split else segmentable(json.loads(description))
    if pattern is None:
        def encode(text: str, add_special_tokens: bool) -> list[int]:
            return one(text, add_special_tokens=add_special_tokens).ids

        return encode
    segments = Segments(one, pattern)

    def encode_by_pieces(text: str, add_special_tokens: bool) -> list[int]:
        if add_special_tokens:
            return one(text, add_special_tokens=True).ids
        return segments.encode(text)

    return encode_by_pieces


def segmentable(description: dict[str, Any]) -> re.Pattern[str] | None:
    """The pattern that finds a tokenizer's unnormalized added tokens as `tokenizers` does (None: its
    encoding is not provably the pieces' encodings joined; see the module's comment)."""
    normalizer = description.get("normalizer")
    if normalizer is not None and not _all_of(normalizer, _PIECEWISE_NORMALIZERS, "normalizers"):
        return None
    pre = description.get("pre_tokenizer")
    if pre is not None and not _all_of(pre, _PIECEWISE_PRE_TOKENIZERS, "pretokenizers"):
        return None
    model = description.get("model") or {}
    if model.get("type") not in ("BPE", "WordPiece", "WordLevel") or model.get("dropout") not in (None, 0, 0.0):
        return None
    verbatim = []
    for token in description.get("added_tokens") or ():
        if token.get("lstrip") or token.get("rstrip") or token.get("single_word"):
            return None
        if not token.get("normalized", True) and token.get("content"):
            verbatim.append(token["content"])
    if not verbatim:
        return None
    # Longest first: at one position the regex takes the first alternative that matches, so this is
    # the leftmost-longest match of the tokenizer's Aho-Corasick automaton.
    verbatim.sort(key=len, reverse=True)
    return re.compile("(" + "|".join(re.escape(t) for t in verbatim) + ")")


def _all_of(node: dict[str, Any], kinds: set[str], nested: str) -> bool:
    kind = node.get("type")
    if kind == "Sequence":
        return all(_all_of(child, kinds, nested) for child in node.get(nested) or ())
    return kind in kinds


class Segments:
    """Ids of a text without special tokens added: the pieces between its added tokens, each encoded
    once (bounded by CACHE_CHARS), the added tokens themselves encoded alone (one id each)."""

    def __init__(self, encode: Any, pattern: re.Pattern[str], max_chars: int = CACHE_CHARS) -> None:
        self._encode = encode
        self._split = pattern.split
        self._known: dict[str, list[int]] = {}
        self._chars = 0
        self._max_chars = max_chars

    def encode(self, text: str) -> list[int]:
        known = self._known
        ids: list[int] = []
        for piece in self._split(text):  # text, token, text, token, ..., text (a piece may be "")
            if not piece:
                continue
            found = known.get(piece)
            if found is None:
                found = self._encode(piece, add_special_tokens=False).ids
                self._keep(piece, found)
            ids += found  # a copy: the caller may change its list
        return ids

    def _keep(self, piece: str, ids: list[int]) -> None:
        if len(piece) > MAX_PIECE:
            return
        size = len(piece) + ENTRY_CHARS
        if size > self._max_chars:
            return
        known = self._known
        while self._chars + size > self._max_chars and known:
            oldest = next(iter(known))
            self._chars -= len(oldest) + ENTRY_CHARS
            del known[oldest]
        known[piece] = ids
        self._chars += size

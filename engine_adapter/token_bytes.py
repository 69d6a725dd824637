"""A token id's real bytes, from the tokenizer's own vocabulary (for logprobs).

Decoding one id loses bytes of a split character (U+FFFD), so the bytes come from the vocabulary entry:
byte-level BPE through the inverse of GPT-2's `bytes_to_unicode`; SentencePiece `<0xNN>` pieces as that
byte and `▁` as a space; anything else the decoded text. Cached per id; any Hugging Face tokenizer.
"""

from __future__ import annotations

import re
from typing import Any

_SPM_BYTE = re.compile(r"<0x([0-9A-Fa-f]{2})>")


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2's reversible byte -> printable character table."""
    keep = list(range(ord("!"), ord("~") + 1)) + list(range(ord("¡"), ord("¬") + 1)) + list(range(ord("®"), ord("ÿ") + 1))
    chars = keep[:]
    extra = 0
    for b in range(256):
        if b not in keep:
            keep.append(b)
            chars.append(256 + extra)
            extra += 1
    return dict(zip(keep, map(chr, chars)))


BYTE_DECODER = {c: b for b, c in _bytes_to_unicode().items()}


class TokenBytes:
    def __init__(self, tokenizer: Any) -> None:
        self._tokenizer = tokenizer
        vocab = tokenizer.get_vocab()
        # A byte-level vocabulary spells the space byte as "Ġ" and newline as "Ċ".
        self.byte_level = "Ġ" in vocab or "Ċ" in vocab or any(k.startswith("Ġ") for k in list(vocab)[:5000])
        self._cache: dict[int, bytes] = {}

    def __call__(self, token_id: int) -> bytes:
        data = self._cache.get(token_id)
        if data is None:
            data = self._cache[token_id] = self._lookup(token_id)
        return data

    def _lookup(self, token_id: int) -> bytes:
        piece = self._tokenizer.convert_ids_to_tokens(token_id)
        if isinstance(piece, str):
            if self.byte_level:
                try:
                    return bytes(BYTE_DECODER[c] for c in piece)
                except KeyError:
                    pass  # an added token outside the byte table
            else:
                m = _SPM_BYTE.fullmatch(piece)
                if m:
                    return bytes([int(m.group(1), 16)])
                return piece.replace("▁", " ").encode()
        return self._tokenizer.decode([token_id]).encode()

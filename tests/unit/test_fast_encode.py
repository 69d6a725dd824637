"""fast_encode: the Rust fast path gives exactly transformers' `encode` ids, on the default model's tokenizer."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from engine_adapter.fast_encode import fast_encoder

# Either folder has SmolLM2's tokenizer (the tiny model is built with it).
MODELS = [Path.home() / ".cache/streamproxy/models" / name for name in ("SmolLM2-135M-Instruct", "tiny-llama-1layer")]

TEXTS = [
    "",
    "Tell me a long story about a lighthouse keeper who finds a message in a bottle.",
    "<|im_start|>system\nYou are helpful<|im_end|>\n<|im_start|>user\nhéllo 你好 😀<|im_end|>\n<|im_start|>assistant\n",
    "  leading and trailing spaces  \n\n\ttabs<|im_end|><|im_end|>",
    "<|endoftext|> not special <|im_start",
    "x" * 3000,
]


@pytest.fixture(scope="module")
def hf():
    found = [m for m in MODELS if (m / "tokenizer.json").exists()]
    if not found:
        pytest.skip("default model not prepared (python -m engine_adapter.default_model)")
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(found[0]))


@pytest.mark.parametrize("special", [False, True])
def test_the_same_ids_as_transformers_encode(hf, special):
    encode = fast_encoder(hf)
    assert encode is not None
    for text in TEXTS:
        assert encode(text, special) == hf.encode(text, add_special_tokens=special)


def test_split_special_tokens_is_followed(hf):
    hf.split_special_tokens = True
    try:
        encode = fast_encoder(hf)
        assert encode is not None
        text = TEXTS[2]
        assert encode(text, False) == hf.encode(text, add_special_tokens=False)
        assert 1 not in encode(text, False)  # <|im_start|> split into plain text pieces
    finally:
        hf.split_special_tokens = False


def test_the_copy_is_private(hf):
    encode = fast_encoder(hf)
    assert encode is not None
    hf._tokenizer.enable_truncation(4)
    try:
        assert len(encode(TEXTS[1], False)) > 4
    finally:
        hf._tokenizer.no_truncation()


def test_a_tokenizer_without_a_rust_backend_has_none():
    class Slow:
        def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
            return [len(text)]

    assert fast_encoder(Slow()) is None


def _random_texts(hf, count: int) -> list[str]:
    import random

    rng = random.Random(34)
    specials = [t.content for t in hf._tokenizer.get_added_tokens_decoder().values()]
    parts = specials + ["<|im_", "im_end|>", "<", "|>", " ", "  ", "\n", "\n\n", "\t", "a", "é", "你好", "😀", "12345",
                        "Hello", " world", "don't", "'s", "...", "system", "user", "assistant"]
    return ["".join(rng.choice(parts) for _ in range(rng.randrange(0, 30))) for _ in range(count)]


def test_the_pieces_give_the_whole_texts_ids(hf):
    """Encoded piece by piece between added tokens (and the pieces kept): the same ids as the whole
    text encoded at once, for texts that join added tokens, their fragments, whitespace and scripts."""
    encode = fast_encoder(hf)
    assert encode is not None
    whole = hf._tokenizer
    texts = TEXTS + _random_texts(hf, 3000)
    for _ in range(2):  # the second time every piece is a kept one
        for text in texts:
            assert encode(text, False) == whole.encode(text, add_special_tokens=False).ids, text
            assert encode(text, True) == hf.encode(text, add_special_tokens=True)


def test_kept_ids_are_not_shared_with_callers(hf):
    encode = fast_encoder(hf)
    assert encode is not None
    first = encode(TEXTS[2], False)
    first.append(-1)
    assert encode(TEXTS[2], False) == hf.encode(TEXTS[2], add_special_tokens=False)


def test_the_kept_pieces_are_bounded():
    from engine_adapter.fast_encode import ENTRY_CHARS, Segments

    class Encoded:
        def __init__(self, text: str) -> None:
            self.ids = [len(text)]

    s = Segments(lambda text, add_special_tokens: Encoded(text), re.compile("(<s>)"), max_chars=3 * (10 + ENTRY_CHARS))
    for i in range(10):
        assert s.encode(f"{i:010d}<s>") == [10, 3]
    assert s._chars <= 3 * (10 + ENTRY_CHARS)
    assert "0000000009" in s._known and "0000000000" not in s._known


@pytest.mark.parametrize("description", [
    {"normalizer": {"type": "Lowercase"}, "pre_tokenizer": None, "model": {"type": "BPE"}, "added_tokens": [{"content": "<s>", "normalized": False}]},
    {"normalizer": None, "pre_tokenizer": {"type": "Metaspace", "prepend_scheme": "first"}, "model": {"type": "BPE"}, "added_tokens": [{"content": "<s>", "normalized": False}]},
    {"normalizer": None, "pre_tokenizer": {"type": "Sequence", "pretokenizers": [{"type": "Split"}, {"type": "Metaspace"}]}, "model": {"type": "BPE"}, "added_tokens": [{"content": "<s>", "normalized": False}]},
    {"normalizer": None, "pre_tokenizer": {"type": "ByteLevel"}, "model": {"type": "BPE", "dropout": 0.1}, "added_tokens": [{"content": "<s>", "normalized": False}]},
    {"normalizer": None, "pre_tokenizer": {"type": "ByteLevel"}, "model": {"type": "Unigram"}, "added_tokens": [{"content": "<s>", "normalized": False}]},
    {"normalizer": None, "pre_tokenizer": {"type": "ByteLevel"}, "model": {"type": "BPE"}, "added_tokens": [{"content": "<s>", "normalized": False, "lstrip": True}]},
    {"normalizer": None, "pre_tokenizer": {"type": "ByteLevel"}, "model": {"type": "BPE"}, "added_tokens": [{"content": "<s>", "normalized": True}]},
])
def test_only_piecewise_tokenizers_are_encoded_by_pieces(description):
    from engine_adapter.fast_encode import segmentable

    assert segmentable(description) is None


def test_the_longest_added_token_wins_at_one_place():
    from engine_adapter.fast_encode import segmentable

    pattern = segmentable({"normalizer": {"type": "NFC"}, "pre_tokenizer": {"type": "Sequence", "pretokenizers": [
        {"type": "Split"}, {"type": "ByteLevel"}]}, "model": {"type": "BPE", "dropout": None}, "added_tokens": [
        {"content": "<a>", "normalized": False}, {"content": "<a>b", "normalized": False}]})
    assert pattern is not None
    assert pattern.split("x<a>by<a>") == ["x", "<a>b", "y", "<a>", ""]


def test_a_long_piece_is_not_kept():
    from engine_adapter.fast_encode import MAX_PIECE, Segments

    class Encoded:
        def __init__(self, text: str) -> None:
            self.ids = [len(text)]

    s = Segments(lambda text, add_special_tokens: Encoded(text), re.compile("(<s>)"))
    assert s.encode("x" * (MAX_PIECE + 1) + "<s>") == [MAX_PIECE + 1, 3]
    assert list(s._known) == ["<s>"]

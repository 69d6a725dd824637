"""fast_encode: the Rust fast path gives exactly transformers' `encode` ids, on the default model's tokenizer."""

from __future__ import annotations

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

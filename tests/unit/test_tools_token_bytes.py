"""A token's real bytes from the vocabulary (logprobs `bytes`), on the default model's tokenizer.

Uses the `tokenizers` library directly (fast to load) behind the three
methods TokenBytes needs, the way an HF/vLLM tokenizer offers them.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from engine_adapter.base import token_text
from engine_adapter.token_bytes import BYTE_DECODER, TokenBytes

TOKENIZER_JSON = Path.home() / ".cache/streamproxy/models/SmolLM2-135M-Instruct/tokenizer.json"


class _HFLike:
    def __init__(self, tok) -> None:
        self.tok = tok

    def get_vocab(self):
        return self.tok.get_vocab()

    def convert_ids_to_tokens(self, token_id):
        return self.tok.id_to_token(token_id)

    def decode(self, ids):
        return self.tok.decode(ids, skip_special_tokens=False)


@pytest.fixture(scope="module")
def smollm():
    if not TOKENIZER_JSON.exists():
        pytest.skip("default model not prepared (python -m engine_adapter.default_model)")
    from tokenizers import Tokenizer

    return _HFLike(Tokenizer.from_file(str(TOKENIZER_JSON)))


def test_byte_table_is_the_gpt2_table():
    assert len(BYTE_DECODER) == 256 and sorted(BYTE_DECODER.values()) == list(range(256))
    assert BYTE_DECODER["Ġ"] == 0x20 and BYTE_DECODER["Ċ"] == 0x0A and BYTE_DECODER["a"] == ord("a")


TEXT = "héllo 你好 😀\n<|im_end|>"


def test_bytes_of_every_token_join_to_the_text(smollm):
    tb = TokenBytes(smollm)
    assert tb.byte_level
    ids = smollm.tok.encode(TEXT).ids
    assert b"".join(tb(i) for i in ids) == TEXT.encode()


def test_half_character_tokens_keep_their_real_bytes(smollm):
    tb = TokenBytes(smollm)
    ids = smollm.tok.encode("你").ids
    pieces = [tb(i) for i in ids]
    assert len(pieces) >= 2  # this tokenizer splits the character
    assert b"".join(pieces) == "你".encode()
    # The decoder alone would have said U+FFFD for each half; the vocabulary knows the bytes.
    assert all(smollm.decode([i]) == "\ufffd" for i in ids)
    assert [token_text(p) for p in pieces] == ["\\xe4\\xbd", "\\xa0"]


def test_special_token_is_its_text(smollm):
    tb = TokenBytes(smollm)
    (eos,) = smollm.tok.encode("<|im_end|>").ids
    assert tb(eos) == b"<|im_end|>"


def test_sentencepiece_pieces():
    class Spm:
        vocab = {"▁hello": 0, "<0xE4>": 1, "wor": 2}

        def get_vocab(self):
            return self.vocab

        def convert_ids_to_tokens(self, token_id):
            return {v: k for k, v in self.vocab.items()}[token_id]

        def decode(self, ids):
            raise AssertionError("not needed")

    tb = TokenBytes(Spm())
    assert not tb.byte_level
    assert [tb(0), tb(1), tb(2)] == [b" hello", b"\xe4", b"wor"]

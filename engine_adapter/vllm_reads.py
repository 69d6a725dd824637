"""The EOS-id read vLLM's input path makes on every request, made cheap once the engine is up.

(Its other per-request reads, of `VLLM_*` variables, are cached by `vllm.envs.enable_envs_cache()`
once the server is up: streamproxy/http/server.py.)

`cheap_eos_id(tokenizer)`: the input processor asks its renderer for the EOS id per request, which
reads `tokenizer.eos_token_id`. On a transformers tokenizer that attribute is not stored: its
`__getattr__` maps it to `eos_token` and converts that to an id, and on vLLM's thread-safe
tokenizer (a `TokenizerPool` subclass, vllm/tokenizers/hf.py) the conversion borrows a copy from
a `queue.Queue`. The tokenizer's class is replaced by a subclass whose `eos_token_id` property reads
`eos_token` (a dict lookup in transformers) and converts it only when it differs from the last one
converted: the same answer, as vLLM's own `get_cached_tokenizer` and `TokenizerPool` subclass the
tokenizer's class in place. A tokenizer without an EOS token, or that is not a transformers one,
is left as it is.
"""

from __future__ import annotations

from typing import Any


def cheap_eos_id(tokenizer: Any) -> bool:
    """Subclass `tokenizer`'s class in place so `eos_token_id` is cheap; False when left as it was."""
    base = type(tokenizer)
    if "eos_token_id" in _class_attrs(base):  # a stored attribute or property already (or ours)
        return False
    token = getattr(tokenizer, "eos_token", None)
    if not isinstance(token, str) or tokenizer.eos_token_id is None:
        return False
    last: list[Any] = [token, tokenizer.convert_tokens_to_ids(token)]

    class CheapEosId(base):  # type: ignore[misc, valid-type]
        @property
        def eos_token_id(self) -> Any:
            current = self.eos_token
            if current != last[0]:
                last[:] = [current, None if current is None else self.convert_tokens_to_ids(current)]
            return last[1]

    CheapEosId.__name__ = base.__name__  # what logs and reprs show stays vLLM's
    CheapEosId.__qualname__ = base.__qualname__
    tokenizer.__class__ = CheapEosId
    return True


def _class_attrs(cls: type) -> set[str]:
    """Names defined on the class or its bases (a property `eos_token_id` already there: nothing to do)."""
    return {name for klass in cls.__mro__ for name in vars(klass)}

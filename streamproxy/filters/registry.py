"""The parsers `--tool-call-parser` and `--reasoning-parser` may name: ours, and those an engine adds.

Ours are known by name (`TOOL_PARSERS.own`, `REASONING_PARSERS.own`); an engine adds a `Source` of its
own (`add`: vLLM's adapter, when its CLI reads the flags and when its engine is made), so the filters
import no engine adapter (tests/unit/test_layers.py). A name resolves to ours first; `PREFIX:NAME`
names a source's parser; any other name goes to the first source that has it. `known` answers the
start-up check, `source` says which source makes a parser.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from streamproxy.filters.detect import AUTO
from streamproxy.filters.hermes import HermesParser
from streamproxy.filters.llama3_json import Llama3JsonParser
from streamproxy.filters.mistral import MistralParser
from streamproxy.filters.pythonic import PythonicParser
from streamproxy.filters.reasoning import OWN_REASONING


@dataclass(frozen=True, slots=True)
class Source:
    """Parsers an engine brings: `has(name)` (its registry holds it), `make(name, ...)` its parser's
    factory (a tool parser's `(name, tokenizer, tools)`, a reasoning parser's `(name, tokenizer,
    template_kwargs, prompt_ids)`); `prefix` + a name always means this source's."""

    prefix: str
    label: str  # for the start-up error: "or a name in <label>"
    has: Callable[[str], bool]
    make: Callable[..., Any]


class Registry:
    def __init__(self, own: Mapping[str, Any]) -> None:
        self.own = own
        self.sources: list[Source] = []

    def add(self, source: Source) -> None:
        """Add (again: replace) the source with this prefix."""
        self.sources = [s for s in self.sources if s.prefix != source.prefix] + [source]

    def known(self, name: str) -> bool:
        return name in self.own or name == AUTO or self.source(name) is not None

    def source(self, name: str) -> tuple[Source, str] | None:
        """The source of a name that is not ours, and the name in it (None: no source has it)."""
        for s in self.sources:
            if name.startswith(s.prefix):
                bare = name.removeprefix(s.prefix)
                return (s, bare) if s.has(bare) else None
        for s in self.sources:
            if s.has(name):
                return s, name
        return None

    def choices(self) -> str:
        """What a name may be, for the start-up error."""
        return "ours: " + ", ".join(sorted(self.own)) + "".join(f"; or a name in {s.label}" for s in self.sources)


TOOL_PARSERS = Registry({
    "hermes": HermesParser,
    "qwen3_json": HermesParser,
    "llama3_json": Llama3JsonParser,
    "llama4_json": Llama3JsonParser,
    "mistral": MistralParser,
    "pythonic": PythonicParser,
})
REASONING_PARSERS = Registry(OWN_REASONING)

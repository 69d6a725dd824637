"""The common ground of the filters that drive one of vLLM's streaming parsers.

vLLM's tool and reasoning parsers are called per delta with the text and
token ids before it, after it, and of the delta itself; `advance` keeps
those for one choice.
"""

from __future__ import annotations

from streamproxy.filters.base import ContentFilter, Part


class VllmParserFilter(ContentFilter):
    def __init__(self) -> None:
        self.text = ""
        self.ids: list[int] = []

    def advance(self, part: Part) -> tuple[str, list[int], list[int]]:
        """Take `part` in: (the text before it, the ids before it, its ids)."""
        prev_text, prev_ids = self.text, self.ids
        new_ids = list(part.token_ids or ())
        self.text += part.text
        self.ids = prev_ids + new_ids
        return prev_text, prev_ids, new_ids

"""Several engine steps' Deltas of one stream coalesced per choice (a slow reader fell behind). Sans-IO."""

from __future__ import annotations

from collections.abc import Sequence

from engine_adapter.base import Delta


def merge_by_index(deltas: Sequence[Delta]) -> list[Delta]:
    """Coalesce several steps' deltas (a slow reader fell behind) per choice."""
    merged: dict[int, Delta] = {}
    for d in deltas:
        prev = merged.get(d.index)
        if prev is None or prev.finish_reason is not None or type(prev.text) is not type(d.text):
            if prev is not None:
                # Cannot merge after a finish or across str/bytes: keep order.
                return list(deltas)
            merged[d.index] = Delta(d.index, d.text, d.num_tokens, d.finish_reason, d.token_ids, d.logprobs)
        else:
            prev.text += d.text  # type: ignore[operator]  # both str or both bytes: checked above
            prev.num_tokens += d.num_tokens
            prev.finish_reason = d.finish_reason
            if d.token_ids:
                prev.token_ids = [*(prev.token_ids or ()), *d.token_ids]
            if d.logprobs:
                prev.logprobs = [*(prev.logprobs or ()), *d.logprobs]
    return list(merged.values())

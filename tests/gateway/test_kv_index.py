"""gateway/kv_index.py: blocks keyed by their tokens, per replica, fed by KV events; prefix queries; bounds.

(test_kv_vllm.py drives vLLM's own KV-cache manager: the index, fed its events, predicts each next
request's prefix-cache hit exactly and holds the blocks its cache holds.)
"""

from __future__ import annotations

from typing import Any

from streamproxy.gateway.kv_events import AllBlocksCleared, BlockRemoved, BlockStored, EngineHash
from streamproxy.gateway.kv_index import KVIndex, PromptKeys, block_keys, prompt_extras

A, B, C = "http://a:8000", "http://b:8000", "http://c:8000"
BS = 4


def store(index: KVIndex, owner: str, hashes: list[EngineHash], tokens: list[int], parent: int | None = None, **kw: Any) -> None:
    index.apply(owner, [BlockStored(hashes, parent, tokens, BS, **kw)])


def cached(index: KVIndex, tokens: list[int], *owners: str, now: float = 0.0, **kw: Any) -> dict[str, int]:
    return index.cached_tokens(PromptKeys(tokens, **kw), owners or index.owners, now)


PROMPT = list(range(100, 114))  # 3 full blocks of 4, and 2 tokens over


def test_stored_blocks_are_found_by_the_prompts_tokens() -> None:
    index = KVIndex()
    store(index, A, [11, 12, 13], PROMPT[:12])
    store(index, B, [21], PROMPT[:4])
    assert cached(index, PROMPT) == {A: 12, B: 4}
    assert cached(index, PROMPT[:9]) == {A: 8, B: 4}  # the prompt's last partial block is never matched
    assert cached(index, [5] + PROMPT[1:]) == {A: 0, B: 0}  # one token differs in the first block: nothing
    assert index.blocks(A) == 3 and index.blocks(B) == 1 and len(index) == 4 and index.block_size(A) == BS


def test_a_block_stored_after_its_parent_chains_on_the_parents_key() -> None:
    index = KVIndex()
    store(index, A, [11, 12], PROMPT[:8])
    store(index, A, [13], PROMPT[8:12], parent=12)  # the next turn's block, after the engine hash 12
    assert cached(index, PROMPT) == {A: 12}
    store(index, B, [23], PROMPT[8:12], parent=99)  # a parent B never announced: left out
    assert index.orphaned == 1 and index.blocks(B) == 0


def test_removed_blocks_cut_the_prefix_where_they_were() -> None:
    index = KVIndex()
    store(index, A, [11, 12, 13], PROMPT[:12])
    index.apply(A, [BlockRemoved([12], "GPU")])
    assert cached(index, PROMPT) == {A: 4}  # block 3 is still held, but a prefix reaches it only through block 2
    index.apply(A, [BlockRemoved([77], "GPU")])
    assert index.unknown_removed == 1 and index.blocks(A) == 2


def test_all_blocks_cleared_resets_the_replica_only() -> None:
    index = KVIndex()
    store(index, A, [11, 12], PROMPT[:8])
    store(index, B, [11, 12], PROMPT[:8])  # (engine hashes are per replica: equal ones mean nothing)
    index.apply(A, [AllBlocksCleared()])
    assert cached(index, PROMPT) == {A: 0, B: 8}
    assert A in index and index.blocks(A) == 0 and index.block_size(A) == 0


def test_a_removed_replica_leaves_no_ownership() -> None:
    index = KVIndex()
    store(index, A, [11, 12], PROMPT[:8])
    store(index, B, [21, 22], PROMPT[:8])
    index.retain([B])
    assert A not in index and index.owners == [B]
    assert cached(index, PROMPT, A, B) == {A: 0, B: 8}
    index.drop(B)
    assert len(index) == 0 and index._holders == {} and index.owners == []


def test_tokens_that_do_not_fill_the_blocks_are_refused() -> None:
    index = KVIndex()
    index.apply(A, [BlockStored([1, 2], None, PROMPT[:7], BS)])
    assert index.unaligned == 1 and len(index) == 0


def test_lora_and_cache_salt_make_blocks_differ() -> None:
    index = KVIndex()
    extras = prompt_extras(3, "adapter", "salt")
    assert extras == [("adapter", "salt"), ("adapter",), ("adapter",)]  # as vLLM publishes them
    store(index, A, [1, 2, 3], PROMPT[:12], lora_name="adapter", extra_keys=[list(e or ()) for e in extras])
    store(index, B, [1, 2, 3], PROMPT[:12], lora_name="adapter")  # a vLLM that sent no extra_keys: the LoRA name
    assert cached(index, PROMPT, lora_name="adapter", cache_salt="salt") == {A: 12, B: 0}
    assert cached(index, PROMPT, lora_name="adapter") == {A: 0, B: 12}
    assert cached(index, PROMPT) == {A: 0, B: 0}  # the base model's prompt is another prompt


def test_a_block_held_in_two_tiers_stays_until_both_remove_it() -> None:
    index = KVIndex()
    store(index, A, [11, 12], PROMPT[:8], medium="GPU")
    store(index, A, [11, 12], PROMPT[:8], medium="CPU")  # offloaded: the same tokens in another tier
    assert index.blocks(A) == 4 and cached(index, PROMPT) == {A: 8}
    index.apply(A, [BlockRemoved([11, 12], "GPU")])
    assert cached(index, PROMPT) == {A: 8}
    index.apply(A, [BlockRemoved([11, 12], "CPU")])
    assert cached(index, PROMPT) == {A: 0} and len(index) == 0


def test_the_longest_prefix_of_several_replicas() -> None:
    index = KVIndex()
    keys = block_keys(PROMPT, BS)
    store(index, A, [1, 2, 3], PROMPT[:12])
    store(index, B, [1, 2], PROMPT[:8])
    store(index, C, [1], PROMPT[:4])
    assert index.longest_prefix(keys, [A, B, C, "http://unknown"], 0.0) == {A: 3, B: 2, C: 1, "http://unknown": 0}
    assert index.longest_prefix(keys[:2], [A, B], 0.0) == {A: 2, B: 2}
    assert index.longest_prefix([], [A], 0.0) == {A: 0}


def test_the_bound_evicts_the_least_recently_stored_of_the_biggest_replica() -> None:
    index = KVIndex(max_blocks=6)
    tokens = list(range(40))
    store(index, A, [1, 2, 3, 4], tokens[:16])
    store(index, B, [5, 6], tokens[:8])
    store(index, A, [1], tokens[:4])  # block 1 announced again (reused, kv_cache_report_mode full): recent
    store(index, B, [7], tokens[8:12], parent=6)
    assert len(index) == 6 and index.evicted == 1
    assert index.blocks(A) == 3 and index.blocks(B) == 3  # A, the biggest, lost its oldest: block 2
    assert cached(index, tokens[:16], A) == {A: 4}  # ... which cuts its prefix after block 1
    for i in range(200):
        store(index, C, [1000 + i], [i] * 4)
    assert len(index) <= 6


def test_speculated_blocks_count_until_their_ttl() -> None:
    index = KVIndex(speculative_ttl=2.0)
    store(index, A, [11], PROMPT[:4])
    store(index, B, [21], PROMPT[:4])
    prompt = PromptKeys(PROMPT)
    index.speculate(A, prompt, now=10.0)
    assert index.cached_tokens(prompt, [A, B], 11.0) == {A: 12, B: 4}
    assert index.cached_tokens(prompt, [A, B], 12.5) == {A: 4, B: 4}
    index.speculate(B, prompt, now=20.0)
    index.reset(B)  # its cache is gone: so are the guesses about it
    assert index.cached_tokens(prompt, [A, B], 20.5) == {A: 4, B: 0}
    assert index._guesses == {} or all(B not in held for held in index._guesses.values())


def test_a_request_waiting_in_its_replicas_queue_keeps_its_speculated_blocks() -> None:
    # The first run's requests waited 10-30 s in the replicas' queues; a 2 s guess was gone before the
    # prefill, so the tenant's next request saw nothing and went elsewhere. The guess lasts the request's
    # life (`hold`), and the TTL from its end (the gateway renews it then).
    index = KVIndex(speculative_ttl=2.0)
    store(index, A, [11], PROMPT[:4])
    store(index, B, [21], PROMPT[:4])
    prompt = PromptKeys(PROMPT)
    index.speculate(A, prompt, now=10.0, hold=600.0)
    index.speculate(B, PromptKeys([7] * 8), now=10.0)  # (another prompt's short guess, due first)
    assert index.cached_tokens(prompt, [A, B], 40.0) == {A: 12, B: 4}  # past the TTL, the request still on
    index.speculate(A, prompt, now=40.0)  # it ended: 2 s more
    assert index.cached_tokens(prompt, [A, B], 41.5) == {A: 12, B: 4}
    assert index.cached_tokens(prompt, [A, B], 42.5) == {A: 4, B: 4}
    index._expire_guesses(700.0)
    assert index._guesses == {} and index._guess_order == []


def test_speculation_is_bounded() -> None:
    index = KVIndex(speculative_ttl=100.0, max_speculative=10)
    store(index, A, [11], PROMPT[:4])
    for i in range(50):
        index.speculate(A, PromptKeys([i] * 40), now=float(i))
    assert len(index._guess_order) <= 10 and sum(len(h) for h in index._guesses.values()) <= 10


def lived(index: KVIndex, tokens: list[int], *owners: str, now: float = 0.0) -> dict[str, int]:
    return index.last_held(PromptKeys(tokens), owners or index.owners, now)


def test_a_removed_block_leaves_a_trace_of_where_it_lived() -> None:
    index = KVIndex()
    store(index, A, [11, 12, 13], PROMPT[:12])
    store(index, B, [21], PROMPT[:4])
    index.apply(A, [BlockRemoved([13, 12], "GPU")])  # (vLLM frees a request's blocks tail first)
    assert cached(index, PROMPT) == {A: 4, B: 4}
    assert lived(index, PROMPT) == {A: 12, B: 4}  # it lived on A
    index.apply(B, [BlockRemoved([21], "GPU")])
    assert lived(index, PROMPT) == {A: 12, B: 4} and len(index._traces) == 3


def test_a_trace_goes_when_its_block_is_stored_again_anywhere() -> None:
    index = KVIndex()
    store(index, A, [11, 12], PROMPT[:8])
    store(index, B, [21], PROMPT[:4])
    index.apply(A, [BlockRemoved([12, 11], "GPU")])
    assert lived(index, PROMPT) == {A: 8, B: 4}
    store(index, B, [22], PROMPT[4:8], parent=21)  # the prefix moved to B: where it lives is known again
    assert lived(index, PROMPT) == {A: 4, B: 8}  # (the first block's trace stays: B did not store it again)
    assert index._traces == {block_keys(PROMPT, BS)[0]: A}
    store(index, B, [21], PROMPT[:4])  # B announces it again (reused)
    assert index._traces == {} and lived(index, PROMPT) == {A: 0, B: 8}


def test_a_cleared_replica_keeps_its_traces_and_a_dropped_one_leaves_none() -> None:
    index = KVIndex()
    store(index, A, [11, 12], PROMPT[:8])
    store(index, B, [21, 22, 23], [9] * 12)
    index.apply(A, [AllBlocksCleared()])  # a restart: what lived there is still where it belongs
    assert index.block_size(A) == 0 and cached(index, PROMPT, A) == {A: 0}
    assert lived(index, PROMPT, A) == {A: 8}  # (by the block size A had)
    index.apply(B, [BlockRemoved([23], "GPU")])
    index.drop(A)
    assert lived(index, PROMPT, A, B) == {A: 0, B: 0}
    assert list(index._traces.values()) == [B]


def test_traces_are_bounded_oldest_first() -> None:
    index = KVIndex(max_traces=3)
    tokens = list(range(40))
    store(index, A, [1, 2, 3, 4, 5], tokens[:20])
    index.apply(A, [BlockRemoved([5, 4, 3, 2], "GPU")])
    assert list(index._traces) == block_keys(tokens, BS)[3:0:-1]  # block 5's trace went first
    assert lived(index, tokens[:20], A) == {A: 16}
    assert KVIndex(max_traces=0)._traces == {}
    index = KVIndex(max_traces=0)
    store(index, A, [1, 2], tokens[:8])
    index.apply(A, [BlockRemoved([2], "GPU")])
    assert index._traces == {} and lived(index, tokens[:8], A) == {A: 4}


def test_blocks_forgotten_for_the_bound_leave_traces() -> None:
    index = KVIndex(max_blocks=2)
    store(index, A, [1, 2, 3], PROMPT[:12])
    assert index.evicted == 1 and cached(index, PROMPT, A) == {A: 0}  # its first block went
    assert lived(index, PROMPT, A) == {A: 12}

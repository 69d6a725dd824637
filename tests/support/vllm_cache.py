"""vLLM's own KV-cache manager, driven by token ids: the cache a replica would hold and the events it would publish.

`VllmCache(block_size, blocks)` is the scheduler's `KVCacheManager` (prefix
caching and KV events on, one full-attention group) without an engine:
`run(id, token_ids)` allocates a request's prompt as the scheduler does
(reusing a cached prefix) and frees it (its blocks stay cached until
evicted), `take()` the events it queued, `payload()` them as the bytes the publisher would send,
`reset()` its prefix cache, and `cached()` the block hashes it holds now, as
the events name them. vLLM is imported when one is made (about 9 s the
first time in a process).
"""

from __future__ import annotations

from typing import Any


class VllmCache:
    def __init__(self, block_size: int = 16, blocks: int = 64) -> None:
        import torch
        from vllm.utils.hashing import sha256
        from vllm.v1.core.kv_cache_manager import KVCacheManager
        from vllm.v1.core.kv_cache_utils import get_request_block_hasher, init_none_hash
        from vllm.v1.kv_cache_interface import FullAttentionSpec, KVCacheConfig, KVCacheGroupSpec

        init_none_hash(sha256)
        spec = FullAttentionSpec(block_size=block_size, num_kv_heads=1, head_size=8, dtype=torch.float16)
        config = KVCacheConfig(num_blocks=blocks, kv_cache_tensors=[], kv_cache_groups=[KVCacheGroupSpec(["layer.0"], spec)])
        self.block_size = block_size
        self.manager = KVCacheManager(config, max_model_len=blocks * block_size, scheduler_block_size=block_size,
                                      hash_block_size=block_size, enable_caching=True, enable_kv_cache_events=True)
        self._hasher = get_request_block_hasher(block_size, sha256)

    def run(self, request_id: str, token_ids: list[int], *, lora: tuple[str, int] | None = None,
            cache_salt: str | None = None, keep: bool = False, report_reused: bool = False) -> int:
        """Schedule the prompt (its cached prefix reused), then free it unless `keep`. Returns the tokens it hit.
        `report_reused`: the request asks for BlockStored events of the blocks it reuses too
        (`vllm_xargs: {"kv_cache_report_mode": "full"}`)."""
        from vllm.lora.request import LoRARequest
        from vllm.sampling_params import SamplingParams
        from vllm.v1.request import Request

        lora_request = LoRARequest(lora[0], lora[1], f"/adapters/{lora[0]}") if lora else None
        params = SamplingParams(max_tokens=1, extra_args={"kv_cache_report_mode": "full"} if report_reused else None)
        request = Request(request_id, list(token_ids), params, None, block_hasher=self._hasher,
                          lora_request=lora_request, cache_salt=cache_salt)
        computed, hit, _ = self.manager.get_computed_blocks(request)
        if self.manager.allocate_slots(request, len(token_ids) - hit, hit, computed) is None:
            raise RuntimeError("the cache has no room for this prompt")
        if not keep:
            self.manager.free(request)
        return int(hit)

    def take(self) -> list[Any]:
        return list(self.manager.take_events())

    def payload(self) -> bytes:
        """The events queued, as the bytes of the batch vLLM's publisher would send (its msgspec encoder)."""
        import msgspec
        from vllm.distributed.kv_events import KVEventBatch

        return msgspec.msgpack.Encoder().encode(KVEventBatch(ts=0.0, events=self.take()))

    def reset(self) -> bool:
        return bool(self.manager.reset_prefix_cache())

    def cached(self) -> set[Any]:
        """The hashes of the blocks in the prefix cache now, as its events name them."""
        from vllm.v1.core.kv_cache_utils import get_block_hash, maybe_convert_block_hash

        pool = self.manager.block_pool
        return {maybe_convert_block_hash(get_block_hash(key)) for key in pool.cached_block_hash_to_block._cache}

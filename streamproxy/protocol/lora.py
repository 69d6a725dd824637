"""vLLM's run-time LoRA routes' bodies: POST /v1/load_lora_adapter and /v1/unload_lora_adapter."""

from __future__ import annotations

import msgspec


class LoadLoRAAdapterRequest(msgspec.Struct):
    lora_name: str
    lora_path: str
    load_inplace: bool = False  # reload a loaded adapter (under its id) instead of a 400
    is_3d_lora_weight: bool = False  # vLLM's MoE weight layout switch; accepted, not used


class UnloadLoRAAdapterRequest(msgspec.Struct):
    lora_name: str
    lora_int_id: int | None = None  # vLLM accepts it and ignores it


decode_load = msgspec.json.Decoder(LoadLoRAAdapterRequest).decode
decode_unload = msgspec.json.Decoder(UnloadLoRAAdapterRequest).decode

"""LoRA adapters served beside the base model, the way `vllm serve` does it; sans-IO.

`parse_lora_modules` reads `--lora-modules` as vLLM's `LoRAParserAction` does (`name=path`, a JSON
object, or a JSON list of them). `AdapterRegistry` is the table of served names (vLLM's
`lora_requests`), each an `Adapter` with an id from 1 up, kept on reload. `plan_load`/`remove` apply
vLLM's checks for the load/unload routes (400, 404); the engine loads the weights between `plan_load`
and `add`.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Iterator

import msgspec

from engine_adapter.base import Adapter
from streamproxy.errors import InvalidRequest, ModelNotFound


class LoRAModule(msgspec.Struct, kw_only=True, forbid_unknown_fields=True):
    """One `--lora-modules` entry (vLLM's `LoRAModulePath`)."""

    name: str
    path: str
    base_model_name: str | None = None
    is_3d_lora_weight: bool = False  # accepted as vLLM does; only MoE models read it


def parse_lora_modules(values: Iterable[str]) -> list[LoRAModule]:
    """Every entry of the flag's values, in order (ValueError says which value is wrong and why)."""
    found: list[LoRAModule] = []
    for value in values:
        value = value.strip()
        if not value:
            continue
        if "=" in value and not value.startswith(("{", "[")):
            name, path = value.split("=", 1)
            if not name or not path:
                raise ValueError(f"--lora-modules {value!r}: expected name=path")
            found.append(LoRAModule(name=name, path=path))
            continue
        try:
            data = json.loads(value)
        except ValueError:
            raise ValueError(f"Invalid JSON format for --lora-modules: {value}") from None
        try:
            found += msgspec.convert(data if isinstance(data, list) else [data], list[LoRAModule])
        except msgspec.ValidationError as exc:
            raise ValueError(f"Invalid fields for --lora-modules: {value} - {exc}") from None
    names = [m.name for m in found]
    twice = sorted({n for n in names if names.count(n) > 1})
    if twice:
        raise ValueError(f"--lora-modules names an adapter more than once: {', '.join(twice)}")
    return found


class AdapterRegistry:
    """Served adapter names -> `Adapter`, beside the base model's served names."""

    def __init__(self, base_names: Iterable[str]) -> None:
        self._base = list(base_names)
        self._adapters: dict[str, Adapter] = {}
        self._next_id = 1

    def __len__(self) -> int:
        return len(self._adapters)

    def __contains__(self, name: object) -> bool:
        return name in self._adapters

    def __iter__(self) -> Iterator[Adapter]:
        return iter(list(self._adapters.values()))

    def get(self, name: str | None) -> Adapter | None:
        return None if name is None else self._adapters.get(name)

    def plan_load(self, name: str, path: str, *, parent: str | None = None, replace: bool = False) -> Adapter:
        """The adapter a load request describes (not yet served: `add` it once the engine has loaded it).

        `parent` is the base model it belongs to when that is a served name (else the first
        served name, as vLLM); `replace` reloads a loaded adapter in place, under its id.
        """
        if not name or not path:
            raise InvalidRequest("Both 'lora_name' and 'lora_path' must be provided.", param="lora_name" if not name else "lora_path")
        if name in self._base:
            raise InvalidRequest(f"The lora adapter '{name}' conflicts with a served base model.", param="lora_name")
        loaded = self._adapters.get(name)
        if loaded is not None and not replace:
            raise InvalidRequest(
                f"The lora adapter '{name}' has already been loaded. If you want to load the adapter in place, "
                "set 'load_inplace' to True.",
                param="lora_name",
            )
        if loaded is not None:
            adapter_id = loaded.id
        else:
            adapter_id, self._next_id = self._next_id, self._next_id + 1
        base = parent if parent in self._base else self._base[0]
        return Adapter(name=name, id=adapter_id, path=path, parent=base)

    def add(self, adapter: Adapter) -> None:
        self._adapters[adapter.name] = adapter

    def remove(self, name: str) -> Adapter:
        if not name:
            raise InvalidRequest("'lora_name' needs to be provided to unload a LoRA adapter.", param="lora_name")
        adapter = self._adapters.pop(name, None)
        if adapter is None:
            raise ModelNotFound(f"The lora adapter '{name}' cannot be found.", param="lora_name")
        return adapter

"""The LoRA adapters a server knows by name (`--lora-modules NAME=PATH`), each with
the integer id its sequences carry (0 is the base model). Pure bookkeeping shared by
the API (a request's `model` names one) and the runner (which loads it by id)."""

from __future__ import annotations

from collections.abc import Iterator

import attrs

BASE_LORA_ID = 0


@attrs.frozen
class LoraModule:
    name: str
    path: str
    lora_id: int


@attrs.define
class LoraModules:
    """Adapters by name and by id; ids are never reused, so a sequence of a removed
    adapter cannot pick up a later one's weights or cached blocks. A removed
    adapter keeps its id (`with_id`), so sequences already running through it
    finish under it; only its name is gone."""

    # How many adapters the runner keeps loaded (set when it serves them; 0: it does not).
    max_loras: int = 0
    _by_name: dict[str, LoraModule] = attrs.field(factory=dict)
    _by_id: dict[int, LoraModule] = attrs.field(factory=dict)
    _next_id: int = BASE_LORA_ID + 1

    @classmethod
    def of(cls, pairs: dict[str, str]) -> LoraModules:
        modules = cls()
        for name, path in pairs.items():
            modules.add(name, path)
        return modules

    def add(self, name: str, path: str) -> LoraModule:
        """Register adapter `name` at `path`; ValueError if the name is taken."""
        if name in self._by_name:
            raise ValueError(f"a LoRA adapter named {name!r} is already loaded")
        module = LoraModule(name, path, self._next_id)
        self._next_id += 1
        self._by_name[name] = module
        self._by_id[module.lora_id] = module
        return module

    def remove(self, name: str) -> LoraModule:
        """Forget adapter `name` (new requests cannot name it); KeyError if there is none."""
        return self._by_name.pop(name)

    def named(self, name: str) -> LoraModule | None:
        return self._by_name.get(name)

    def with_id(self, lora_id: int) -> LoraModule | None:
        return self._by_id.get(lora_id)

    def __iter__(self) -> Iterator[LoraModule]:
        return iter(list(self._by_name.values()))

    def __len__(self) -> int:
        return len(self._by_name)

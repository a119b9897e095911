"""The adapters resident in the runner: loaded on first use, at most `max_loras`
kept (least recently used dropped first), never one a step is using."""

from __future__ import annotations

import logging
from collections import OrderedDict
from collections.abc import Sequence

import torch

from sluiceway.engine.batch import ScheduledChunk
from sluiceway.engine.lora_modules import BASE_LORA_ID, LoraModule, LoraModules
from sluiceway.runner.lora.adapter import AdapterError, LoraAdapter, load_adapter
from sluiceway.runner.lora.rows import LoraRows, StackedAdapters

log = logging.getLogger(__name__)


class LoraTable:
    """Adapters of `modules` for one `DecoderModel`, by lora id.

    `max_loras` bounds the adapters kept between steps (the scheduler keeps a
    step's to as many); a step whose chunks name more loads them all for that
    step and drops the surplus afterwards. `kernel` is how the deltas run:
    "torch" (a loop over the step's adapters), "triton" (`kernels/lora_delta.py`,
    the step's adapters stacked by slot) or "auto" (triton on CUDA).
    """

    def __init__(self, model, modules: LoraModules, *, max_loras: int, max_rank: int) -> None:
        if max_loras < 1:
            raise ValueError("--max-loras must be at least 1")
        self.model = model
        self.modules = modules
        self.max_loras = max_loras
        self.max_rank = max_rank
        self._resident: OrderedDict[int, LoraAdapter] = OrderedDict()
        self.loads = 0
        self.kernel = "auto"
        # The last step's adapters stacked for the triton kernel: decode steps
        # keep the same set for many steps, so each set is stacked once.
        self._stacked: StackedAdapters | None = None

    def load(self, module: LoraModule) -> LoraAdapter:
        """`module`'s adapter read and checked against the model (AdapterError)."""
        model = self.model
        arch = model.architecture
        dense = [layer.gate_up for layer in model.layers if layer.gate_up is not None]
        moe = frozenset(i for i in range(model.shape.num_layers) if arch.is_moe(i))
        adapter = load_adapter(
            module.name,
            module.path,
            model.shape,
            intermediate_size=dense[0].out_features // 2 if dense else 0,
            max_rank=self.max_rank,
            dtype=model.dtype,
            device=model.device,
            moe_layers=moe,
        )
        self.loads += 1
        return adapter

    def check(self, name: str, path: str) -> None:
        """Read and check adapter `name` at `path` without keeping it (AdapterError)."""
        self.load(LoraModule(name, path, BASE_LORA_ID))

    def check_all(self) -> None:
        """Load every known adapter once (AdapterError for the first bad one), keeping
        the first `max_loras` resident."""
        for module in self.modules:
            adapter = self.load(module)
            if len(self._resident) < self.max_loras:
                self._resident[module.lora_id] = adapter

    @property
    def resident_ids(self) -> list[int]:
        return list(self._resident)

    def adapter(self, lora_id: int) -> LoraAdapter:
        """The adapter of `lora_id`, loaded if it is not resident."""
        adapter = self._resident.get(lora_id)
        if adapter is not None:
            self._resident.move_to_end(lora_id)
            return adapter
        module = self.modules.with_id(lora_id)
        if module is None:
            raise AdapterError(f"no LoRA adapter has id {lora_id}")
        adapter = self.load(module)
        self._resident[lora_id] = adapter
        log.info("LoRA adapter %r loaded", module.name)
        return adapter

    def forget(self, lora_id: int) -> None:
        self._resident.pop(lora_id, None)

    def rows(self, chunks: Sequence[ScheduledChunk], device: torch.device) -> LoraRows | None:
        """The step's `LoraRows` (None: every row is the base model's), loading the
        adapters it names and dropping the least recently used beyond `max_loras`."""
        ids = [c.lora_id for c in chunks]
        if not any(i != BASE_LORA_ID for i in ids):
            return None
        by_id = {i: self.adapter(i) for i in set(ids) if i != BASE_LORA_ID}
        for stale in list(self._resident):
            if len(self._resident) <= self.max_loras:
                break
            if stale not in by_id:
                del self._resident[stale]
        row_adapters = [by_id.get(i) for i in ids]
        counts = [len(c.token_ids) for c in chunks]
        if self.kernel == "triton" or (self.kernel == "auto" and torch.device(device).type == "cuda"):
            step = tuple(by_id[i] for i in sorted(by_id))
            if self._stacked is None or not self._stacked.holds(step):
                self._stacked = StackedAdapters(step)
            return LoraRows.stacked_rows(self._stacked, row_adapters, counts, device)
        return LoraRows.of(row_adapters, counts, device)

"""LoRA adapters on the runner's base model: PEFT directories loaded into our fused
linears' layout (`adapter`), the resident set (`table`) and the deltas of a step
that mixes adapters and the base model row by row (`rows`)."""

from sluiceway.runner.lora.adapter import AdapterError, LoraAdapter, load_adapter
from sluiceway.runner.lora.rows import LoraRows
from sluiceway.runner.lora.table import LoraTable

__all__ = ["AdapterError", "LoraAdapter", "LoraRows", "LoraTable", "load_adapter"]

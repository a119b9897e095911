"""The paged KV cache: the memory layout every attention backend reads and writes.

The layout is fixed (the triton kernels in `runner/kernels/` are written against it):
per layer one key tensor and one value tensor, each contiguous with shape
`[num_blocks, block_size, num_kv_heads, head_dim]`. Token position `pos` of a
sequence lives in slot `block_table[pos // block_size] * block_size + pos % block_size`,
i.e. row `slot` of the `[num_blocks * block_size, num_kv_heads, head_dim]` view.
"""

from __future__ import annotations

import attrs
import torch


def kv_cache_bytes_per_block(
    *, num_layers: int, block_size: int, num_kv_heads: int, head_dim: int, dtype: torch.dtype
) -> int:
    """Bytes one block costs across all layers, keys and values together."""
    itemsize = torch.empty((), dtype=dtype).element_size()
    return 2 * num_layers * block_size * num_kv_heads * head_dim * itemsize


def num_blocks_for_budget(budget_bytes: int, bytes_per_block: int) -> int:
    """How many whole blocks fit in `budget_bytes`; raises ValueError when not even one does."""
    blocks = int(budget_bytes) // bytes_per_block
    if blocks < 1:
        raise ValueError(
            f"KV cache budget of {budget_bytes} bytes holds no block ({bytes_per_block} bytes each)"
        )
    return blocks


@attrs.define
class KVCache:
    """Key and value tensors for every layer, allocated once and zero-filled.

    Blocks carry no ownership here: the engine's block manager decides which
    sequence uses which block; the runner only writes and reads the slots named in
    each step's metadata.
    """

    key_caches: list[torch.Tensor]
    value_caches: list[torch.Tensor]
    block_size: int

    @classmethod
    def allocate(
        cls,
        *,
        num_layers: int,
        num_blocks: int,
        block_size: int,
        num_kv_heads: int,
        head_dim: int,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
    ) -> KVCache:
        if num_blocks < 1 or block_size < 1:
            raise ValueError("num_blocks and block_size must be at least 1")
        shape = (num_blocks, block_size, num_kv_heads, head_dim)
        keys = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        values = [torch.zeros(shape, dtype=dtype, device=device) for _ in range(num_layers)]
        return cls(key_caches=keys, value_caches=values, block_size=block_size)

    @property
    def num_blocks(self) -> int:
        return self.key_caches[0].shape[0]

    @property
    def num_layers(self) -> int:
        return len(self.key_caches)

    def flat_views(self, layer: int) -> tuple[torch.Tensor, torch.Tensor]:
        """The layer's caches as `[num_slots, num_kv_heads, head_dim]` views (no copy)."""
        k, v = self.key_caches[layer], self.value_caches[layer]
        return k.view(-1, k.shape[2], k.shape[3]), v.view(-1, v.shape[2], v.shape[3])

    def write(
        self, layer: int, slot_mapping: torch.Tensor, k: torch.Tensor, v: torch.Tensor
    ) -> None:
        """Store `k`, `v` (`[T, num_kv_heads, head_dim]`) at `slot_mapping` (`[T]` int64)."""
        k_flat, v_flat = self.flat_views(layer)
        k_flat.index_copy_(0, slot_mapping, k.to(k_flat.dtype))
        v_flat.index_copy_(0, slot_mapping, v.to(v_flat.dtype))

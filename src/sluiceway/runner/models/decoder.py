"""`DecoderModel`: the forward pass of every family, over a flattened batch.

Tokens from many sequences are concatenated into one `[T]` batch with no padding;
only attention needs to know where one sequence ends (see `runner/attention.py`).
Numerics follow transformers' implementations (RMSNorm in float32, RoPE tables in
float32, rotate-half layout) so greedy output matches `generate`. What differs
between families is read from their `Architecture`: q/k norms, layers without
RoPE, partial rotation, experts, sliding windows, Gemma's norms and soft caps.
The fused C paths run only Llama's layer; a model with another one keeps torch's
ops for those steps and says why in the log. Layers that need a sliding window
narrower than the step's context, or soft-capped logits, attend through
`masked_attention`; the rest through the attention backend.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping

import torch
import torch.nn.functional as F

from sluiceway.runner.attention import AttentionBackend, AttentionMetadata, TorchAttention
from sluiceway.runner.kv_cache import KVCache
from sluiceway.runner.linear import Linear, default_quantized_max_rows
from sluiceway.runner.lora.rows import LoraRows
from sluiceway.runner.masked_attention import MaskedAttentionPlan, masked_attention
from sluiceway.runner.models.architecture import Architecture
from sluiceway.runner.models.layer import (
    LayerWeights,
    StoredQuantized,
    Weights,
    gemma_rms_norm,
    layer_weights,
)
from sluiceway.runner.models.registry import family_for
from sluiceway.runner.models.rope import apply_rope, rope_frequencies
from sluiceway.runner.models.weights import read_all
from sluiceway.runner.native.decode_one import OneTokenDecode
from sluiceway.runner.native.int8_dot import TiledWeight, unpack_rows
from sluiceway.runner.native.layer_ops import NativeLayerOps, layer_ops_for

log = logging.getLogger(__name__)


class DecoderModel:
    """A decoder-only transformer of any registered family: weights plus the forward
    pass. Holds no per-sequence state."""

    def __init__(
        self,
        config,
        weights: Mapping[str, torch.Tensor],
        *,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
        quantization: str | None = None,
        native_ops: bool | None = None,
        stored: StoredQuantized | None = None,
        dense_copies: bool = False,
    ) -> None:
        """`weights` are canonical (`models.weights`); `from_checkpoint` maps a
        transformers state dict onto them. `stored` gives int4 and int8 linears
        the checkpoint's own blocks (`checkpoint.stored_int4`); `dense_copies` keeps a
        dense copy beside every quantized weight, for faster calls of many rows
        (`linear.Linear`'s `dense_copy`) at several times the memory."""
        self.architecture: Architecture = family_for(config).architecture(config)
        self.shape = self.architecture.shape
        self.dtype = dtype
        self.device = torch.device(device)
        w = Weights(weights, dtype, self.device, stored=stored, dense_copies=dense_copies)
        arch = self.architecture
        tied = arch.tie_word_embeddings
        head_max_rows = default_quantized_max_rows(dtype, output_head=True)
        # A head the checkpoint stores in 4-bit blocks is served as stored, as
        # llama.cpp serves it, and an embedding stored so is looked up in its
        # blocks (`int8_dot.unpack_rows`), never held as values; tied, both are
        # one copy, the head's tiles.
        if quantization not in ("int4", "int8"):
            stored = None
        stored_head = None if stored is None else stored(["embed" if tied else "lm_head"], None)
        self.embed_rows: TiledWeight | None = None
        if tied and stored_head is not None and stored_head.tiled is not None:
            self.embed_rows = stored_head.tiled
        elif stored is not None:
            self.embed_rows = stored.rows("embed")
        self.embed = w.need("embed") if self.embed_rows is None else None
        self.final_norm = w.gemma_norm("final_norm") if arch.gemma_norms else w.need("final_norm")
        # transformers rounds the embedding scale to the weights' dtype first.
        self.embed_scale = (
            None
            if arch.embed_scale is None
            else torch.tensor(arch.embed_scale, dtype=dtype, device=self.device)
        )
        if stored_head is not None:
            self.lm_head = Linear.from_quantized(
                stored_head, dtype, quantized_max_rows=head_max_rows, dense_copy=dense_copies
            )
        else:
            # The output projection is the most quantization-sensitive weight; like
            # llama.cpp's 4-bit formats, int4 keeps it at 8 bits: a 4-bit head costs
            # far more perplexity than all the 4-bit layers together
            # (benchmarks/quantization_quality.py).
            head = self.embed if tied else w.get("lm_head")
            self.lm_head = Linear(
                w.need("embed") if head is None else head,
                quantization="int8" if quantization == "int4" else quantization,
                quantized_max_rows=head_max_rows,
                dense_copy=dense_copies,
            )
            # The head's values (a gigabyte at 128k tokens by 4096 in bfloat16)
            # are the quantized head's now: not held while the layers load.
            del head
        self.layers = [
            layer_weights(self.architecture, w, i, quantization)
            for i in range(self.shape.num_layers)
        ]
        # One RoPE table per kind of layer (Gemma 3's local and global layers
        # rotate with different bases); the kind "" when every layer shares one.
        self.rope: dict[str, tuple[torch.Tensor, float]] = {}
        for kind in set(arch.rope_kinds) or {""}:
            inv_freq, scaling = rope_frequencies(config, self.shape.head_dim, kind or None)
            self.rope[kind] = (inv_freq.to(self.device), scaling)
        # RMSNorm, residual adds and SiLU-and-multiply: C kernels on the CPU for
        # bfloat16, and for float32 when quantized (unquantized float32 keeps torch's
        # ops, exactly what transformers computes), as `layer_ops_for` says.
        self.ops = layer_ops_for(dtype, self.device, native_ops, exact_float32=quantization is None)
        # Steps of one sequence and one token run every layer in one C call where
        # the weights allow (`OneTokenDecode`); False keeps the Python layer loop.
        self.fuse_one_token_steps = self.architecture.llama_layers
        why = self.architecture.why_not_llama_layers
        if why is not None and isinstance(self.ops, NativeLayerOps):
            log.info(
                "%s: the fused C RoPE and one-call decode step are off (%s); "
                "its layers run on the other native ops and torch",
                self.architecture.model_type,
                why,
            )
        self._one_token: tuple[KVCache, OneTokenDecode | None] | None = None
        # The LoRA adapters of the step being run, row by row (`runner/lora/`), set
        # by the runner around a forward pass; None: every row is the base model's.
        self.lora_rows: LoraRows | None = None
        # Whether any layer may ever need masked attention: the per-step check
        # over the layers is skipped for the models (most) where none can.
        self._may_mask = arch.attn_softcap is not None or any(
            w is not None for w in arch.layer_windows
        )

    @classmethod
    def from_checkpoint(
        cls, config, state_dict: Mapping[str, torch.Tensor], **kwargs
    ) -> DecoderModel:
        """The model of a transformers `config` and its `state_dict`."""
        views = family_for(config).weight_views(config, state_dict)
        return cls(config, read_all(views, state_dict), **kwargs)

    def rope_tables(
        self, positions: torch.Tensor, kind: str = ""
    ) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin `[T, 1, rotary_dim]` of RoPE table `kind` in the model
        dtype, computed in float32 like transformers; the sin table's first half is
        negated for `apply_rope`."""
        inv_freq, scaling = self.rope[kind]
        freqs = positions.to(torch.float32)[:, None] * inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = (emb.cos() * scaling).to(self.dtype)
        sin = (emb.sin() * scaling).to(self.dtype)
        half = sin.shape[-1] // 2
        sin[:, :half].neg_()
        return cos[:, None, :], sin[:, None, :]

    def forward(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attention: AttentionBackend,
        meta: AttentionMetadata,
        logits_indices: torch.Tensor,
    ) -> torch.Tensor:
        """Run `input_ids [T]` at `positions [T]`, filling the KV cache, and return float32
        logits `[len(logits_indices), vocab]` for the rows named by `logits_indices` only."""
        hidden = self.hidden_states(input_ids, positions, attention, meta)
        return self.logits(self.final_normed(hidden[logits_indices]))

    def hidden_states(
        self,
        input_ids: torch.Tensor,
        positions: torch.Tensor,
        attention: AttentionBackend,
        meta: AttentionMetadata,
    ) -> torch.Tensor:
        """Run `input_ids [T]` at `positions [T]`, filling the KV cache, and return the
        residual stream `[T, hidden]` after the last layer (before the final norm)."""
        tables = {kind: self.rope_tables(positions, kind) for kind in self.rope}
        eps = self.shape.rms_norm_eps
        hidden = self.embed_tokens(input_ids)
        if self.embed_scale is not None:
            hidden = hidden * self.embed_scale
        arch = self.architecture
        masked = None
        if self._may_mask and any(
            arch.needs_masked_attention(i, meta.max_seq_len) for i in range(len(self.layers))
        ):
            masked = MaskedAttentionPlan(meta, attention.kv_cache)
        one_token = None
        if input_ids.shape[0] == 1 and masked is None and self.lora_rows is None:
            one_token = self._one_token_decode(attention, meta)
        if one_token is not None:
            hidden = one_token.run(hidden, *tables[""], meta, eps)
        elif arch.gemma_norms:
            hidden = self._gemma_layers(hidden, tables, attention, meta, masked)
        else:
            hidden = self._layers(hidden, tables, attention, meta, masked)
        return hidden

    def final_normed(self, hidden: torch.Tensor) -> torch.Tensor:
        """Rows of the residual stream through the final norm: what the LM head reads,
        and what transformers calls the last hidden state."""
        eps = self.shape.rms_norm_eps
        if self.architecture.gemma_norms:
            return gemma_rms_norm(hidden, self.final_norm, eps)
        return self.ops.rms_norm(hidden, self.final_norm, eps)

    def logits(self, normed: torch.Tensor) -> torch.Tensor:
        """float32 logits of final-normed rows, soft-capped where the model caps them."""
        logits = self.output_logits(normed)
        cap = self.architecture.final_softcap
        if cap is not None:
            logits = torch.tanh(logits / cap) * cap
        return logits

    # Three seams a tensor-parallel shard overrides (`runner/tensor_parallel/`): on
    # one device they are the plain operations.
    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The embeddings `[T, hidden]` of `input_ids`."""
        if self.embed_rows is not None:
            return unpack_rows(self.embed_rows, input_ids, self.dtype)
        assert self.embed is not None
        return F.embedding(input_ids, self.embed)

    def output_logits(self, normed: torch.Tensor) -> torch.Tensor:
        """float32 logits of the final-normed rows `normed`."""
        return self.lm_head(normed).to(torch.float32)

    def reduce(self, partial: torch.Tensor) -> torch.Tensor:
        """The output of a row-parallel projection (o, down) summed over shards:
        with the whole weight here, `partial` already is that sum."""
        return partial

    def _layers(self, hidden, tables, attention, meta, masked) -> torch.Tensor:
        """Every decoder layer on the embeddings `hidden`: the residual stream after the
        last one."""
        ops, eps, last = self.ops, self.shape.rms_norm_eps, len(self.layers) - 1
        # The residual stream: each add is fused with the RMSNorm that reads its result.
        x = ops.rms_norm(hidden, self.layers[0].input_norm, eps)
        for i, layer in enumerate(self.layers):
            attended = self._attention(i, layer, x, tables, attention, meta, masked)
            hidden, x = ops.add_rms_norm(hidden, attended, layer.post_norm, eps)
            mlp = self.reduce(self._mlp(layer, x, i))
            if i < last:
                hidden, x = ops.add_rms_norm(hidden, mlp, self.layers[i + 1].input_norm, eps)
            else:
                hidden = hidden + mlp
        return hidden

    def _gemma_layers(self, hidden, tables, attention, meta, masked) -> torch.Tensor:
        """Gemma's layer: each sublayer's output normalised before its residual add,
        and the MLP's input normalised by a norm of its own."""
        eps = self.shape.rms_norm_eps
        for i, layer in enumerate(self.layers):
            x = gemma_rms_norm(hidden, layer.input_norm, eps)
            attended = self._attention(i, layer, x, tables, attention, meta, masked)
            hidden = hidden + gemma_rms_norm(attended, layer.post_norm, eps)
            assert layer.pre_mlp_norm is not None and layer.post_mlp_norm is not None
            x = gemma_rms_norm(hidden, layer.pre_mlp_norm, eps)
            mlp = self.reduce(self._mlp(layer, x, i))
            hidden = hidden + gemma_rms_norm(mlp, layer.post_mlp_norm, eps)
        return hidden

    def _linear(self, i: int, name: str, linear: Linear, x: torch.Tensor) -> torch.Tensor:
        """Layer `i`'s fused linear `name` on `x`, plus the LoRA delta of each row's
        adapter (computed apart from the weight, in the activation dtype, so a
        quantized weight takes adapters as a dense one does)."""
        y = linear(x)
        if self.lora_rows is not None:
            y = self.lora_rows.add_delta(y, x, i, name)
        return y

    def _mlp(self, layer: LayerWeights, x: torch.Tensor, i: int) -> torch.Tensor:
        if layer.experts is not None:
            return layer.experts(x, self.ops.silu_mul)
        assert layer.gate_up is not None and layer.down is not None
        gate_up = self._linear(i, "gate_up", layer.gate_up, x)
        if self.architecture.activation == "silu":
            return self._linear(i, "down", layer.down, self.ops.silu_mul(gate_up))
        gate, up = gate_up.chunk(2, dim=-1)
        return self._linear(i, "down", layer.down, F.gelu(gate, approximate="tanh") * up)

    def _one_token_decode(
        self, attention: AttentionBackend, meta: AttentionMetadata
    ) -> OneTokenDecode | None:
        """The fused C step for a step of one sequence and one token, where this
        model and backend have one (int4 weights with the native packing, native
        layer ops and decode attention; built on first use per KV cache)."""
        if not self.fuse_one_token_steps:
            return None
        cache = attention.kv_cache
        if self._one_token is None or self._one_token[0] is not cache:
            eligible = (
                isinstance(self.ops, NativeLayerOps)
                and isinstance(attention, TorchAttention)
                and attention.native_decode
            )
            self._one_token = (
                cache,
                OneTokenDecode.build(self.shape, self.layers, cache, eligible),
            )
        fused = self._one_token[1]
        return fused if fused is not None and fused.serves(cache, meta) else None

    def _attention(
        self, i, layer: LayerWeights, x, tables, attention, meta, masked
    ) -> torch.Tensor:
        """Self-attention of layer `i` on its normalised input `x`."""
        s, arch = self.shape, self.architecture
        cos, sin = tables[arch.rope_kinds[i] if arch.rope_kinds else ""]
        attend = attention.forward
        if masked is not None and arch.needs_masked_attention(i, meta.max_seq_len):

            def attend(layer_index, q, k, v, meta, kv_written=False):
                return masked_attention(
                    layer_index,
                    q,
                    k,
                    v,
                    meta,
                    masked,
                    attention.kv_cache,
                    window=arch.window(i),
                    softcap=arch.attn_softcap,
                    kv_written=kv_written,
                )

        qkv = self._linear(i, "qkv", layer.qkv, x)
        q_size, kv_size = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
        if arch.llama_layers:
            cache = attention.kv_cache
            fused = self.ops.rope_and_cache(
                qkv,
                cos,
                sin,
                s.num_heads,
                meta.slot_mapping,
                cache.key_caches[i],
                cache.value_caches[i],
            )
            if fused is not None:
                q, k, v = fused
                out = attend(i, q, k, v, meta, kv_written=True)
                return self.reduce(self._linear(i, "o", layer.o, out.reshape(-1, q_size)))
        heads = s.num_heads + s.num_kv_heads
        qk = qkv[:, : q_size + kv_size].view(-1, heads, s.head_dim)
        v = qkv[:, q_size + kv_size :].view(-1, s.num_kv_heads, s.head_dim)
        if layer.q_norm is not None and layer.k_norm is not None:
            eps = s.rms_norm_eps
            norm = gemma_rms_norm if arch.gemma_norms else self.ops.rms_norm
            q = norm(qk[:, : s.num_heads].reshape(-1, s.head_dim), layer.q_norm, eps)
            k = norm(qk[:, s.num_heads :].reshape(-1, s.head_dim), layer.k_norm, eps)
            qk = torch.cat(
                (q.view(-1, s.num_heads, s.head_dim), k.view(-1, s.num_kv_heads, s.head_dim)), dim=1
            )
        # q and k side by side: one rotation covers both heads' sets (half the
        # elementwise launches); the result is the same element by element.
        if arch.rope_layers[i]:
            qk = apply_rope(qk, cos, sin)
        q, k = qk.split([s.num_heads, s.num_kv_heads], dim=1)
        out = attend(i, q, k, v, meta)
        return self.reduce(self._linear(i, "o", layer.o, out.reshape(-1, q_size)))

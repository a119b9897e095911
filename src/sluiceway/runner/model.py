"""A compact Llama-family decoder (Llama, Qwen2, Mistral) over a flattened batch.

Tokens from many sequences are concatenated into one `[T]` batch with no padding;
only attention needs to know where one sequence ends (see `attention.py`). q/k/v
and gate/up are fused into one weight each at load time, so a layer is four
matmuls. Numerics follow transformers' implementation (RMSNorm in float32, RoPE
tables in float32, rotate-half layout) so greedy output matches `generate`.
"""

from __future__ import annotations

from collections.abc import Mapping

import attrs
import torch
import torch.nn.functional as F
from transformers.modeling_rope_utils import ROPE_INIT_FUNCTIONS

from sluiceway.runner.attention import AttentionBackend, AttentionMetadata, TorchAttention
from sluiceway.runner.kv_cache import KVCache
from sluiceway.runner.linear import Linear, default_quantized_max_rows
from sluiceway.runner.native.decode_one import OneTokenDecode
from sluiceway.runner.native.layer_ops import NativeLayerOps, layer_ops_for

SUPPORTED_MODEL_TYPES = frozenset({"llama", "qwen2", "mistral"})


@attrs.frozen
class ModelShape:
    """The numbers of a Llama-family config that the forward pass needs."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float

    @classmethod
    def from_config(cls, config) -> ModelShape:
        num_heads = config.num_attention_heads
        return cls(
            num_layers=config.num_hidden_layers,
            hidden_size=config.hidden_size,
            num_heads=num_heads,
            num_kv_heads=getattr(config, "num_key_value_heads", None) or num_heads,
            head_dim=getattr(config, "head_dim", None) or config.hidden_size // num_heads,
            vocab_size=config.vocab_size,
            rms_norm_eps=config.rms_norm_eps,
        )

    @property
    def scale(self) -> float:
        return self.head_dim**-0.5


def rope_frequencies(config) -> tuple[torch.Tensor, float]:
    """`(inv_freq [head_dim // 2] float32, attention_scaling)` exactly as transformers
    computes them at model init. Dynamic-NTK and longrope scaling use their
    init-time frequencies, which match transformers within the original context."""
    params = dict(getattr(config, "rope_parameters", None) or {})
    rope_type = params.get("rope_type", "default")
    if rope_type == "default":
        base = params.get("rope_theta", getattr(config, "rope_theta", 10000.0))
        dim = ModelShape.from_config(config).head_dim
        inv_freq = 1.0 / (
            base ** (torch.arange(0, dim, 2, dtype=torch.int64).to(torch.float) / dim)
        )
        return inv_freq, 1.0
    if rope_type not in ROPE_INIT_FUNCTIONS:
        raise ValueError(f"unsupported rope_type {rope_type!r}")
    inv_freq, scaling = ROPE_INIT_FUNCTIONS[rope_type](config, None)
    return inv_freq.to(torch.float32), float(scaling)


@attrs.frozen
class LayerWeights:
    input_norm: torch.Tensor
    qkv: Linear  # hidden -> (H + 2 * KVH) * D
    o: Linear
    post_norm: torch.Tensor
    gate_up: Linear  # hidden -> 2 * intermediate
    down: Linear


def _fuse(sd: Mapping[str, torch.Tensor], names: list[str], dtype, device) -> torch.Tensor | None:
    if not all(n in sd for n in names):
        return None
    return torch.cat([sd[n] for n in names], dim=0).to(device=device, dtype=dtype).contiguous()


def _take(sd: Mapping[str, torch.Tensor], name: str, dtype, device) -> torch.Tensor | None:
    tensor = sd.get(name)
    return None if tensor is None else tensor.to(device=device, dtype=dtype).contiguous()


def _need(sd: Mapping[str, torch.Tensor], name: str, dtype, device) -> torch.Tensor:
    tensor = _take(sd, name, dtype, device)
    if tensor is None:
        raise ValueError(f"checkpoint has no weight {name!r}")
    return tensor


def _layer_weights(
    sd: Mapping[str, torch.Tensor], i: int, dtype, device, quantization: str | None
) -> LayerWeights:
    p = f"model.layers.{i}."
    attn = [f"{p}self_attn.{n}_proj" for n in ("q", "k", "v")]
    mlp = [f"{p}mlp.{n}_proj" for n in ("gate", "up")]
    qkv = _fuse(sd, [f"{n}.weight" for n in attn], dtype, device)
    gate_up = _fuse(sd, [f"{n}.weight" for n in mlp], dtype, device)
    if qkv is None or gate_up is None:
        raise ValueError(f"checkpoint layer {i} lacks q/k/v or gate/up projection weights")
    q = quantization
    return LayerWeights(
        input_norm=_need(sd, f"{p}input_layernorm.weight", dtype, device),
        qkv=Linear(qkv, _fuse(sd, [f"{n}.bias" for n in attn], dtype, device), quantization=q),
        o=Linear(
            _need(sd, f"{p}self_attn.o_proj.weight", dtype, device),
            _take(sd, f"{p}self_attn.o_proj.bias", dtype, device),
            quantization=q,
        ),
        post_norm=_need(sd, f"{p}post_attention_layernorm.weight", dtype, device),
        gate_up=Linear(
            gate_up, _fuse(sd, [f"{n}.bias" for n in mlp], dtype, device), quantization=q
        ),
        down=Linear(
            _need(sd, f"{p}mlp.down_proj.weight", dtype, device),
            _take(sd, f"{p}mlp.down_proj.bias", dtype, device),
            quantization=q,
        ),
    )


def apply_rope(x: torch.Tensor, cos: torch.Tensor, signed_sin: torch.Tensor) -> torch.Tensor:
    """Rotate-half RoPE; x [T, heads, D], cos/signed_sin [T, 1, D].

    transformers computes `x * cos + cat(-x2, x1) * sin`; with the sign folded into
    `signed_sin` (first half negated, see `rope_tables`) that is `x * cos +
    roll(x) * signed_sin`: the same products bit for bit, in 4 ops instead of 6."""
    return x * cos + x.roll(x.shape[-1] // 2, dims=-1) * signed_sin


class DecoderModel:
    """A decoder-only transformer of the Llama layout (Llama, Qwen2, Mistral):
    weights plus the forward pass. Holds no per-sequence state."""

    def __init__(
        self,
        config,
        state_dict: Mapping[str, torch.Tensor],
        *,
        dtype: torch.dtype,
        device: torch.device | str = "cpu",
        quantization: str | None = None,
        native_ops: bool | None = None,
    ) -> None:
        model_type = getattr(config, "model_type", None)
        if model_type not in SUPPORTED_MODEL_TYPES:
            raise ValueError(f"unsupported model_type {model_type!r}")
        if getattr(config, "hidden_act", "silu") != "silu":
            raise ValueError(f"unsupported hidden_act {config.hidden_act!r}")
        self.shape = ModelShape.from_config(config)
        self.dtype = dtype
        self.device = torch.device(device)
        self.embed = _need(state_dict, "model.embed_tokens.weight", dtype, device)
        self.final_norm = _need(state_dict, "model.norm.weight", dtype, device)
        lm_head = (
            None
            if getattr(config, "tie_word_embeddings", False)
            else state_dict.get("lm_head.weight")
        )
        # The output projection is the most quantization-sensitive weight; like
        # llama.cpp's 4-bit formats, int4 keeps it at 8 bits: a 4-bit head costs
        # far more perplexity than all the 4-bit layers together
        # (benchmarks/quantization_quality.py).
        self.lm_head = Linear(
            self.embed if lm_head is None else _need(state_dict, "lm_head.weight", dtype, device),
            quantization="int8" if quantization == "int4" else quantization,
            quantized_max_rows=default_quantized_max_rows(dtype, output_head=True),
        )
        self.layers = [
            _layer_weights(state_dict, i, dtype, device, quantization)
            for i in range(self.shape.num_layers)
        ]
        inv_freq, self.rope_scaling = rope_frequencies(config)
        self.inv_freq = inv_freq.to(self.device)
        # RMSNorm, residual adds and SiLU-and-multiply: C kernels on the CPU for
        # bfloat16, and for float32 when quantized (unquantized float32 keeps torch's
        # ops, exactly what transformers computes), as `layer_ops_for` says.
        self.ops = layer_ops_for(
            dtype, self.device, native_ops, exact_float32=quantization is None
        )
        # Steps of one sequence and one token run every layer in one C call where
        # the weights allow (`OneTokenDecode`); False keeps the Python layer loop.
        self.fuse_one_token_steps = True
        self._one_token: tuple[KVCache, OneTokenDecode | None] | None = None

    def rope_tables(self, positions: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """cos and signed sin `[T, 1, D]` in the model dtype, computed in float32 like
        transformers; the sin table's first half is negated for `apply_rope`."""
        freqs = positions.to(torch.float32)[:, None] * self.inv_freq[None, :]
        emb = torch.cat((freqs, freqs), dim=-1)
        cos = (emb.cos() * self.rope_scaling).to(self.dtype)
        sin = (emb.sin() * self.rope_scaling).to(self.dtype)
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
        cos, sin = self.rope_tables(positions)
        eps = self.shape.rms_norm_eps
        hidden = self.embed_tokens(input_ids)
        one_token = self._one_token_decode(attention, meta) if input_ids.shape[0] == 1 else None
        if one_token is not None:
            hidden = one_token.run(hidden, cos, sin, meta, eps)
        else:
            hidden = self._layers(hidden, cos, sin, attention, meta)
        picked = hidden[logits_indices]
        picked = self.ops.rms_norm(picked, self.final_norm, eps)
        return self.output_logits(picked)

    # Three seams a tensor-parallel shard overrides (`runner/tensor_parallel/`): on
    # one device they are the plain operations.
    def embed_tokens(self, input_ids: torch.Tensor) -> torch.Tensor:
        """The embeddings `[T, hidden]` of `input_ids`."""
        return F.embedding(input_ids, self.embed)

    def output_logits(self, normed: torch.Tensor) -> torch.Tensor:
        """float32 logits of the final-normed rows `normed`."""
        return self.lm_head(normed).to(torch.float32)

    def reduce(self, partial: torch.Tensor) -> torch.Tensor:
        """The output of a row-parallel projection (o, down) summed over shards:
        with the whole weight here, `partial` already is that sum."""
        return partial

    def _layers(self, hidden, cos, sin, attention, meta) -> torch.Tensor:
        """Every decoder layer on the embeddings `hidden`: the residual stream after the
        last one."""
        ops, eps, last = self.ops, self.shape.rms_norm_eps, len(self.layers) - 1
        # The residual stream: each add is fused with the RMSNorm that reads its result.
        x = ops.rms_norm(hidden, self.layers[0].input_norm, eps)
        for i, layer in enumerate(self.layers):
            attended = self._attention(i, layer, x, cos, sin, attention, meta)
            hidden, x = ops.add_rms_norm(hidden, attended, layer.post_norm, eps)
            mlp = self.reduce(layer.down(ops.silu_mul(layer.gate_up(x))))
            if i < last:
                hidden, x = ops.add_rms_norm(hidden, mlp, self.layers[i + 1].input_norm, eps)
            else:
                hidden = hidden + mlp
        return hidden

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
            self._one_token = (cache, OneTokenDecode.build(self.shape, self.layers, cache, eligible))
        fused = self._one_token[1]
        return fused if fused is not None and fused.serves(cache, meta) else None

    def _attention(self, i, layer: LayerWeights, x, cos, sin, attention, meta) -> torch.Tensor:
        """Self-attention of layer `i` on its normalised input `x`."""
        s = self.shape
        qkv = layer.qkv(x)
        q_size, kv_size = s.num_heads * s.head_dim, s.num_kv_heads * s.head_dim
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
            out = attention.forward(i, q, k, v, meta, kv_written=True)
            return self.reduce(layer.o(out.reshape(-1, q_size)))
        # q and k sit side by side in qkv, so one rotation covers both heads' sets
        # (half the elementwise launches); the result is the same element by element.
        qk = qkv[:, : q_size + kv_size].view(-1, s.num_heads + s.num_kv_heads, s.head_dim)
        q, k = apply_rope(qk, cos, sin).split([s.num_heads, s.num_kv_heads], dim=1)
        v = qkv[:, q_size + kv_size :].view(-1, s.num_kv_heads, s.head_dim)
        out = attention.forward(i, q, k, v, meta)
        return self.reduce(layer.o(out.reshape(-1, q_size)))

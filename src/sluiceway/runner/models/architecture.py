"""What the forward pass needs to know about a model, read from its config once:
the shape numbers, and the choices a family makes per layer (q/k norms, RoPE or
none, a dense MLP or experts)."""

from __future__ import annotations

import attrs


class UnsupportedModel(ValueError):
    """The config asks for something no family here implements; the message names
    the config field."""


@attrs.frozen
class ModelShape:
    """The numbers of a decoder that attention, the KV cache and the C kernels need."""

    num_layers: int
    hidden_size: int
    num_heads: int
    num_kv_heads: int
    head_dim: int
    vocab_size: int
    rms_norm_eps: float
    # Gemma scales queries by query_pre_attn_scalar ** -0.5, not head_dim ** -0.5.
    query_pre_attn_scalar: float | None = None

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
            query_pre_attn_scalar=getattr(config, "query_pre_attn_scalar", None),
        )

    @property
    def scale(self) -> float:
        """What attention multiplies q·k by."""
        return (self.query_pre_attn_scalar or self.head_dim) ** -0.5


@attrs.frozen
class ExpertsShape:
    """A mixture-of-experts MLP: `top_k` of `num_experts` SwiGLU experts per token,
    each `intermediate_size` wide, weighted by the router's softmax over experts
    (renormalised over the chosen ones when `normalize_top_k`)."""

    num_experts: int
    top_k: int
    intermediate_size: int
    normalize_top_k: bool
    # Mixtral weighs the experts' outputs with float32 router weights; Qwen3-MoE
    # rounds them to the activations' dtype first.
    float32_weights: bool = False


@attrs.frozen
class Architecture:
    """One model's decoder, as the shared forward pass (`models.decoder`) runs it.

    `rotary_dim` is how many leading dimensions of each head RoPE rotates (the head
    dimension unless the config has a `partial_rotary_factor`). `rope_layers[i]`
    says whether layer i applies RoPE at all (SmolLM3 leaves some out).
    `moe_layers[i]` says whether layer i's MLP is `experts` rather than dense.

    Gemma's layer differs from Llama's in the rest: `layer_windows[i]` is layer
    i's sliding window (None: it sees the whole context), `rope_kinds[i]` names
    which of the family's RoPE tables layer i rotates with (empty: one table),
    `attn_softcap` and `final_softcap` cap attention and output logits with
    `c * tanh(x / c)`, `embed_scale` multiplies the embeddings, `gemma_norms`
    scale by `1 + weight` in float32 and also sit after attention and around
    the MLP, and `activation` is the MLP's gate activation."""

    model_type: str
    shape: ModelShape
    rotary_dim: int
    rope_layers: tuple[bool, ...]
    qk_norm: bool = False
    experts: ExpertsShape | None = None
    moe_layers: tuple[bool, ...] = ()
    tie_word_embeddings: bool = False
    layer_windows: tuple[int | None, ...] = ()
    rope_kinds: tuple[str, ...] = ()
    attn_softcap: float | None = None
    final_softcap: float | None = None
    embed_scale: float | None = None
    gemma_norms: bool = False
    activation: str = "silu"

    def window(self, layer: int) -> int | None:
        return self.layer_windows[layer] if self.layer_windows else None

    def needs_masked_attention(self, layer: int, max_seq_len: int) -> bool:
        """Whether layer `layer`, in a step whose longest context is `max_seq_len`,
        needs more than the causal attention every backend has: soft-capped
        logits, or a sliding window narrower than that context (within its
        window, sliding attention is full attention)."""
        window = self.window(layer)
        return self.attn_softcap is not None or (window is not None and max_seq_len > window)

    @property
    def graph_safe(self) -> bool:
        """Whether a decode step can be captured as a CUDA graph: not where some
        layer may need masked attention, which plans on the host per step."""
        return self.attn_softcap is None and not any(w is not None for w in self.layer_windows)

    def is_moe(self, layer: int) -> bool:
        return bool(self.moe_layers) and self.moe_layers[layer]

    @property
    def llama_layers(self) -> bool:
        """Every layer is Llama's: full RoPE everywhere, no q/k norms, a dense MLP.
        The fused C paths (RoPE with the cache store, the one-call decode step) are
        written for exactly that layer."""
        return self.why_not_llama_layers is None

    @property
    def why_not_llama_layers(self) -> str | None:
        """Why the fused C paths cannot run this model's layers (None: they can)."""
        if self.gemma_norms:
            return "its layers normalise around attention and the MLP as Gemma's do"
        if self.activation != "silu":
            return f"its MLP's activation is {self.activation}"
        if self.attn_softcap is not None:
            return "it soft-caps attention logits"
        if self.qk_norm:
            return "its attention normalises q and k per head"
        if not all(self.rope_layers):
            return "some of its layers have no RoPE"
        if self.rotary_dim != self.shape.head_dim:
            return "RoPE rotates only part of each head"
        if self.experts is not None:
            return "its MLPs are mixtures of experts"
        return None

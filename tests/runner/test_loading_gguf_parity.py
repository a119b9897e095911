"""GGUF files of tiny random models, written as llama.cpp lays them out, load
straight into the runner: the weights are the stored ones (Q4_0 and Q8_0 bit
for bit, a K-quant as gguf-py dequantizes it), and greedy tokens equal those of
a float32 transformers model holding the same dequantized weights."""

from __future__ import annotations

import numpy as np
import pytest
import torch
import transformers
from gguf import GGMLQuantizationType, GGUFReader, quants

from family_models import BASE
from gguf_files import VOCAB_SIZE, write_gguf
from greedy_rounds import greedy_rounds
from sluiceway.runner.checkpoint.reference import transformers_module
from sluiceway.runner.loading import load_model
from sluiceway.runner.model_runner import TorchModelRunner

Q = GGMLQuantizationType
# Families llama.cpp's converter writes, with what tells each apart in a file:
# Llama's permuted q/k rows, Qwen2's q/k/v biases, Qwen3's q/k norms, Phi-3's
# fused qkv and gate/up.
FAMILIES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM", {}),
    "qwen3": ("Qwen3Config", "Qwen3ForCausalLM", dict(head_dim=128)),
    "phi3": ("Phi3Config", "Phi3ForCausalLM", dict(pad_token_id=0)),
}
NEW_TOKENS = 6


def _model(family: str, **extra):
    config_cls, model_cls, fields = FAMILIES[family]
    config = getattr(transformers, config_cls)(
        **{**BASE, "vocab_size": VOCAB_SIZE, **fields, **extra}
    )
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(1 + 0.3 * torch.randn_like(p)) if "norm" in name else p.normal_(0, 0.3)
    return model


def _stored(path, gguf_name: str) -> np.ndarray:
    """Tensor `gguf_name` of the file as gguf-py dequantizes it, `[rows, cols]`."""
    tensor = next(t for t in GGUFReader(path).tensors if t.name == gguf_name)
    values = quants.dequantize(tensor.data, tensor.tensor_type)
    return values.reshape(-1, int(tensor.shape[0]))


def _unpermute(data: np.ndarray, heads: int) -> np.ndarray:
    """The inverse of `gguf_files._llama_permute`."""
    rows = data.shape[0]
    return data.reshape(heads, rows // heads // 2, 2, -1).swapaxes(1, 2).reshape(data.shape)


def _greedy(loaded, prompt, hf_greedy_fn, greedy_driver_cls) -> tuple[list[int], list[int]]:
    reference = transformers_module(
        loaded.hf_config, loaded.state_dict(), torch_dtype=torch.float32
    )
    want = hf_greedy_fn(reference, prompt, NEW_TOKENS)
    runner = TorchModelRunner.from_loaded(loaded, quantization=None, block_size=4, num_blocks=32)
    return greedy_driver_cls(runner).generate([prompt], NEW_TOKENS)[0], want


@pytest.mark.parametrize("kind", [None, Q.Q8_0, Q.Q4_0], ids=["F32", "Q8_0", "Q4_0"])
@pytest.mark.parametrize("family", list(FAMILIES))
def test_a_gguf_serves_its_stored_weights_and_their_greedy_tokens(
    tmp_path, family, kind, hf_greedy_fn, greedy_driver_cls
):
    model = _model(family)
    path = tmp_path / f"tiny-{family}.gguf"
    write_gguf(model, path, kind)
    loaded = load_model(str(path), dtype="float32", progress=False)
    assert loaded.hf_config.model_type == family
    weights = loaded.state_dict()
    if kind is None:  # float32 as stored: the model's own weights
        for key, tensor in model.state_dict().items():
            torch.testing.assert_close(weights.tensor(key), tensor, rtol=0, atol=0, msg=key)
    else:  # the stored blocks' values, bit for bit, in transformers' row order
        heads = model.config.num_attention_heads
        o_name, q_name = (
            "model.layers.1.self_attn.o_proj.weight",
            "model.layers.1.self_attn.q_proj.weight",
        )
        assert torch.equal(
            weights.tensor(o_name), torch.from_numpy(_stored(path, "blk.1.attn_output.weight"))
        )
        if family != "phi3":
            q = _stored(path, "blk.1.attn_q.weight")
            q = _unpermute(q, heads) if family == "llama" else q
            assert torch.equal(weights.tensor(q_name), torch.from_numpy(q))
        assert weights["model.layers.0.mlp.down_proj.weight"].type_name == kind.name
    prompt = loaded.tokenizer("The capital of France is")["input_ids"]
    got, want = _greedy(loaded, prompt, hf_greedy_fn, greedy_driver_cls)
    assert got == want


def test_a_k_quant_gguf_serves_its_dequantized_blocks(tmp_path, hf_greedy_fn, greedy_driver_cls):
    """Q6_K (K-quant rows are 256 weights a block: a wider model)."""
    model = _model("llama", hidden_size=256, intermediate_size=256, head_dim=64)
    path = tmp_path / "tiny-llama.Q6_K.gguf"
    write_gguf(model, path, Q.Q6_K)
    loaded = load_model(str(path), dtype="float32", progress=False)
    weights = loaded.state_dict()
    down = weights["model.layers.0.mlp.down_proj.weight"]
    assert down.type_name == "Q6_K"
    stored = torch.from_numpy(_stored(path, "blk.0.ffn_down.weight"))
    assert torch.equal(down[(slice(None),)], stored)
    original = model.state_dict()["model.layers.0.mlp.down_proj.weight"]
    # Q6_K's codes step by at most 1/31 of a sub-block's largest |weight|.
    assert (stored - original).abs().max() <= original.abs().max() / 31
    prompt = loaded.tokenizer("The capital of France is")["input_ids"]
    got, want = _greedy(loaded, prompt, hf_greedy_fn, greedy_driver_cls)
    assert got == want


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_4bit_embedding_and_head_are_served_as_stored(
    tmp_path, tied, dtype, hf_greedy_fn, greedy_driver_cls
):
    """A token embedding (and an untied head) stored in Q4_0 stays in its blocks:
    the head takes them as its int4 weight, and token rows are read back from
    them, never held as float values (tied, the head's blocks serve both)."""
    from sluiceway.config import EngineConfig, ModelConfig
    from sluiceway.model_engine import load_bundle
    from sluiceway.runner.linear import Int4Weight

    model = _model("llama", tie_word_embeddings=tied)
    path = tmp_path / "tiny-llama.Q4_0.gguf"
    write_gguf(model, path, Q.Q4_0, embedding_type=Q.Q4_0)
    bundle = load_bundle(
        ModelConfig(model=str(path), dtype=dtype, quantization="int4"),
        EngineConfig(num_kv_blocks=16),
        progress=False,
    )
    runner_model = bundle.runner.model
    assert runner_model.embed is None and runner_model.embed_rows is not None
    head = runner_model.lm_head.quantized
    assert isinstance(head, Int4Weight)
    if tied and dtype == "bfloat16":
        assert head.tiled is runner_model.embed_rows
    embedding = torch.from_numpy(_stored(path, "token_embd.weight"))
    ids = torch.tensor([0, 5, VOCAB_SIZE - 1, 5])
    # Q4_0 keeps its float16 scales in either dtype: the stored values exactly,
    # rounded once where token rows are read back in bfloat16.
    got = runner_model.embed_tokens(ids)
    assert got.dtype == getattr(torch, dtype)
    assert torch.equal(got, embedding[ids].to(got.dtype))
    output = embedding if tied else torch.from_numpy(_stored(path, "output.weight"))
    assert torch.equal(head.values(torch.float32), output)
    if dtype == "float32":
        # float32's int4 kernels multiply by the stored values in float32: the
        # greedy tokens of a float32 model holding the same values.
        reference = load_model(str(path), dtype="float32", progress=False)
        prompt = reference.tokenizer("The capital of France is")["input_ids"]
        module = transformers_module(
            reference.hf_config, reference.state_dict(), torch_dtype=torch.float32
        )
        want = hf_greedy_fn(module, prompt, NEW_TOKENS)
        assert greedy_driver_cls(bundle.runner).generate([prompt], NEW_TOKENS)[0] == want


@pytest.mark.parametrize("kind", [Q.Q4_0, Q.Q4_1], ids=["Q4_0", "Q4_1"])
def test_int4_layers_keep_the_stored_codes_and_scales(tmp_path, kind):
    """On the int4 path the layers take the file's 4-bit blocks as they are: in
    float32 the int4 weight's codes, scales and offsets, and the values it holds,
    are the stored values exactly (q/k back in transformers' row order)."""
    from sluiceway.config import EngineConfig, ModelConfig
    from sluiceway.model_engine import load_bundle

    model = _model("llama")
    path = tmp_path / f"tiny-llama.{kind.name}.gguf"
    write_gguf(model, path, kind)
    bundle = load_bundle(
        ModelConfig(model=str(path), dtype="float32", quantization="int4"),
        EngineConfig(num_kv_blocks=16),
        progress=False,
    )
    layer = bundle.runner.model.layers[1]
    tensor = next(t for t in GGUFReader(path).tensors if t.name == "blk.1.attn_output.weight")
    rows = int(tensor.shape[1])
    raw = np.asarray(tensor.data).reshape(rows, -1, 18 if kind == Q.Q4_0 else 20)
    d = torch.from_numpy(raw[..., :2].copy().view(np.float16)[..., 0].astype(np.float32))
    # The runtime's (q - 8) * scale + offset: Q4_0's offset 0, Q4_1's m + 8 d.
    offsets = (
        torch.zeros_like(d)
        if kind == Q.Q4_0
        else torch.from_numpy(raw[..., 2:4].copy().view(np.float16)[..., 0].astype(np.float32))
        + 8 * d
    )
    scales_and_offsets = layer.o.quantized.scales_and_offsets  # [groups, rows, 2]
    assert torch.equal(scales_and_offsets[..., 0].T, d)
    assert torch.equal(scales_and_offsets[..., 1].T, offsets)
    o = layer.o.quantized.values(torch.float32)
    assert torch.equal(o, torch.from_numpy(_stored(path, "blk.1.attn_output.weight")))
    q = _unpermute(_stored(path, "blk.1.attn_q.weight"), model.config.num_attention_heads)
    qkv = layer.qkv.quantized.values(torch.float32)
    assert torch.equal(qkv[: q.shape[0]], torch.from_numpy(q))
    # Packed where the kernels look: their product is the dense one's, up to the
    # int8 rounding of the activations where those kernels run (a misplaced code
    # or scale would be off by the size of the product itself).
    x = torch.randn(4, layer.o.in_features)
    dense = x @ o.T
    assert (layer.o(x) - dense).norm() < 0.05 * dense.norm()


def test_q4_0_layers_keep_the_files_scales_and_size_in_bfloat16(tmp_path):
    """In a bfloat16 model too, Q4_0 layers are served as the file holds them:
    each group's codes and float16 d, no offsets (`SCALES_F16`), so the values
    are the stored ones exactly and the tiles are the file's 18 bytes per 32
    weights (bfloat16 scales and zero offsets would round d and take 20)."""
    from sluiceway.config import EngineConfig, ModelConfig
    from sluiceway.model_engine import load_bundle
    from sluiceway.runner.native import int8_dot

    if not int8_dot.integer_level():
        pytest.skip("bfloat16 int4 layers are tiles only where int8_dot runs in integers")
    model = _model("llama")
    path = tmp_path / "tiny-llama.Q4_0.gguf"
    write_gguf(model, path, Q.Q4_0)
    bundle = load_bundle(
        ModelConfig(model=str(path), dtype="bfloat16", quantization="int4"),
        EngineConfig(num_kv_blocks=16),
        progress=False,
    )
    layer = bundle.runner.model.layers[1]
    o = layer.o.quantized
    assert o.tiled is not None and o.tiled.scale_format == int8_dot.SCALES_F16
    assert o.tiled.nbytes == layer.o.out_features * layer.o.in_features // 32 * 18
    assert torch.equal(
        o.values(torch.float32), torch.from_numpy(_stored(path, "blk.1.attn_output.weight"))
    )
    q = _unpermute(_stored(path, "blk.1.attn_q.weight"), model.config.num_attention_heads)
    qkv = layer.qkv.quantized.values(torch.float32)
    assert torch.equal(qkv[: q.shape[0]], torch.from_numpy(q))


@pytest.mark.parametrize("tied", [True, False], ids=["tied", "untied"])
def test_q8_0_layers_keep_the_files_codes_and_scales(tmp_path, tied, hf_greedy_fn):
    """On the int8 path a Q8_0 file is served as it holds its weights: every
    block's codes and float16 d in the int8 kernels' tiles (`SCALES_F16`, 34
    bytes per 32 weights like the file), the layers', the head's and the token
    rows' values the stored ones bit for bit (q and k back in transformers' row
    order), where one scale a row would requantize them; and the model
    generates what transformers generates from those values."""
    from sluiceway.config import EngineConfig, ModelConfig
    from sluiceway.model_engine import load_bundle
    from sluiceway.runner.native import int8_dot

    if not int8_dot.integer_level():
        pytest.skip("Q8_0 blocks are served as stored where int8_dot runs in integers")
    model = _model("llama", tie_word_embeddings=tied)
    path = tmp_path / "tiny-llama.Q8_0.gguf"
    write_gguf(model, path, Q.Q8_0, embedding_type=Q.Q8_0)
    bundle = load_bundle(
        ModelConfig(model=str(path), dtype="bfloat16", quantization="int8"),
        EngineConfig(num_kv_blocks=16),
        progress=False,
    )
    runner = bundle.runner
    layer = runner.model.layers[1]
    o = layer.o.quantized
    assert o.tiled is not None and o.tiled.bits == 8 and o.tiled.scale_format == int8_dot.SCALES_F16
    assert o.tiled.nbytes == layer.o.out_features * layer.o.in_features // 32 * 34
    assert torch.equal(
        o.values(torch.float32), torch.from_numpy(_stored(path, "blk.1.attn_output.weight"))
    )
    q = _unpermute(_stored(path, "blk.1.attn_q.weight"), model.config.num_attention_heads)
    qkv = layer.qkv.quantized.values(torch.float32)
    assert torch.equal(qkv[: q.shape[0]], torch.from_numpy(q))
    embedding = torch.from_numpy(_stored(path, "token_embd.weight"))
    head = embedding if tied else torch.from_numpy(_stored(path, "output.weight"))
    assert torch.equal(runner.model.lm_head.quantized.values(torch.float32), head)
    assert runner.model.embed is None and runner.model.embed_rows is not None
    ids = torch.tensor([3, 0, 99])
    assert torch.equal(
        int8_dot.unpack_rows(runner.model.embed_rows, ids, torch.float32), embedding[ids]
    )
    # The greedy tokens of transformers over the same stored values, in float32.
    loaded = load_model(str(path), dtype="float32", progress=False)
    reference = transformers_module(
        loaded.hf_config, loaded.state_dict(), torch_dtype=torch.float32
    )
    prompt = loaded.tokenizer("The capital of France is")["input_ids"]
    want = hf_greedy_fn(reference, prompt, NEW_TOKENS)
    [run] = greedy_rounds(runner, [prompt], max_new=NEW_TOKENS, budget=512)
    assert list(run.tokens[0]) == want


@pytest.mark.parametrize("kind", [Q.Q4_0, Q.Q4_1, Q.Q4_K], ids=["Q4_0", "Q4_1", "Q4_K"])
def test_stored_blocks_pack_into_the_tiles_their_codes_give(tmp_path, kind, monkeypatch):
    """The one-pass packer (`int8_dot.pack_q4_rows`, reading the mapped file) and
    the packing of the decoded blocks' codes, scales and offsets give the same
    tiles byte for byte: fused parts, Llama's permuted q and k, the embedding,
    bfloat16 and float32 scales."""
    from sluiceway.runner.checkpoint import stored_int4
    from sluiceway.runner.native import int8_dot

    # Q4_K's blocks are 256 weights: rows of 256.
    model = _model("llama", hidden_size=256, intermediate_size=256, head_dim=64)
    path = tmp_path / f"tiny-llama.{kind.name}.gguf"
    write_gguf(model, path, kind, embedding_type=kind)

    def packed(dtype, available: bool):
        monkeypatch.setattr(int8_dot, "available", lambda: available)
        loaded = load_model(str(path), dtype=dtype, progress=False)
        stored = stored_int4.StoredBlocks(loaded.hf_config, loaded.state_dict(), loaded.dtype)
        tiles = [stored.rows("embed"), stored.rows("layers.0.q.weight")]
        if dtype == "bfloat16":
            for names in (["q", "k", "v"], ["gate", "up"]):
                weight = stored([f"layers.1.{n}.weight" for n in names])
                assert weight is not None
                tiles.append(weight.tiled)
        assert all(t is not None for t in tiles)
        return [t.data for t in tiles]

    for dtype in ("bfloat16", "float32"):
        fast, through_codes = packed(dtype, True), packed(dtype, False)
        assert all(torch.equal(a, b) for a, b in zip(fast, through_codes, strict=True))


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_projections_stored_in_more_bits_keep_them_on_the_int4_path(
    tmp_path, dtype, monkeypatch, greedy_driver_cls
):
    """A mix as llama.cpp's Q4_K_M writes one: 4-bit layers, attn_v and ffn_down
    in more bits (Q8_0 here; Q6_K there). On the int4 path those are served on
    int8, with the fused qkv that holds v; o and gate_up stay int4. Their logits
    are nearer the stored weights' than with every projection on int4, and the
    one-token C step takes the mixed layers wherever it takes an all-int8 model,
    giving the tokens of the Python layer loop."""
    from sluiceway.config import EngineConfig, ModelConfig
    from sluiceway.engine.batch import ScheduledChunk, StepBatch
    from sluiceway.engine.sampling_params import SamplingParams
    from sluiceway.model_engine import load_bundle
    from sluiceway.runner.linear import Int4Weight, Int8Weight
    from sluiceway.runner.models.layer import Weights

    model = _model("llama")
    path = tmp_path / "tiny-llama.Q4_mixed.gguf"
    write_gguf(model, path, Q.Q4_0, linear_overrides={"attn_v": Q.Q8_0, "ffn_down": Q.Q8_0})

    def runner(quantization: str):
        return load_bundle(
            ModelConfig(model=str(path), dtype=dtype, quantization=quantization),
            EngineConfig(num_kv_blocks=16),
            progress=False,
        ).runner

    mixed = runner("int4")
    for layer in mixed.model.layers:
        assert isinstance(layer.qkv.quantized, Int8Weight)
        assert isinstance(layer.down.quantized, Int8Weight)
        assert isinstance(layer.o.quantized, Int4Weight)
        assert isinstance(layer.gate_up.quantized, Int4Weight)
    reference = load_model(str(path), dtype="float32", progress=False)
    prompt = reference.tokenizer("The capital of France is")["input_ids"]

    def logits(served) -> torch.Tensor:
        chunk = ScheduledChunk(0, prompt, 0, list(range(4)), True, SamplingParams(temperature=0.0))
        return served.forward_logits(StepBatch(chunks=(chunk,)))[0].float()

    module = transformers_module(
        reference.hf_config, reference.state_dict(), torch_dtype=torch.float32
    )
    with torch.no_grad():
        want = module(torch.tensor([prompt])).logits[0, -1]
    with monkeypatch.context() as patched:
        patched.setattr(Weights, "stored_bits_path", lambda self, names: None)
        every_int4 = runner("int4")
    assert isinstance(every_int4.model.layers[0].down.quantized, Int4Weight)
    assert (logits(mixed) - want).norm() < (logits(every_int4) - want).norm()

    fused = greedy_driver_cls(mixed).generate([prompt], NEW_TOKENS)[0]
    all_int8 = runner("int8")
    greedy_driver_cls(all_int8).generate([prompt], NEW_TOKENS)
    # Built (not None) for the mixed layers exactly where it is for int8 alone.
    assert (mixed.model._one_token[1] is None) == (all_int8.model._one_token[1] is None)
    mixed.model.fuse_one_token_steps = False
    assert greedy_driver_cls(mixed).generate([prompt], NEW_TOKENS)[0] == fused


@pytest.mark.parametrize("family", list(FAMILIES))
def test_the_tokenizer_is_the_one_auto_tokenizer_builds(tmp_path, family, monkeypatch):
    """The GGUF's tokenizer is built without AutoTokenizer's second reading of the
    header, and is what AutoTokenizer builds: its class, vocabulary, special
    tokens, chat template and encodings. A tokenizer file beside the GGUF leaves
    the choice to AutoTokenizer."""
    from transformers import AutoConfig, AutoTokenizer

    from sluiceway.runner.checkpoint import gguf_metadata

    path = tmp_path / "tiny.gguf"
    write_gguf(_model(family), path)
    kwargs = {"gguf_file": path.name, "local_files_only": True}
    config = AutoConfig.from_pretrained(tmp_path, **kwargs)
    want = AutoTokenizer.from_pretrained(tmp_path, **kwargs)
    got = gguf_metadata._tokenizer(path, config)
    assert type(got) is type(want)
    assert got.get_vocab() == want.get_vocab()
    assert got.special_tokens_map == want.special_tokens_map
    assert got.chat_template == want.chat_template
    texts = ["The capital of France is", "  two  spaces\tand a tab\n", "<|im_start|>user hi"]
    assert [got(t)["input_ids"] for t in texts] == [want(t)["input_ids"] for t in texts]
    chat = [{"role": "user", "content": "Hello there"}]
    if want.chat_template:
        assert got.apply_chat_template(chat, tokenize=False) == want.apply_chat_template(
            chat, tokenize=False
        )
    calls = []
    real = AutoTokenizer.from_pretrained
    monkeypatch.setattr(
        AutoTokenizer, "from_pretrained", lambda *a, **k: calls.append(a) or real(*a, **k)
    )
    gguf_metadata._tokenizer(path, config)
    assert calls == []
    (tmp_path / "tokenizer_config.json").write_text("{}")
    gguf_metadata._tokenizer(path, config)
    assert len(calls) == 1


def test_q4_k_blocks_decode_as_gguf_py_decodes_them():
    """Any Q4_K bytes (random codes, 6-bit scales and mins, fp16 d and dmin):
    their values bit for bit gguf-py's, and as int4 groups of 32 the same values."""
    from sluiceway.runner.checkpoint.block_codes import int4_blocks, q4_k_values

    rng = np.random.default_rng(7)
    rows, cols = 5, 768
    raw = rng.integers(0, 256, size=(rows, cols // 256, 144), dtype=np.uint8)
    raw[..., 0:4] = (rng.random((rows, cols // 256, 2)) * 0.02).astype(np.float16).view(np.uint8)
    data = raw.reshape(rows, -1)
    want = quants.dequantize(data, Q.Q4_K).reshape(rows, cols)
    assert np.array_equal(q4_k_values(data, rows).numpy(), want)
    blocks = int4_blocks(Q.Q4_K, data, rows)
    assert blocks.shape == (rows, cols)
    torch.testing.assert_close(blocks.values(), torch.from_numpy(want), rtol=1e-6, atol=1e-7)


def test_a_q4_k_m_mix_serves_q4_k_from_its_blocks_and_q6_k_on_int8(
    tmp_path, hf_greedy_fn, greedy_driver_cls
):
    """Q4_K layers are int4 straight from their blocks (the codes and scales as
    stored, no float round trip); the Q6_K attn_v and ffn_down of the mix are
    int8, with the q and k fused beside v."""
    from sluiceway.config import EngineConfig, ModelConfig
    from sluiceway.model_engine import load_bundle
    from sluiceway.runner.linear import Int4Weight, Int8Weight

    model = _model("llama", hidden_size=256, intermediate_size=256, head_dim=64)
    with torch.no_grad():
        # Positive weights: each sub-block's codes start above 0, which values
        # quantized again would spread over 0..15 (other codes, other values).
        for linear in (model.model.layers[1].self_attn.o_proj, model.model.layers[1].mlp.gate_proj):
            linear.weight.copy_(0.5 + 0.1 * torch.randn_like(linear.weight))
    path = tmp_path / "tiny-llama.Q4_K_M.gguf"
    write_gguf(model, path, Q.Q4_K, linear_overrides={"attn_v": Q.Q6_K, "ffn_down": Q.Q6_K})
    bundle = load_bundle(
        ModelConfig(model=str(path), dtype="float32", quantization="int4"),
        EngineConfig(num_kv_blocks=16),
        progress=False,
    )
    layer = bundle.runner.model.layers[1]
    assert isinstance(layer.o.quantized, Int4Weight) and isinstance(
        layer.gate_up.quantized, Int4Weight
    )
    assert isinstance(layer.qkv.quantized, Int8Weight) and isinstance(
        layer.down.quantized, Int8Weight
    )
    stored = torch.from_numpy(_stored(path, "blk.1.attn_output.weight"))
    torch.testing.assert_close(
        layer.o.quantized.values(torch.float32), stored, rtol=1e-6, atol=1e-7
    )
    gate = torch.from_numpy(_stored(path, "blk.1.ffn_gate.weight"))
    gate_up = layer.gate_up.quantized.values(torch.float32)
    torch.testing.assert_close(gate_up[: gate.shape[0]], gate, rtol=1e-6, atol=1e-7)


def test_the_start_up_line_says_what_each_stored_type_became(tmp_path):
    """The log line of stored types: 4-bit layers and embedding from their
    blocks, the layers stored in more bits on int8 (Q8_0 from its blocks where
    the int8 tiles serve bfloat16) and what is fused with them."""
    from sluiceway.runner.checkpoint.stored_int4 import int8_blocks_served
    from sluiceway.runner.checkpoint.type_report import stored_types_report

    model = _model("llama")
    assert not model.config.tie_word_embeddings
    path = tmp_path / "tiny-llama.mix.gguf"
    write_gguf(model, path, Q.Q4_0, embedding_type=Q.Q4_0, linear_overrides={"ffn_down": Q.Q8_0})
    loaded = load_model(str(path), dtype="bfloat16", progress=False)
    line = stored_types_report(loaded, "int4", from_blocks=True)
    assert line.startswith("stored ")
    parts = set(line.removeprefix("stored ").split("; "))
    layers = model.config.num_hidden_layers
    assert parts == {
        f"F32 norms, biases, routers ({2 * layers + 1}) -> bfloat16",
        "Q4_0 embedding (1) -> its stored blocks, token rows read back in bfloat16",
        "Q4_0 output head (1) -> int4 from the stored blocks",
        f"Q4_0 layer linears ({6 * layers}) -> int4 from the stored blocks, int8 where fused "
        "with a part stored in more bits",
        f"Q8_0 layer linears ({layers}) -> int8 "
        + (
            "from the stored blocks"
            if int8_blocks_served(torch.bfloat16)
            else "(dequantized, requantized)"
        )
        + ", its stored bits kept",
    }


@pytest.mark.parametrize(
    ("config_cls", "model_cls", "extra"),
    [
        *[(c, m, f) for c, m, f in FAMILIES.values()],
        ("LlamaConfig", "LlamaForCausalLM", dict(tie_word_embeddings=True)),
        ("Gemma2Config", "Gemma2ForCausalLM", dict(head_dim=16)),
        ("Gemma3TextConfig", "Gemma3ForCausalLM", dict(head_dim=16)),
    ],
    ids=[*FAMILIES, "llama-tied", "gemma2", "gemma3_text"],
)
def test_the_config_read_through_the_fast_header_reader_is_transformers_own(
    tmp_path, config_cls, model_cls, extra
):
    """A GGUF's config built by transformers' legacy reader over transformers'
    fast header reader (`gguf_metadata._header_reader`, seconds faster for a
    large vocabulary) equals the one over gguf-py's reader, field for field, and
    gguf-py's reader is back in place after."""
    import gguf
    from transformers import AutoConfig

    from sluiceway.runner.checkpoint.gguf_metadata import _header_reader

    config = getattr(transformers, config_cls)(**{**BASE, "vocab_size": VOCAB_SIZE, **extra})
    torch.manual_seed(0)
    model = getattr(transformers, model_cls)(config).eval()
    path = tmp_path / "tiny.gguf"
    write_gguf(model, path)
    original = gguf.GGUFReader
    with _header_reader():
        assert gguf.GGUFReader is not original
        fast = AutoConfig.from_pretrained(tmp_path, gguf_file=path.name, local_files_only=True)
    assert gguf.GGUFReader is original
    legacy = AutoConfig.from_pretrained(tmp_path, gguf_file=path.name, local_files_only=True)
    assert fast.model_type == legacy.model_type
    assert fast.to_dict() == legacy.to_dict()

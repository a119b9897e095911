"""Tensor parallelism serves the weight path one process serves. With int4 or int8
asked for, and with "auto" on a GGUF whose linear weights are stored Q4_1 or Q8_0,
tp=2 quantizes its slices to exactly the one-device weights: in float32 its greedy
tokens are tp=1's, its log-probabilities within 1e-4 of them (the row-parallel
sums are added in another order), and further from the unquantized model's. The
start-up line says which path it took, as tp=1's does. Slices that cannot hold a
path fall back ("auto") or are refused (an explicit path) in one line.

The model is a tiny Llama whose slices over 2 ranks all fit the native kernels
(o and down slices of 64 and 128 input features). One rank group per path."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import attrs
import pytest
import torch
from gguf import GGMLQuantizationType
from tp_helpers import PROMPTS, alive, run_rounds, start_ranks, tiny_llama

from gguf_files import VOCAB_SIZE, write_gguf
from sluiceway.config import EngineConfig, ModelConfig
from sluiceway.engine.batch import SampledToken, StepBatch
from sluiceway.model_engine import load_bundle
from sluiceway.runner.loading import ModelLoadError
from sluiceway.runner.model_runner import TorchModelRunner
from sluiceway.runner.quantization_choice import QuantizationChoice
from sluiceway.runner.tensor_parallel import TensorParallelError, TensorParallelRunner, launch
from sluiceway.runner.tensor_parallel.quantization import sharded_quantization

SHAPE = dict(hidden_size=128, intermediate_size=256, num_attention_heads=4, kv_heads=2)
# Far above the float32 reordering of the row-parallel sums, far below what
# quantizing the weights moves.
LOGPROB_TOLERANCE = 1e-4
ENGINE = EngineConfig(num_kv_blocks=64, block_size=4)


@attrs.define
class Logprobs:
    """`runner`, recording the log-probability of every token it samples, in order."""

    runner: Any
    seen: list[float] = attrs.field(factory=list)

    @property
    def block_size(self) -> int:
        return int(self.runner.block_size)

    @property
    def num_blocks(self) -> int:
        return int(self.runner.num_blocks)

    def step(self, batch: StepBatch) -> list[SampledToken]:
        samples = list(self.runner.step(batch))
        self.seen.extend(s.logprob for s in samples)
        return samples


def greedy(runner: Any, prompts: list[list[int]]) -> tuple[list[list[int]], torch.Tensor]:
    """Greedy tokens for `prompts` and their log-probabilities, the prompts batched
    (a prefill step of every prompt's rows runs the dense weights, the decode steps
    the quantized kernels)."""
    recording = Logprobs(runner)
    [run] = run_rounds(recording, prompts, budget=512)
    return run.tokens, torch.tensor(recording.seen, dtype=torch.float64)


def assert_same_model(got: tuple, want: tuple, unquantized: tuple) -> None:
    assert got[0] == want[0]
    torch.testing.assert_close(got[1], want[1], rtol=0, atol=LOGPROB_TOLERANCE)
    # The ranks' weights are the quantized ones, not the checkpoint's.
    assert (unquantized[1] - want[1]).abs().max() > 100 * LOGPROB_TOLERANCE


@pytest.fixture(scope="module")
def model() -> torch.nn.Module:
    return tiny_llama(vocab=256, **SHAPE)


@pytest.fixture(scope="module", params=["int4", "int8"])
def quantized_ranks(request, model) -> Iterator[tuple[str, TensorParallelRunner]]:
    runner = start_ranks(model, 2, quantization=request.param)
    try:
        yield request.param, runner
    finally:
        runner.close()
    assert not any(alive(pid) for pid in runner.rank_pids)


def one_device(model, quantization: str | None) -> TorchModelRunner:
    return TorchModelRunner(
        model.config, model.state_dict(), quantization=quantization, block_size=4, num_blocks=64
    )


def test_quantized_ranks_serve_the_one_device_quantized_model(model, quantized_ranks):
    quantization, ranks = quantized_ranks
    want = greedy(one_device(model, quantization), PROMPTS)
    assert_same_model(greedy(ranks, PROMPTS), want, greedy(one_device(model, None), PROMPTS))


@pytest.fixture(scope="module")
def gguf_model(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """A tiny Llama of the GGUF helper's vocabulary, and a directory to write it into."""
    yield tiny_llama(vocab=VOCAB_SIZE, seed=1, **SHAPE), tmp_path_factory.mktemp("gguf")


def serving_line(caplog: pytest.LogCaptureFixture) -> str:
    [line] = [r.getMessage() for r in caplog.records if r.getMessage().startswith("serving ")]
    caplog.clear()
    return line


STORED = {"Q4_1": "int4", "Q8_0": "int8"}


@pytest.mark.parametrize("stored", list(STORED))
def test_auto_on_a_quantized_gguf_takes_tp1s_path_says_so_and_gives_its_tokens(
    gguf_model, stored, caplog
):
    module, directory = gguf_model
    path = directory / f"tiny.{stored}.gguf"
    write_gguf(module, path, GGMLQuantizationType[stored])
    caplog.set_level(logging.INFO, logger="sluiceway.model_engine")
    flags = dict(model=str(path), dtype="float32", quantization="auto")
    one = load_bundle(ModelConfig(**flags), ENGINE, progress=False)
    one_line = serving_line(caplog)
    assert one.quantization == STORED[stored]
    prompts = [list(one.loaded.tokenizer.encode(t)) for t in ("The river flows", "Paris is")]
    want = greedy(one.runner, prompts)
    split = load_bundle(ModelConfig(**flags, tensor_parallel_size=2), ENGINE, progress=False)
    try:
        split_line = serving_line(caplog)
        got = greedy(split.runner, prompts)
    finally:
        split.runner.close()
    assert split.quantization == one.quantization
    assert f"in float32, {STORED[stored]} weight-only (" in one_line
    assert split_line.startswith(one_line.removesuffix(")") + "; split over 2 ranks"), split_line
    assert got[0] == want[0]
    torch.testing.assert_close(got[1], want[1], rtol=0, atol=LOGPROB_TOLERANCE)


@attrs.define
class Started:
    """Stands in for the ranks' runner: keeps the spec they would start from."""

    spec: Any = None

    def __call__(self, spec, **_: Any) -> Started:
        self.spec = spec
        return self


@pytest.mark.parametrize("stored", list(STORED))
def test_the_ranks_start_in_tp1s_dtype_and_path_when_both_are_auto(
    gguf_model, stored, caplog, monkeypatch
):
    module, directory = gguf_model
    path = directory / f"tiny.{stored}.gguf"
    if not path.exists():
        write_gguf(module, path, GGMLQuantizationType[stored])
    caplog.set_level(logging.INFO, logger="sluiceway.model_engine")
    one = load_bundle(ModelConfig(model=str(path)), ENGINE, progress=False)
    one_line = serving_line(caplog)
    started = Started()
    monkeypatch.setattr(launch, "TensorParallelRunner", started)
    split = load_bundle(
        ModelConfig(model=str(path), tensor_parallel_size=2), ENGINE, progress=False
    )
    assert split.loaded.dtype == one.loaded.dtype
    assert started.spec.source.dtype == str(one.loaded.dtype).removeprefix("torch.")
    assert started.spec.quantization == one.quantization == split.quantization
    assert serving_line(caplog).startswith(one_line.removesuffix(")"))


# Slices of a model of 4 heads of 16 (hidden 64) over 2 ranks: o slices of 32
# inputs; over 4: o slices of 16 inputs. With heads of 8 (hidden 32) over 4 ranks:
# q/k/v slices of 24 outputs.
def test_auto_serves_unquantized_where_the_slices_cannot_take_the_path():
    heads_of_16 = tiny_llama(kv_heads=2).config
    heads_of_8 = tiny_llama(kv_heads=2, hidden_size=32).config
    for path, config, ranks, why in [
        ("int4", heads_of_16, 2, "the o slices have 32 input features, not a multiple of the 64"),
        ("int4", heads_of_16, 4, "the o slices have 16 input features, not a multiple of int4's"),
        ("int4", heads_of_8, 4, "the q/k/v slices have 24 output features, not a multiple of"),
        ("int8", heads_of_16, 4, "the o slices have 16 input features, not a multiple of the 32"),
    ]:
        choice = QuantizationChoice(path, "auto: stored quantized")
        decided = sharded_quantization(choice, config, ranks, requested="auto", device="cpu")
        assert decided.quantization is None
        assert decided.reason.startswith(f"auto: stored quantized, but split over {ranks} ranks")
        assert why in decided.reason, decided.reason
    kept = QuantizationChoice("int8", "auto: stored quantized")
    split = "auto: stored quantized; split over 2 ranks, each rank quantizing its slices"
    assert sharded_quantization(kept, heads_of_16, 2, requested="auto", device="cpu") == (
        attrs.evolve(kept, reason=split)
    )
    # Inputs of 48 (hidden) miss the native int8 kernels on one device too: one
    # process's decision, not the split's.
    hidden_48 = tiny_llama(kv_heads=2, hidden_size=48, num_attention_heads=2, head_dim=32).config
    assert sharded_quantization(kept, hidden_48, 2, requested="auto", device="cpu") == (
        attrs.evolve(kept, reason=split)
    )


def test_an_explicit_path_is_kept_slow_or_refused_in_one_line():
    config = tiny_llama(kv_heads=2).config
    kept = sharded_quantization(
        QuantizationChoice("int4", "--quantization int4 asked for"),
        config,
        2,
        requested="int4",
        device="cpu",
    )
    assert kept.quantization == "int4" and "slow here: the o slices have 32 input" in kept.reason
    with pytest.raises(TensorParallelError, match="use int8 or none"):
        sharded_quantization(
            QuantizationChoice("int4", "asked"), config, 4, requested="int4", device="cpu"
        )
    with pytest.raises(TensorParallelError, match="runs on CPU only"):
        sharded_quantization(
            QuantizationChoice("int8", "asked"), config, 2, requested="int8", device="cuda"
        )


def test_slices_that_cannot_hold_int4_are_refused_before_any_rank_starts(model_dir: Path):
    model = ModelConfig(model=str(model_dir), tensor_parallel_size=4, quantization="int4")
    with pytest.raises(ModelLoadError, match="o slices have 16 input features") as caught:
        load_bundle(model, ENGINE, progress=False)
    assert "\n" not in str(caught.value)

"""The weight path of a model split over ranks: the one-process `--quantization`
decision (`runner/quantization_choice.py`), kept where the slices allow it.

Each rank quantizes its own slices with the one-device `Linear`, and the slices
then hold exactly the one-device model's quantized values:

- int8 scales each output row by its largest weight. A column-parallel slice
  (q/k/v, gate/up, the output head) holds whole rows; a row-parallel one (o,
  down) holds some columns of every row and is scaled by its whole rows' largest
  weights (`ShardPlan.shard(row_absmax=True)`), not by its own.
- int4 quantizes groups of 32 consecutive inputs of a row. A row-parallel slice
  keeps the one-device groups when its width is a multiple of 32 (it then starts
  and ends on a group boundary); every slice also needs output features divisible
  by 16 (torch's packing).

The native kernels that make the quantized path fast take 64 inputs at a time
for int4 and 32 for int8 (`native/`); a slice they do not take runs on torch's
fallback, several times slower than unquantized in float32. So "auto" keeps a
quantized path only where every slice fits the native kernels, and otherwise
serves the model unquantized and says why; an explicit `int8` or `int4` is kept
where the slices can hold it (slow slices noted) and refused in one line where
they cannot.
"""

from __future__ import annotations

from collections.abc import Callable

from sluiceway.runner.linear import INT4_GROUP_SIZE
from sluiceway.runner.quantization_choice import QuantizationChoice
from sluiceway.runner.tensor_parallel.sharding import ShardPlan, TensorParallelError

# Input features a slice needs for the native kernels, by path.
NATIVE_INPUT_MULTIPLE = {"int4": 64, "int8": 32}
INT4_OUTPUT_MULTIPLE = 16  # torch's int4 packing


def sharded_quantization(
    choice: QuantizationChoice, config, world_size: int, *, requested: str | None, device: str
) -> QuantizationChoice:
    """`choice` (one process's decision for `config`, asked for as `requested`)
    for `config` split over `world_size` ranks: the same path with the split in
    its reason, or, for "auto", None and why the slices cannot take the path.
    Raises `TensorParallelError` (one line) when the model does not split, or an
    explicit path cannot be held by its slices or runs off the CPU. Only what the
    split changes counts: a shape the whole model has already is one process's
    matter, decided (or refused) the same way there."""
    plan = ShardPlan.for_config(config, world_size)
    path = choice.quantization
    if path is None:
        return choice
    if device != "cpu":
        raise TensorParallelError(f"weight-only {path} runs on CPU only, not on {device}")
    split = f"split over {world_size} ranks"
    slices = plan.linear_slices(config)
    whole = ShardPlan.for_config(config, 1).linear_slices(config)
    unfit = _first_problem(_unquantizable, path, slices, whole)
    if unfit is not None:
        if requested == "auto":
            return QuantizationChoice(None, f"{choice.reason}, but {split} {unfit}")
        raise TensorParallelError(
            f"--quantization {path} with a tensor-parallel size of {world_size}: {unfit}; "
            "use int8 or none"
        )
    slow = _first_problem(_not_native, path, slices, whole)
    if slow is None:
        return QuantizationChoice(
            path, f"{choice.reason}; {split}, each rank quantizing its slices"
        )
    if requested == "auto":
        return QuantizationChoice(
            None,
            f"{choice.reason}, but {split} {slow}; torch's fallback is slower than unquantized",
        )
    return QuantizationChoice(path, f"{choice.reason}; {split}; slow here: {slow}")


Check = Callable[[str, str, tuple[int, int]], "str | None"]


def _first_problem(
    check: Check,
    path: str,
    slices: dict[str, tuple[int, int]],
    whole: dict[str, tuple[int, int]],
) -> str | None:
    """`check`'s complaint about the first slice whose whole weight it has none about."""
    for name, shape in slices.items():
        problem = check(path, name, shape)
        if problem is not None and check(path, name, whole[name]) is None:
            return problem
    return None


def _unquantizable(path: str, name: str, shape: tuple[int, int]) -> str | None:
    """Why `path` cannot hold weights of `shape` (None: it can); int8 takes any."""
    rows, cols = shape
    if path == "int4" and cols % INT4_GROUP_SIZE:
        return (
            f"the {name} slices have {cols} input features, not a multiple of "
            f"int4's groups of {INT4_GROUP_SIZE}"
        )
    if path == "int4" and rows % INT4_OUTPUT_MULTIPLE:
        return (
            f"the {name} slices have {rows} output features, not a multiple of "
            f"the {INT4_OUTPUT_MULTIPLE} int4 needs"
        )
    return None


def _not_native(path: str, name: str, shape: tuple[int, int]) -> str | None:
    """Why the native kernels do not take weights of `shape` on `path` (None: they do)."""
    multiple = NATIVE_INPUT_MULTIPLE[path]
    if shape[1] % multiple:
        return (
            f"the {name} slices have {shape[1]} input features, not a multiple of "
            f"the {multiple} the native {path} kernels take"
        )
    return None

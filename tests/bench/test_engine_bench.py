"""`sluiceway bench engine` end to end on the default model (tiny workloads)."""

from __future__ import annotations

import re

import pytest

from sluiceway.cli import main

pytestmark = pytest.mark.slow

ROW = re.compile(r"^\| (\w+) +\| +(\d+) \| +([\d.]+) \| +([\d.]+|-) \| +([\d.]+x|-) \|$")


def _rows(out: str) -> list[tuple[str, ...]]:
    table = out.split("\n\n")[-1]  # the final table, after the per-row progress lines
    return [m.groups() for line in table.splitlines() if (m := ROW.match(line))]


def _half_unit(figure: str) -> float:
    """Half the unit of `figure`'s last printed digit: how far rounding may have moved it."""
    decimals = len(figure.partition(".")[2])
    return 0.5 * 10.0**-decimals


def test_engine_and_transformers_columns(capsys):
    argv = ["bench", "engine", "--batch-sizes", "1,2", "--dtypes", "float32",
            "--prompt-tokens", "4", "--output-tokens", "3"]  # fmt: skip
    assert main(argv) == 0
    rows = _rows(capsys.readouterr().out)
    assert [(r[0], r[1]) for r in rows] == [("float32", "1"), ("float32", "2")]
    for _, _, ours, theirs, ratio in rows:
        assert float(ours) > 0 and float(theirs) > 0
        # The printed figures are rounded: the ratio of the unrounded ones lies within
        # what their rounding allows, widened by the printed ratio's own rounding.
        low = (float(ours) - _half_unit(ours)) / (float(theirs) + _half_unit(theirs))
        high = (float(ours) + _half_unit(ours)) / (float(theirs) - _half_unit(theirs))
        printed = float(ratio.removesuffix("x"))
        assert low - 0.005 <= printed <= high + 0.005, (ours, theirs, ratio)


def _linears(obj, seen=None):
    """Every `Linear` reachable from `obj` through attributes and containers."""
    import attrs

    from sluiceway.runner.linear import Linear

    seen = set() if seen is None else seen
    if id(obj) in seen:
        return []
    seen.add(id(obj))
    if isinstance(obj, Linear):
        return [obj]
    if isinstance(obj, list | tuple):
        children = list(obj)
    elif isinstance(obj, dict):
        children = list(obj.values())
    elif attrs.has(type(obj)):
        children = [getattr(obj, f.name) for f in attrs.fields(type(obj))]
    elif hasattr(obj, "__dict__") and type(obj).__module__.startswith("sluiceway."):
        children = list(vars(obj).values())
    else:
        return []
    return [found for child in children for found in _linears(child, seen)]


def test_quantization_reaches_the_engine(capsys, monkeypatch):
    from sluiceway.runner.model_runner import TorchModelRunner

    runners = []
    real_from_loaded = TorchModelRunner.from_loaded.__func__

    def spy(cls, *args, **kwargs):
        runners.append(real_from_loaded(cls, *args, **kwargs))
        return runners[-1]

    monkeypatch.setattr(TorchModelRunner, "from_loaded", classmethod(spy))
    argv = ["bench", "engine", "--batch-sizes", "1", "--dtypes", "bfloat16",
            "--prompt-tokens", "4", "--output-tokens", "2",
            "--skip-transformers", "--quantization", "int4"]  # fmt: skip
    assert main(argv) == 0
    rows = _rows(capsys.readouterr().out)
    assert [(r[0], r[1], r[3], r[4]) for r in rows] == [("bfloat16", "1", "-", "-")]
    # The layers as served, however they were built (the default model's stored
    # 4-bit blocks are adopted after the layers are made): int4 layers, an int8 head.
    (runner,) = runners
    served = {type(linear.quantized).__name__ for linear in _linears(runner.model)}
    assert served == {"Int4Weight", "Int8Weight"}

"""`sluiceway bench serve` needs the `bench` extra; without it the command says so,
and every other command still works."""

from __future__ import annotations

import sys

import pytest

from sluiceway.cli import build_parser, main


@pytest.mark.parametrize("package", ["httptools", "tqdm"])
def test_bench_serve_without_the_extra_names_it(monkeypatch, capsys, package):
    monkeypatch.setitem(sys.modules, package, None)  # as if not installed
    assert main(["bench", "serve", "--url", "http://127.0.0.1:1"]) == 2
    err = capsys.readouterr().err
    assert package in err and "pip install 'sluiceway[bench]'" in err


def test_a_plot_needs_matplotlib_too(monkeypatch, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    assert main(["bench", "serve", "--plot-out", "sweep.png"]) == 2
    assert "matplotlib" in capsys.readouterr().err


def test_the_other_commands_parse_without_the_extra(monkeypatch):
    monkeypatch.setitem(sys.modules, "httptools", None)
    parser = build_parser()
    assert parser.parse_args(["serve", "--port", "0"]).port == 0
    assert parser.parse_args(["bench", "engine"]).bench == "engine"
    with pytest.raises(SystemExit) as raised:
        parser.parse_args(["bench", "--help"])
    assert raised.value.code == 0

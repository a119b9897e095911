"""`sluiceway bench serve` against a real sluiceway server with a scripted runner."""

from __future__ import annotations

import argparse
import json
import logging
from pathlib import Path
from typing import Any, cast

import pytest
import trio

from sluiceway.api.serve import RunningServer
from sluiceway.bench.serve_bench import add_serve_bench_arguments, main, run_sweep
from sluiceway.bench.serve_load import RequestRecord
from sluiceway.bench.serve_report import format_table, percentile
from sluiceway.cli import configure_logging

OUTPUT_TOKENS = 7


def _args(*argv: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    add_serve_bench_arguments(parser)
    return parser.parse_args(list(argv))


def _ordered(p: dict[str, float | None]) -> bool:
    values = list(p.values())
    return all(v is not None for v in values) and values == sorted(values)  # type: ignore[type-var]


async def test_sweep_counts_and_percentiles(bench_server: RunningServer) -> None:
    args = _args(
        "--url", bench_server.url + "/v1",
        "--concurrency", "1,4",
        "--num-requests", "3,8",
        "--output-tokens", str(OUTPUT_TOKENS),
        "--warmup", "0",
        "--no-progress",
        "--health-probe",
    )  # fmt: skip
    with trio.fail_after(30):
        reports, config = await run_sweep(args)
    assert config["model"] == "bench-test-model"  # found through /v1/models
    assert [r.concurrency for r in reports] == [1, 4]
    assert [r.requests for r in reports] == [3, 8]
    for r in reports:
        assert (r.completed, r.failed, r.timed_out) == (r.requests, 0, False), r.errors
        assert r.output_tokens == OUTPUT_TOKENS * r.requests
        assert r.output_tok_s > 0 and r.requests_s > 0 and r.duration_s > 0
        assert r.prompt_tokens_mean and r.prompt_tokens_mean > 5  # from the usage chunk
        assert _ordered(r.ttft_s) and _ordered(r.itl_s)
        assert set(r.ttft_s) == set(r.itl_s) == {"p50", "p90", "p99"}
        assert r.health_s is not None and set(r.health_s) == {"p50", "p99"}
        assert r.health_failures == 0
        if r.health_probes:
            assert _ordered(r.health_s)
    # The server generated exactly what the report counted: ignore_eos + max_tokens held.
    assert bench_server.state.engine.stats().generation_tokens_total == OUTPUT_TOKENS * 11
    table = format_table(reports).splitlines()
    assert len(table) == 2 + 2 and table[0].startswith("| concurrency |")
    assert "/health p99 ms" in table[0]


async def test_cli_writes_table_json_and_png(
    bench_server: RunningServer, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    json_out, plot_out = tmp_path / "bench.json", tmp_path / "bench.png"
    argv = [
        "--url", bench_server.url,
        "--api", "completions",
        "--prompts", "random", "--random-words", "12",
        "--concurrency", "1,4",
        "--num-requests", "4",
        "--output-tokens", str(OUTPUT_TOKENS),
        "--no-progress",
        "--json-out", str(json_out),
        "--plot-out", str(plot_out),
    ]  # fmt: skip
    with trio.fail_after(60):
        rc = await trio.to_thread.run_sync(main, argv)  # its own trio.run in a thread
    assert rc == 0
    out = capsys.readouterr().out
    assert "| concurrency |" in out and "output tok/s" in out
    rows = [
        line for line in out.splitlines() if line.startswith("| 1 |") or line.startswith("| 4 |")
    ]
    assert len(rows) == 2
    payload: dict[str, Any] = json.loads(json_out.read_text())
    assert payload["config"]["api"] == "completions"
    assert payload["config"]["num_requests"] == [4, 4]
    levels = payload["levels"]
    assert [lv["concurrency"] for lv in levels] == [1, 4]
    for lv in levels:
        assert lv["completed"] == 4 and lv["failed"] == 0
        assert lv["output_tokens"] == 4 * OUTPUT_TOKENS
        assert lv["ttft_s"]["p50"] <= lv["ttft_s"]["p90"] <= lv["ttft_s"]["p99"]
        assert lv["health_s"] is None and lv["engine_tok_s"] is None
    assert plot_out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


async def test_bad_request_is_counted_not_raised(bench_server: RunningServer) -> None:
    args = _args(
        "--url", bench_server.url,
        "--model", "no-such-model",
        "--concurrency", "2",
        "--num-requests", "3",
        "--warmup", "0",
        "--no-progress",
    )  # fmt: skip
    with trio.fail_after(30):
        reports, _ = await run_sweep(args)
    (r,) = reports
    assert (r.completed, r.failed, r.output_tokens) == (0, 3, 0)
    assert r.errors and r.errors[0].startswith("HTTP 404")
    assert r.ttft_s == {"p50": None, "p90": None, "p99": None}


def test_percentile_and_record_fallback() -> None:
    assert percentile([], 50) is None
    assert percentile([3.0, 1.0, 2.0], 50) == 2.0
    assert percentile([0.0, 10.0], 90) == pytest.approx(9.0)
    record = RequestRecord(start=0.0, first_token=0.5, chunk_times=[0.5, 0.7, 1.0])
    assert record.output_tokens == 3  # no usage chunk: count content chunks
    assert record.ttft == 0.5
    assert record.inter_token_latencies() == pytest.approx([0.2, 0.3])
    record.usage_tokens = 5
    assert record.output_tokens == 5


def test_num_requests_must_match_levels() -> None:
    from sluiceway.bench.serve_bench import _request_counts

    assert _request_counts(_args("--concurrency", "1,8")) == [8, 16]
    assert _request_counts(_args("--concurrency", "1,8", "--num-requests", "5")) == [5, 5]
    with pytest.raises(SystemExit):
        _request_counts(_args("--concurrency", "1,8", "--num-requests", "1,2,3"))
    with pytest.raises(SystemExit):
        _args("--concurrency", "0,4")


@pytest.mark.slow
async def test_engine_baseline_runs_all_torch_work_on_its_own_thread(
    bench_server: RunningServer, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Loading and measuring on one thread keeps one OpenMP team (a baseline that
    loaded on the main thread and measured on a worker thread read 2-3x low)."""
    import threading

    from sluiceway.bench import engine_bench
    from sluiceway.runner import loading

    threads: dict[str, set[str]] = {"load": set(), "measure": set()}
    real_load, real_time = loading.load_model, engine_bench.time_engine

    def spy_load(*a: Any, **k: Any) -> Any:
        threads["load"].add(threading.current_thread().name)
        return real_load(*a, **k)

    def spy_time(*a: Any, **k: Any) -> float:
        threads["measure"].add(threading.current_thread().name)
        return real_time(*a, **k)

    monkeypatch.setattr(loading, "load_model", spy_load)
    monkeypatch.setattr(engine_bench, "time_engine", spy_time)
    argv = [
        "--url", bench_server.url,
        "--concurrency", "2",
        "--num-requests", "2",
        "--output-tokens", "3",
        "--no-progress",
        "--engine-baseline", "--baseline-dtype", "float32",
    ]  # fmt: skip
    with trio.fail_after(120):
        rc = await trio.to_thread.run_sync(main, argv)
    assert rc == 0
    # One thread did both, the engine's own model thread (not main, not a trio worker).
    assert threads == {"load": {"sluiceway-model"}, "measure": {"sluiceway-model"}}


def test_cli_logging_keeps_sluiceway_info_and_drops_httpx_request_lines() -> None:
    httpx_logger, ours = logging.getLogger("httpx"), logging.getLogger("sluiceway.api")
    saved = (httpx_logger.level, ours.level, logging.getLogger().level)
    try:
        httpx_logger.setLevel(logging.NOTSET)
        logging.getLogger().setLevel(logging.INFO)  # what basicConfig sets outside pytest
        configure_logging()
        assert ours.isEnabledFor(logging.INFO)
        assert not httpx_logger.isEnabledFor(logging.INFO)
        assert httpx_logger.isEnabledFor(logging.WARNING)
    finally:
        httpx_logger.setLevel(saved[0])
        ours.setLevel(saved[1])
        logging.getLogger().setLevel(saved[2])


class _ScriptedBaseline:
    """Stands in for `EngineBaseline`: returns scripted engine rates, records the asks."""

    def __init__(self, rates: list[float]) -> None:
        self.rates = rates
        self.calls: list[tuple[int, int, int, int]] = []

    async def rate(self, batch: int, prompt_tokens: int, output_tokens: int, rounds: int) -> float:
        self.calls.append((batch, prompt_tokens, output_tokens, rounds))
        return self.rates.pop(0)


async def test_engine_baseline_brackets_each_level(bench_server: RunningServer) -> None:
    """The engine is timed right before and right after each level; the share is taken
    against the mean of the two, and both stay in the report."""
    args = _args(
        "--url", bench_server.url,
        "--concurrency", "1,2",
        "--num-requests", "3,20",
        "--output-tokens", str(OUTPUT_TOKENS),
        "--warmup", "1",
        "--no-progress",
        "--paired-rounds", "0",
    )  # fmt: skip
    baseline = _ScriptedBaseline([100.0, 300.0, 50.0, 70.0])
    with trio.fail_after(30):
        reports, _ = await run_sweep(args, cast(Any, baseline))
    first, second = reports
    assert first.engine_tok_s_bracket == (100.0, 300.0) and first.engine_tok_s == 200.0
    assert second.engine_tok_s_bracket == (50.0, 70.0) and second.engine_tok_s == 60.0
    assert first.engine_fraction == pytest.approx(first.output_tok_s / 200.0)
    assert first.prompt_tokens_mean and second.prompt_tokens_mean
    # Before the first level the prompt length comes from the warm-up request, after
    # it from the level; one round per request a worker sends, at most eight.
    warm_prompt = baseline.calls[0][1]
    assert warm_prompt > 5
    assert baseline.calls == [
        (1, warm_prompt, OUTPUT_TOKENS, 3),
        (1, round(first.prompt_tokens_mean), OUTPUT_TOKENS, 3),
        (2, round(first.prompt_tokens_mean), OUTPUT_TOKENS, 8),
        (2, round(second.prompt_tokens_mean), OUTPUT_TOKENS, 8),
    ]
    assert "engine_tok_s_bracket" in first.to_dict()


async def test_paired_rounds_alternate_which_side_goes_first(bench_server: RunningServer) -> None:
    """After the level, each paired round sends `concurrency` requests together and runs
    one engine batch of that size; even rounds start with the server, odd ones with
    the engine, and the share is each side's total tokens over its total time."""
    args = _args(
        "--url", bench_server.url,
        "--concurrency", "2",
        "--num-requests", "2",
        "--output-tokens", str(OUTPUT_TOKENS),
        "--warmup", "0",
        "--no-progress",
        "--paired-rounds", "3",
    )  # fmt: skip
    generated: list[int] = []

    class Baseline(_ScriptedBaseline):
        async def rate(self, *ask: int) -> float:
            generated.append(bench_server.state.engine.stats().generation_tokens_total)
            return await super().rate(*ask)

    baseline = Baseline([100.0, 100.0, 50.0, 100.0, 200.0])
    with trio.fail_after(30):
        (report,), _ = await run_sweep(args, cast(Any, baseline))
    per_round = 2 * OUTPUT_TOKENS  # two requests of OUTPUT_TOKENS each
    # bracket before, level, bracket after, then server | engine, engine | server, server | engine
    assert generated == [0, per_round, 2 * per_round, 2 * per_round, 4 * per_round]
    assert [call[0] for call in baseline.calls] == [2] * 5
    assert [call[3] for call in baseline.calls[2:]] == [1, 1, 1]  # one batch per round
    assert report.paired_rounds is not None
    assert [engine for _, engine in report.paired_rounds] == [50.0, 100.0, 200.0]
    server = [tok_s for tok_s, _ in report.paired_rounds]
    assert all(tok_s > 0 for tok_s in server)
    expected = (1 / 50 + 1 / 100 + 1 / 200) / sum(1 / tok_s for tok_s in server)
    assert report.paired_fraction == pytest.approx(expected)
    assert report.to_dict()["paired_fraction"] == report.paired_fraction


def test_paired_fraction_is_total_tokens_over_total_time() -> None:
    from sluiceway.bench.serve_report import LevelReport

    report = LevelReport(
        concurrency=1, requests=1, completed=1, failed=0, timed_out=False, duration_s=1.0,
        output_tokens=1, prompt_tokens_mean=None, output_tok_s=1.0, requests_s=1.0,
        ttft_s={}, itl_s={}, paired_rounds=[(90.0, 100.0), (45.0, 50.0)],
    )  # fmt: skip
    # 1/100 + 1/50 = 0.03 s per token for the engine, 1/90 + 1/45 = 0.0333 for the server
    assert report.paired_fraction == pytest.approx(0.9)
    report.paired_rounds = []
    assert report.paired_fraction is None


def _paired_report(rounds: list[tuple[float, float]]) -> Any:
    from sluiceway.bench.serve_report import LevelReport

    return LevelReport(
        concurrency=1, requests=1, completed=1, failed=0, timed_out=False, duration_s=1.0,
        output_tokens=1, prompt_tokens_mean=None, output_tok_s=1.0, requests_s=1.0,
        ttft_s={}, itl_s={}, paired_rounds=rounds,
    )  # fmt: skip


def test_paired_fraction_interval_brackets_the_share_within_the_rounds() -> None:
    """The interval holds the share, lies within the rounds' own shares, narrows as
    the same spread is seen over more rounds, and is the same on every call."""
    few = [(90.0, 100.0), (80.0, 100.0), (100.0, 100.0), (85.0, 100.0)]
    report = _paired_report(few)
    interval = report.paired_fraction_interval
    assert interval is not None
    low, high = interval
    assert 0.8 <= low < report.paired_fraction < high <= 1.0
    assert report.paired_fraction_interval == interval
    assert report.to_dict()["paired_fraction_interval"] == interval
    many = _paired_report(few * 8).paired_fraction_interval
    assert many is not None
    assert low < many[0] and many[1] < high


def test_paired_fraction_interval_needs_two_usable_rounds() -> None:
    assert _paired_report([(90.0, 100.0)]).paired_fraction_interval is None
    assert _paired_report([(90.0, 100.0), (0.0, 100.0)]).paired_fraction_interval is None
    same = _paired_report([(90.0, 100.0), (45.0, 50.0)]).paired_fraction_interval
    assert same == (pytest.approx(0.9), pytest.approx(0.9))


async def test_engine_rate_is_total_tokens_over_total_time(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Rounds at 100 and 300 tok/s make 150 tok/s (equal tokens, 3x the time in the
    slow round), not their plain mean; every round runs on the baseline's thread."""
    import threading

    from sluiceway.bench.serve_bench import EngineBaseline
    from sluiceway.engine.step_threads import ModelThread

    baseline = object.__new__(EngineBaseline)
    baseline.thread = ModelThread(name="baseline-test")
    rates, threads = [100.0, 300.0], set()

    def measure(batch: int, prompt_tokens: int, output_tokens: int) -> float:
        threads.add(threading.current_thread().name)
        assert (batch, prompt_tokens, output_tokens) == (4, 512, 16)  # the prompt is capped
        return rates.pop(0)

    monkeypatch.setattr(baseline, "measure", measure)
    try:
        with trio.fail_after(10):
            assert await baseline.rate(4, 4000, 16, 2) == pytest.approx(150.0)
    finally:
        baseline.close()
    assert threads == {"baseline-test"}


def test_mask_time_per_token_from_two_metric_readings() -> None:
    from sluiceway.bench.serve_load import mask_us_per_token, response_format

    before = {
        "sluiceway_grammar_mask_rows_total": 100.0,
        "sluiceway_grammar_mask_fill_seconds_total": 0.001,
        "sluiceway_grammar_mask_wait_seconds_total": 0.0,
    }
    after = {
        "sluiceway_grammar_mask_rows_total": 1100.0,
        "sluiceway_grammar_mask_fill_seconds_total": 0.021,
        "sluiceway_grammar_mask_wait_seconds_total": 0.002,
    }
    fill, wait = mask_us_per_token(before, after) or (None, None)
    assert fill == pytest.approx(20.0) and wait == pytest.approx(2.0)
    assert mask_us_per_token(before, before) is None  # no masked tokens: nothing to say
    assert mask_us_per_token(None, after) is None  # a server without the counters
    assert response_format("text") is None
    assert response_format("json_schema")["json_schema"]["schema"]["minItems"] == 50

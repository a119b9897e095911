"""`sluiceway bench serve`: a streaming load generator for any OpenAI-compatible URL.

For each concurrency level it keeps that many streamed requests in flight (closed
loop) until the level's request count is done (or its time limit passes), asking
for a fixed number of output tokens (`ignore_eos` + `max_tokens`), and reports
output tokens/s, requests/s, time to first token and inter-token latency
(p50/p90/p99) as a markdown table, JSON (`--json-out`) and a PNG (`--plot-out`).
Token counts come from the usage chunk (`stream_options.include_usage`), else
from the number of content chunks. Inter-token latency is the gap between
successive content chunks.

    python -m sluiceway.bench.serve_bench --url http://127.0.0.1:8000 --concurrency 1,8,32
"""

from __future__ import annotations

import argparse
import functools
import sys
import time
from collections.abc import Sequence
from typing import Any

import attrs
import httpx
import trio

from sluiceway.bench.load_http import Connection, Origin
from sluiceway.bench.serve_load import (
    BUILTIN_PROMPTS,
    LevelRun,
    LoadSpec,
    RequestRecord,
    default_requests,
    first_model,
    mask_counters,
    mask_us_per_token,
    random_prompts,
    response_format,
    root_url,
    run_level,
    timed_request,
)
from sluiceway.bench.serve_report import (
    LevelReport,
    format_table,
    summarize,
    write_json,
    write_plot,
)


def _int_list(text: str) -> list[int]:
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"not a comma-separated list of integers: {text!r}"
        ) from None
    if not values or any(v < 1 for v in values):
        raise argparse.ArgumentTypeError("give positive integers, e.g. 1,8,32")
    return values


def add_serve_bench_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `sluiceway bench serve`."""
    t = parser.add_argument_group("target")
    t.add_argument("--url", default="http://127.0.0.1:8000", help="server root (or .../v1)")
    t.add_argument(
        "--model", default=None, help="model name to request (default: the first of /v1/models)"
    )
    t.add_argument("--api-key", default=None, help="sent as a bearer token")
    t.add_argument(
        "--api", choices=["chat", "completions"], default="chat", help="which endpoint to stream"
    )
    w = parser.add_argument_group("workload")
    w.add_argument(
        "--concurrency", type=_int_list, default=[1, 8, 32, 64], help="levels, e.g. 1,8,32,64"
    )
    w.add_argument(
        "--num-requests",
        type=_int_list,
        default=None,
        help="requests per level: one number for all, or one per level (default: max(8, 2 x concurrency))",
    )
    w.add_argument("--output-tokens", type=int, default=128, help="max_tokens of each request")
    w.add_argument(
        "--no-ignore-eos",
        action="store_true",
        help="do not send ignore_eos (servers that reject it)",
    )
    w.add_argument(
        "--response-format",
        choices=["text", "json_object", "json_schema"],
        default="text",
        help="constrain every output: json_schema asks for an array of 50+ records",
    )
    w.add_argument("--prompts", choices=["builtin", "random"], default="builtin", help="prompt set")
    w.add_argument(
        "--random-words", type=int, default=64, help="random prompts: mean length in words"
    )
    w.add_argument(
        "--random-range-ratio", type=float, default=0.5, help="random prompts: length spread (0..1)"
    )
    w.add_argument("--seed", type=int, default=0)
    w.add_argument("--warmup", type=int, default=1, help="unmeasured requests before the sweep")
    w.add_argument(
        "--max-duration", type=float, default=300.0, help="seconds a level may run before it is cut"
    )
    w.add_argument(
        "--request-timeout", type=float, default=300.0, help="seconds one request may take"
    )
    o = parser.add_argument_group("extras and output")
    o.add_argument(
        "--health-probe",
        action="store_true",
        help="GET /health every 50 ms during load; report its latency",
    )
    o.add_argument(
        "--engine-baseline",
        action="store_true",
        help="also run the in-process engine at each concurrency (loads the model here)",
    )
    o.add_argument(
        "--baseline-model",
        default=None,
        help="model for --engine-baseline (default: the embedded default model)",
    )
    o.add_argument("--baseline-dtype", default="auto", help="dtype for --engine-baseline")
    o.add_argument(
        "--baseline-quantization",
        default="auto",
        choices=["auto", "none", "int8", "int4"],
        help="quantization for --engine-baseline (match the server's; default auto, as the server's)",
    )
    o.add_argument(
        "--paired-rounds",
        type=int,
        default=8,
        help="with --engine-baseline: after each level, this many rounds of `concurrency` "
        "requests sent together, each paired with an engine batch of the same size (0: none)",
    )
    o.add_argument("--json-out", default=None, help="write the report as JSON here")
    o.add_argument("--plot-out", default=None, help="write a PNG plot here")
    o.add_argument("--no-progress", action="store_true", help="no progress bar")


_DEFAULT_PROMPT_TOKENS = 32  # the engine's prompt length before the server reported one
_MAX_BASELINE_PROMPT = 512  # the baseline's KV cache is sized for prompts up to this
_MAX_BASELINE_ROUNDS = 8


def _request_counts(args: argparse.Namespace) -> list[int]:
    levels = args.concurrency
    counts = args.num_requests
    if counts is None:
        return [default_requests(c) for c in levels]
    if len(counts) == 1:
        return counts * len(levels)
    if len(counts) != len(levels):
        raise SystemExit("--num-requests: give one number, or one per --concurrency level")
    return list(counts)


def _prompts(args: argparse.Namespace, total: int) -> list[str]:
    if args.prompts == "random":
        return random_prompts(max(total, 1), args.random_words, args.random_range_ratio, args.seed)
    return list(BUILTIN_PROMPTS)


async def run_sweep(
    args: argparse.Namespace, baseline: EngineBaseline | None = None
) -> tuple[list[LevelReport], dict[str, Any]]:
    """Run the whole sweep against `args.url` (and `baseline` before and after each
    level, then in `args.paired_rounds` paired rounds); returns the per-level reports
    and the configuration that produced them."""
    from tqdm import tqdm

    url = root_url(args.url)
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    levels = args.concurrency
    counts = _request_counts(args)
    origin = Origin.from_url(url, headers)  # the streamed requests (`load_http`)
    async with httpx.AsyncClient(
        base_url=url, headers=headers, timeout=None, trust_env=False
    ) as client:
        model = args.model or await first_model(client)
        spec = LoadSpec(
            model=model,
            api=args.api,
            output_tokens=args.output_tokens,
            ignore_eos=not args.no_ignore_eos,
            request_timeout=args.request_timeout,
            response_format=response_format(args.response_format),
        )
        prompts = _prompts(args, sum(counts))
        warmup = Connection(origin)
        warmed: list[RequestRecord] = []
        try:
            for i in range(args.warmup):
                warmed.append(await timed_request(warmup, spec, prompts[i % len(prompts)]))
        finally:
            await warmup.aclose()
        # The engine's prompt length before a level: the last one the server reported.
        known = [r.prompt_tokens for r in warmed if r.prompt_tokens is not None]
        prompt_tokens = round(sum(known) / len(known)) if known else _DEFAULT_PROMPT_TOKENS
        reports = []
        with tqdm(total=sum(counts), unit="req", disable=args.no_progress, file=sys.stderr) as bar:
            for concurrency, count in zip(levels, counts, strict=True):
                rounds = min(max(1, count // concurrency), _MAX_BASELINE_ROUNDS)
                before = None
                if baseline is not None:
                    bar.set_description(f"engine at batch {concurrency}")
                    before = await baseline.rate(
                        concurrency, prompt_tokens, args.output_tokens, rounds
                    )
                bar.set_description(f"concurrency {concurrency}")
                masks_before = await mask_counters(client)
                run: LevelRun = await run_level(
                    origin,
                    spec,
                    prompts,
                    concurrency=concurrency,
                    num_requests=count,
                    max_duration=args.max_duration,
                    on_done=lambda _r: bar.update(1),
                    probe_health=args.health_probe,
                )
                report = summarize(run)
                report.grammar_mask_us = mask_us_per_token(masks_before, await mask_counters(client))
                if report.prompt_tokens_mean:
                    prompt_tokens = round(report.prompt_tokens_mean)
                if baseline is not None and before is not None:
                    # Measured right before and right after the level, so that a
                    # machine whose speed drifts (shared hosts do, within minutes)
                    # is seen by both figures alike.
                    bar.set_description(f"engine at batch {concurrency}")
                    after = await baseline.rate(
                        concurrency, prompt_tokens, args.output_tokens, rounds
                    )
                    report.engine_tok_s_bracket = (before, after)
                    report.engine_tok_s = (before + after) / 2
                if baseline is not None and args.paired_rounds > 0:
                    bar.set_description(f"paired rounds at {concurrency}")
                    report.paired_rounds = await paired_rounds(
                        origin,
                        spec,
                        prompts,
                        baseline,
                        concurrency=concurrency,
                        prompt_tokens=prompt_tokens,
                        output_tokens=args.output_tokens,
                        pairs=args.paired_rounds,
                        max_duration=args.max_duration,
                    )
                reports.append(report)
    config = {
        "url": url,
        "model": model,
        "api": args.api,
        "output_tokens": args.output_tokens,
        "ignore_eos": not args.no_ignore_eos,
        "prompts": args.prompts,
        "response_format": args.response_format,
        "concurrency": levels,
        "num_requests": counts,
        "health_probe": args.health_probe,
        "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    return reports, config


async def paired_rounds(
    origin: Origin,
    spec: LoadSpec,
    prompts: Sequence[str],
    baseline: EngineBaseline,
    *,
    concurrency: int,
    prompt_tokens: int,
    output_tokens: int,
    pairs: int,
    max_duration: float,
) -> list[tuple[float, float]]:
    """(server tok/s, engine tok/s) of `pairs` rounds. A round sends `concurrency`
    requests to the server together and waits for all of them, and runs one engine
    batch of as many sequences: both sides then do the same work in the same shape
    (a static batch, prefill included). The side that goes first alternates, and
    each pair is seconds apart, so a machine whose speed drifts favours neither."""

    async def server() -> float:
        run = await run_level(
            origin,
            spec,
            prompts,
            concurrency=concurrency,
            num_requests=concurrency,
            max_duration=max_duration,
        )
        return summarize(run).output_tok_s

    async def engine() -> float:
        return await baseline.rate(concurrency, prompt_tokens, output_tokens, 1)

    out = []
    for i in range(pairs):
        if i % 2 == 0:
            server_tok_s = await server()
            engine_tok_s = await engine()
        else:
            engine_tok_s = await engine()
            server_tok_s = await server()
        out.append((server_tok_s, engine_tok_s))
    return out


class EngineBaseline:
    """The in-process engine (the `sluiceway bench engine` measurement: random-token
    prompts, greedy, ignore_eos), loaded once and timed at one batch size at a time,
    right before and right after the server's level at the same concurrency, and in
    rounds paired with the server's (`paired_rounds`).

    Built like the server's engine (`load_bundle_on_thread`): loading and every
    measurement run on `thread`. Torch work spread over two OS threads runs two
    OpenMP teams that fight over the cores, which made this baseline read 2-3x low."""

    def __init__(
        self,
        model: str | None,
        dtype: str,
        max_batch: int,
        max_seq_tokens: int,
        quantization: str | None = "auto",
    ) -> None:
        from sluiceway.config import EngineConfig, ModelConfig
        from sluiceway.model_engine import build_core, load_bundle_on_thread

        config = EngineConfig(
            max_num_seqs=max_batch, max_num_batched_tokens=max(2048, max_batch * max_seq_tokens)
        )
        blocks_per_seq = -(-max_seq_tokens // config.block_size)
        config = attrs.evolve(config, num_kv_blocks=max_batch * blocks_per_seq + 8)
        model_config = ModelConfig(
            model=model,
            dtype=dtype,  # type: ignore[arg-type]
            quantization=quantization,  # type: ignore[arg-type]
        )
        bundle = load_bundle_on_thread(model_config, config, progress=False)
        assert bundle.thread is not None
        self.thread = bundle.thread
        self.core = build_core(bundle, config)
        self.vocab = bundle.loaded.hf_config.vocab_size
        self.dtype = str(bundle.loaded.dtype).removeprefix("torch.")
        self.quantization = bundle.quantization
        self.thread.call(lambda: self.measure(2, 8, 4))  # warm-up

    def measure(self, batch: int, prompt_tokens: int, output_tokens: int) -> float:
        """Output tokens/s at `batch` sequences, prefill included. Call on `thread`."""
        from sluiceway.bench.engine_bench import random_prompts as token_prompts
        from sluiceway.bench.engine_bench import time_engine

        prompts = token_prompts(batch, prompt_tokens, self.vocab, batch)
        return time_engine(self.core, prompts, output_tokens)

    async def rate(self, batch: int, prompt_tokens: int, output_tokens: int, rounds: int) -> float:
        """Output tokens/s over `rounds` batches of `batch` sequences (the harmonic
        mean of the rounds: total tokens over total time), run on `thread`.
        Cancellation waits for the round in flight."""
        prompt_tokens = min(max(prompt_tokens, 1), _MAX_BASELINE_PROMPT)
        seconds = 0.0
        for _ in range(rounds):
            tok_s = await self.thread.run(
                functools.partial(self.measure, batch, prompt_tokens, output_tokens)
            )
            seconds += batch * output_tokens / tok_s
        return rounds * batch * output_tokens / seconds

    def close(self) -> None:
        self.thread.stop()


def run_serve_bench(args: argparse.Namespace) -> int:
    """Entry point of `sluiceway bench serve`: run, then print / write the report."""
    baseline = None
    if args.engine_baseline:
        print("engine baseline: loading the model in-process", file=sys.stderr)
        baseline = EngineBaseline(
            args.baseline_model,
            args.baseline_dtype,
            max(args.concurrency),
            max_seq_tokens=_MAX_BASELINE_PROMPT + args.output_tokens,
            quantization=args.baseline_quantization,
        )
    try:
        reports, config = trio.run(run_sweep, args, baseline)
    finally:
        if baseline is not None:
            baseline.close()
    if baseline is not None:
        config["engine_baseline"] = {
            "model": args.baseline_model,
            "dtype": baseline.dtype,
            "quantization": baseline.quantization,
            "quantization_requested": args.baseline_quantization,
            "prompt_tokens": "the mean prompt tokens the server last reported (usage), random ids",
            "timing": "before and after each level, as many batches as the level has rounds "
            f"(at most {_MAX_BASELINE_ROUNDS}); engine_tok_s is their mean",
            "paired_rounds": f"{args.paired_rounds} rounds per level of `concurrency` requests "
            "sent together, each paired with one engine batch of the same size, the first side "
            "alternating; paired_fraction is server over engine, total tokens over total time; "
            "paired_fraction_interval its 95% bootstrap interval over the rounds",
        }
    print(
        f"\n{config['api']} streaming, {args.output_tokens} output tokens per request, "
        f"model {config['model']} at {config['url']}"
    )
    print(format_table(reports))
    if args.engine_baseline:
        print("\nserver throughput as a fraction of the engine's at the same batch:")
        for r in reports:
            frac, bracket = r.engine_fraction, r.engine_tok_s_bracket
            line = f"  concurrency {r.concurrency}: " + ("-" if frac is None else f"{frac:.0%}")
            if bracket is not None:
                line += f" (engine {bracket[0]:.1f} tok/s before the level, {bracket[1]:.1f} after)"
            print(line)
        if any(r.paired_fraction is not None for r in reports):
            print(
                "\nthe same in paired rounds (requests sent together, each round next to an "
                "engine batch of its size):"
            )
            for r in reports:
                if r.paired_fraction is None or not r.paired_rounds:
                    continue
                ratios = sorted(s / e for s, e in r.paired_rounds)
                interval = r.paired_fraction_interval
                spread = "" if interval is None else (
                    f"; 95% bootstrap interval {interval[0]:.0%} to {interval[1]:.0%}"
                )
                print(
                    f"  concurrency {r.concurrency}: {r.paired_fraction:.0%} "
                    f"({len(ratios)} rounds, from {ratios[0]:.0%} to {ratios[-1]:.0%}{spread})"
                )
    failed = sum(r.failed for r in reports)
    if failed:
        examples = [e for r in reports for e in r.errors]
        print(f"\n{failed} requests failed; first error: {examples[0] if examples else '?'}")
    if args.json_out:
        write_json(args.json_out, reports, config)
    if args.plot_out:
        write_plot(
            args.plot_out,
            reports,
            f"{config['model']} ({config['api']}, {args.output_tokens} tokens)",
        )
    return 1 if failed else 0


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="sluiceway bench serve", description=__doc__.split("\n\n")[0]
    )
    add_serve_bench_arguments(parser)
    return run_serve_bench(parser.parse_args(argv))


if __name__ == "__main__":
    sys.exit(main())

"""`sluiceway serve | generate | chat | bench | probe` entry points."""

from __future__ import annotations

import argparse
import importlib.util
import logging
import os
import sys
from collections.abc import Sequence
from typing import Any

from sluiceway.chat_templates import load_chat_template, parse_template_kwargs
from sluiceway.config import KeyBudget, ServerConfig
from sluiceway.flags import (
    add_engine_flags,
    add_lora_flags,
    add_model_flags,
    engine_config,
    model_config,
    parse_size,
    positive_float,
    positive_int,
)
from sluiceway.fleet.kv_events_config import KVEventsConfig
from sluiceway.hub import HubError, add_hub_flags, hub_options, resolve_model


def _key_budgets(path: str) -> dict[str, KeyBudget]:
    from sluiceway.api.keys.rate_limits import load_key_budgets

    try:
        return load_key_budgets(path)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _reasoning_parser(name: str) -> str:
    from sluiceway.reasoning import UnknownReasoningParser, reasoning_format

    if name not in ("auto", "none"):
        try:
            reasoning_format(name)
        except UnknownReasoningParser as exc:
            raise argparse.ArgumentTypeError(str(exc)) from None
    return name


def _chat_template(value: str) -> str:
    try:
        return load_chat_template(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _template_kwargs(text: str) -> dict[str, Any]:
    try:
        return parse_template_kwargs(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _kv_events_config(text: str) -> KVEventsConfig:
    try:
        return KVEventsConfig.from_json(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None


def _serve_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("serve", help="serve the OpenAI-compatible HTTP API")
    p.add_argument("model_tag", nargs="?", default=None, metavar="MODEL", help="the same as --model")
    add_model_flags(p)
    add_lora_flags(p)
    add_hub_flags(p)
    add_engine_flags(p)
    g = p.add_argument_group("server")
    g.add_argument("--host", default="127.0.0.1")
    g.add_argument("--port", type=int, default=8000)
    g.add_argument("--served-model-name", default=None, help="model name clients use (default: the hub id as given, else from the model)")
    g.add_argument("--request-timeout", type=positive_float, default=None, help="seconds a request may run (default: no limit)")
    g.add_argument("--api-key", action="append", default=[], help="accepted bearer key; repeat for several")
    g.add_argument("--allowed-origins", action="append", default=[], help="CORS origin; repeat for several, or '*'")
    g.add_argument("--drain-grace", type=positive_float, default=30.0, help="seconds open streams may finish after SIGTERM")
    g.add_argument("--max-body-size", type=parse_size, default=4 << 20, help="largest request body accepted")
    g.add_argument(
        "--max-choices-per-request",
        type=positive_int,
        default=128,
        metavar="N",
        help="most choices (prompts x n) one request may ask for; more is a 400 (default 128, "
        "OpenAI's cap on n)",
    )
    g.add_argument("--body-timeout", type=positive_float, default=60.0, help="seconds a request body may take to arrive (then 408)")
    g.add_argument("--keep-alive-timeout", type=positive_float, default=5.0, help="seconds an idle keep-alive connection stays open")
    g.add_argument("--send-stall-timeout", type=positive_float, default=30.0, help="seconds a client may take none of the bytes sent to it before its request is aborted and its connection reset")
    g.add_argument("--max-connections", type=positive_int, default=None, help="open connections at most; more are refused with 503 (default: the file descriptor limit less a reserve)")
    g.add_argument("--access-log", nargs="?", const="logfmt", default=None, choices=["logfmt", "json"], help="one line per request on stderr, in logfmt (the default style) or JSON")
    g.add_argument("--kv-events-config", type=_kv_events_config, default=None, metavar="JSON", help="publish KV-cache events for routers, as vLLM does, e.g. '{\"enable_kv_cache_events\": true, \"publisher\": \"zmq\", \"endpoint\": \"tcp://*:5557\", \"replay_endpoint\": \"tcp://*:5558\"}' (docs/fleet.md)")
    g.add_argument("--api-key-budgets", type=_key_budgets, default={}, metavar="FILE", help='JSON of accepted keys with requests and tokens a minute each, e.g. {"keys": {"KEY": {"requests_per_minute": 60, "tokens_per_minute": 40000}}}; over budget is a 429 with Retry-After')
    g.add_argument("--response-store", default=None, metavar="PATH", help="keep stored Responses API responses in this SQLite file, so that GET and previous_response_id outlive a restart (default: in memory)")
    g.add_argument("--batch-store", default=None, metavar="PATH", help="keep uploaded files and Batch API batches in this SQLite file, so that a restart resumes a batch with the lines it had not answered (default: in memory)")
    g.add_argument("--reasoning-parser", type=_reasoning_parser, default="auto", metavar="NAME", help="split reasoning models' thinking into reasoning_content: qwen3 (also SmolLM3), deepseek_r1, think, or think:START,END for other tags; auto (default): the model family's, else the generic pair where the chat template writes <think>; none: leave it in the content. The log says which")
    g.add_argument("--chat-template", type=_chat_template, default=None, metavar="FILE_OR_STRING", help="a Jinja chat template (a file, or the template itself) used instead of the model's")
    g.add_argument("--default-chat-template-kwargs", type=_template_kwargs, default={}, metavar="JSON", help='what every chat template render is given unless a request\'s chat_template_kwargs says otherwise, e.g. \'{"enable_thinking": false}\'')
    g.add_argument("--batch-concurrency", type=positive_int, default=8, metavar="N", help="Batch API lines in the engine at once, each at background priority (default 8)")
    p.set_defaults(handler=_cmd_serve)


def _cmd_serve(args: argparse.Namespace) -> int:
    from sluiceway.api.serve import serve

    server = ServerConfig(
        host=args.host,
        port=args.port,
        request_timeout=args.request_timeout,
        api_keys=tuple(args.api_key),
        allowed_origins=tuple(args.allowed_origins),
        drain_grace_seconds=args.drain_grace,
        max_body_bytes=args.max_body_size,
        max_choices_per_request=args.max_choices_per_request,
        body_timeout=args.body_timeout,
        keep_alive_timeout=args.keep_alive_timeout,
        send_stall_timeout=args.send_stall_timeout,
        max_connections=args.max_connections,
        access_log=args.access_log,
        kv_events=args.kv_events_config,
        response_store=args.response_store,
        api_key_budgets=args.api_key_budgets,
        batch_store=args.batch_store,
        batch_concurrency=args.batch_concurrency,
        reasoning_parser=args.reasoning_parser,
        chat_template=args.chat_template,
        default_chat_template_kwargs=args.default_chat_template_kwargs,
    )
    try:
        engine = engine_config(args)
    except ValueError as exc:  # flags that cannot go together
        print(f"sluiceway: {exc}", file=sys.stderr)
        return 2
    code = serve(model_config(args), engine, server)
    if code != 0:
        return code  # it never served: nothing to hurry
    # The server has drained and stopped, every thread it started has ended and
    # its log is written. The interpreter's own teardown (freeing the model and
    # torch's thread pools, which takes a noticeable while on a small machine)
    # would only delay the exit that a supervisor waits for after SIGTERM.
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def _generate_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("generate", help="generate text offline (no server)")
    p.add_argument("prompt", nargs="+", help="one or more prompts (each is a separate request)")
    add_model_flags(p)
    add_hub_flags(p)
    p.add_argument("--max-tokens", type=int, default=64)
    p.add_argument("--temperature", type=float, default=0.0)
    p.add_argument("--seed", type=int, default=None)
    p.add_argument("--raw", action="store_true", help="do not apply the chat template")
    p.set_defaults(handler=_cmd_generate)


def _cmd_generate(args: argparse.Namespace) -> int:
    from sluiceway.engine.sampling_params import SamplingParams
    from sluiceway.offline import LLM

    llm = LLM(
        model=args.model,
        dtype=args.dtype,
        quantization=args.quantization,
        attention_backend=args.attention_backend,
        enforce_eager=args.enforce_eager,
        tensor_parallel_size=args.tensor_parallel_size,
    )
    prompts = [
        p if args.raw else llm.encode_chat([{"role": "user", "content": p}]) for p in args.prompt
    ]
    params = SamplingParams(max_tokens=args.max_tokens, temperature=args.temperature, seed=args.seed)
    with llm:  # ends tensor-parallel ranks, if any
        results = llm.generate(prompts, params)
    for prompt, result in zip(args.prompt, results, strict=True):
        print(f"### {prompt}\n{result.outputs[0].text}\n")
    return 0


def _chat_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("chat", help="chat with a running server in the terminal", add_help=False)
    p.set_defaults(handler=None)


def _bench_parser(sub: argparse._SubParsersAction) -> None:
    p = sub.add_parser("bench", help="benchmarks")
    bench = p.add_subparsers(dest="bench", required=True)
    e = bench.add_parser("engine", help="in-process decode throughput against a transformers loop")
    add_model_flags(e)
    add_hub_flags(e)
    e.add_argument("--batch-sizes", default="1,8,32,64")
    e.add_argument("--dtypes", default="float32,bfloat16")
    e.add_argument("--output-tokens", type=int, default=64)
    e.add_argument("--prompt-tokens", type=int, default=32)
    e.add_argument("--skip-transformers", action="store_true")
    e.set_defaults(handler=_cmd_bench_engine)
    s = bench.add_parser("serve", help="streaming load generator for any OpenAI-compatible URL")
    if _missing_bench_packages([]):
        return  # listed in --help all the same; `main` refuses to run it
    from sluiceway.bench.serve_bench import add_serve_bench_arguments, run_serve_bench

    add_serve_bench_arguments(s)
    s.set_defaults(handler=run_serve_bench)


def _missing_bench_packages(argv: Sequence[str]) -> list[str]:
    """The packages of the `bench` extra that `bench serve` with these arguments
    needs and cannot import: httptools and tqdm always, matplotlib for a plot."""
    needed = ["httptools", "tqdm"]
    if any(a.startswith("--plot") for a in argv):  # argparse takes abbreviations
        needed.append("matplotlib")
    return [name for name in needed if importlib.util.find_spec(name) is None]


def _cmd_bench_engine(args: argparse.Namespace) -> int:
    from sluiceway.bench.engine_bench import run_engine_bench

    return run_engine_bench(args)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sluiceway", description=__doc__)
    sub = parser.add_subparsers(dest="command", required=True)
    _serve_parser(sub)
    _generate_parser(sub)
    _chat_parser(sub)
    _bench_parser(sub)
    from sluiceway.probe.command import add_probe_parser

    add_probe_parser(sub)
    return parser


def configure_logging() -> None:
    """INFO for sluiceway and the servers it runs; warnings only from httpx, which
    logs every request at INFO (`bench serve` printed a line per request and per
    health probe, 1,445 in one sweep, between its tables)."""
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    logging.getLogger("httpx").setLevel(logging.WARNING)
    logging.getLogger("httpx2").setLevel(logging.WARNING)  # huggingface_hub's, the same per request


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["chat"]:
        from sluiceway.client.chat_cli import main as chat_main

        return chat_main(argv[1:])
    if argv[:2] == ["bench", "serve"] and (missing := _missing_bench_packages(argv[2:])):
        print(
            f"sluiceway: bench serve needs the bench extra ({', '.join(missing)} not "
            "installed): pip install 'sluiceway[bench]'",
            file=sys.stderr,
        )
        return 2
    args = build_parser().parse_args(argv)
    configure_logging()
    try:
        _resolve_model(args)
        return int(args.handler(args))
    except (HubError, _model_load_error()) as exc:
        print(f"sluiceway: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        return 130


def _resolve_model(args: argparse.Namespace) -> None:
    """Put the local path of the model asked for in `args.model`: a hub id is
    fetched into the hub cache (`sluiceway.hub`), and the name it is served
    under defaults to the id as typed. `serve MODEL` is `serve --model MODEL`."""
    tag = getattr(args, "model_tag", None)
    if tag is not None:
        if args.model is not None and args.model != tag:
            raise HubError(f"two models given: {tag} and --model {args.model}")
        args.model = tag
    if not hasattr(args, "model") or not hasattr(args, "offline"):
        return  # a command that loads no model
    resolved = resolve_model(args.model, hub_options(args))
    args.model = resolved.path
    if hasattr(args, "served_model_name") and args.served_model_name is None:
        args.served_model_name = resolved.served_name


class _NotInstalled(Exception):
    """Stands in for ModelLoadError where the runner is not installed (client-only)."""


def _model_load_error() -> type[Exception]:
    try:
        from sluiceway.runner.loading import ModelLoadError
    except ImportError:
        return _NotInstalled
    return ModelLoadError

if __name__ == "__main__":
    sys.exit(main())

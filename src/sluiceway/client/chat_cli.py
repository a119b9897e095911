"""``sluiceway chat``: a terminal chat that streams answers from a server.

Ctrl-C while an answer streams stops that answer (the HTTP stream is closed, so
the server aborts the work) and returns to the prompt; Ctrl-C (or Ctrl-D, or
``/exit``) at the prompt ends the program. ``/reset`` forgets the conversation.
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any

import trio

from sluiceway.client._client import DEFAULT_URL, AsyncClient
from sluiceway.client.errors import APIError

ReadLine = Callable[[str], Awaitable[str]]
Write = Callable[[str], None]
WaitInterrupt = Callable[[], Awaitable[None]]


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="sluiceway chat", description=__doc__.splitlines()[0])
    p.add_argument("--url", default=DEFAULT_URL, help=f"server URL (default {DEFAULT_URL})")
    p.add_argument("--model", default=None, help="model id (default: the server's first)")
    p.add_argument(
        "--api-key",
        default=os.environ.get("SLUICEWAY_API_KEY"),
        help="bearer token (default: $SLUICEWAY_API_KEY)",
    )
    p.add_argument("--system", default=None, help="a system message")
    p.add_argument("--max-tokens", type=int, default=None)
    p.add_argument("--temperature", type=float, default=None)
    p.add_argument("--timeout", type=float, default=600.0, help="idle limit per answer, s")
    return p


def main(argv: list[str] | None = None) -> int:
    """Run the chat; returns the process exit code."""
    args = _parser().parse_args(argv)
    try:
        return trio.run(_amain, args)
    except KeyboardInterrupt:
        sys.stdout.write("\n")
        return 0


async def _amain(args: argparse.Namespace) -> int:
    async with AsyncClient(args.url, args.api_key, timeout=args.timeout) as client:
        model = args.model
        if model is None:
            try:
                models = await client.models.list()
            except APIError as exc:
                sys.stderr.write(f"cannot list models at {args.url}: {exc}\n")
                return 1
            model = models.data[0].id if models.data else None
        _write(
            f"chatting with {model or 'the default model'} at {args.url} "
            "(Ctrl-C stops an answer; Ctrl-D or /exit quits)\n"
        )
        params = {"max_tokens": args.max_tokens, "temperature": args.temperature}
        return await chat_loop(
            client,
            model,
            read_line=_read_line,
            write=_write,
            wait_interrupt=_wait_sigint,
            system=args.system,
            params=params,
        )


async def chat_loop(
    client: AsyncClient,
    model: str | None,
    *,
    read_line: ReadLine,
    write: Write,
    wait_interrupt: WaitInterrupt,
    system: str | None = None,
    params: dict[str, Any] | None = None,
) -> int:
    """The conversation loop (testable: input, output and Ctrl-C are injected).

    ``read_line`` raises EOFError at end of input; ``wait_interrupt`` returns
    when the user asks to stop the current answer.
    """
    history: list[dict[str, str]] = []
    if system:
        history.append({"role": "system", "content": system})
    while True:
        try:
            line = (await read_line("you> ")).strip()
        except EOFError:
            write("\n")
            return 0
        if not line:
            continue
        if line in ("/exit", "/quit"):
            return 0
        if line == "/reset":
            del history[1 if system else 0 :]
            continue
        history.append({"role": "user", "content": line})
        answer = await stream_answer(
            client,
            model,
            history,
            write=write,
            wait_interrupt=wait_interrupt,
            params=params or {},
        )
        if answer:
            history.append({"role": "assistant", "content": answer})
        else:
            history.pop()  # nothing came back: let the user ask again


async def stream_answer(
    client: AsyncClient,
    model: str | None,
    messages: list[dict[str, str]],
    *,
    write: Write,
    wait_interrupt: WaitInterrupt,
    params: dict[str, Any],
) -> str:
    """Stream one answer to ``write``; return its text (partial if stopped)."""
    parts: list[str] = []
    stopped = False
    write("bot> ")
    async with trio.open_nursery() as nursery:

        async def stop_on_interrupt() -> None:
            nonlocal stopped
            await wait_interrupt()
            stopped = True
            nursery.cancel_scope.cancel()

        nursery.start_soon(stop_on_interrupt)
        try:
            async with client.chat.completions.stream(
                model=model, messages=list(messages), **params
            ) as stream:
                async for chunk in stream:
                    for choice in chunk.choices:
                        if choice.text:
                            parts.append(choice.text)
                            write(choice.text)
            write("\n")
        except APIError as exc:
            write(f"\n[error: {exc}]\n")
        nursery.cancel_scope.cancel()
    if stopped:
        write(" [stopped]\n")
    return "".join(parts)


def _write(text: str) -> None:
    sys.stdout.write(text)
    sys.stdout.flush()


async def _read_line(prompt: str) -> str:
    # A worker thread blocks on stdin; abandon_on_cancel lets Ctrl-C (trio's
    # KeyboardInterrupt) interrupt the wait at the prompt and end the program.
    return await trio.to_thread.run_sync(input, prompt, abandon_on_cancel=True)


async def _wait_sigint() -> None:
    # While an answer streams, SIGINT is ours: it stops the answer only.
    with trio.open_signal_receiver(signal.SIGINT) as signals:
        async for _ in signals:
            return


if __name__ == "__main__":
    raise SystemExit(main())

"""The terminal chat, with input, output and Ctrl-C injected."""

from __future__ import annotations

import trio
import trio.testing
from client_fakes import Conn, FakeServer, Request, chat_chunk

from sluiceway.client.chat_cli import _parser, chat_loop


def scripted_input(lines: list[str]):  # type: ignore[no-untyped-def]
    pending = list(lines)

    async def read_line(prompt: str) -> str:
        await trio.lowlevel.checkpoint()
        if not pending:
            raise EOFError
        return pending.pop(0)

    return read_line


async def test_chat_streams_answers_and_keeps_history(server: FakeServer) -> None:
    async def handler(req: Request, conn: Conn) -> None:
        turn = len(server.requests)
        await conn.start_sse()
        await conn.send_event(chat_chunk(0, f"answer{turn}", role="assistant"))
        await conn.send_event(chat_chunk(0, "", finish="stop"))
        await conn.send_done()

    server.handler = handler
    out: list[str] = []
    never = trio.Event()
    async with server.client() as client:
        code = await chat_loop(
            client,
            "m",
            read_line=scripted_input(["hello", "", "again"]),
            write=out.append,
            wait_interrupt=never.wait,
            system="be brief",
        )
    assert code == 0
    text = "".join(out)
    assert "answer1" in text and "answer2" in text
    assert server.requests[1].json()["messages"] == [
        {"role": "system", "content": "be brief"},
        {"role": "user", "content": "hello"},
        {"role": "assistant", "content": "answer1"},
        {"role": "user", "content": "again"},
    ]


async def test_ctrl_c_stops_the_answer_not_the_program(server: FakeServer) -> None:
    async def handler(req: Request, conn: Conn) -> None:
        await conn.start_sse()
        if len(server.requests) == 1:
            await conn.send_event(chat_chunk(0, "never ending"))
            await conn.wait_disconnect()  # the server's abort
        else:
            await conn.send_event(chat_chunk(0, "second", finish="stop"))
            await conn.send_done()

    server.handler = handler
    out: list[str] = []
    presses = {"ctrl_c": trio.Event()}

    def write(text: str) -> None:
        out.append(text)
        if text == "never ending":
            presses["ctrl_c"].set()  # the user presses Ctrl-C mid-answer

    async def wait_interrupt() -> None:
        await presses["ctrl_c"].wait()
        presses["ctrl_c"] = trio.Event()  # a key press is used up once seen

    async with server.client() as client:
        code = await chat_loop(
            client,
            "m",
            read_line=scripted_input(["one", "two"]),
            write=write,
            wait_interrupt=wait_interrupt,
        )
    assert code == 0
    text = "".join(out)
    assert "[stopped]" in text and "second" in text
    assert server.disconnected.is_set()
    # The partial answer stays in the conversation.
    assert server.requests[1].json()["messages"][1] == {
        "role": "assistant",
        "content": "never ending",
    }


def test_parser_defaults() -> None:
    args = _parser().parse_args(["--model", "m"])
    assert args.url == "http://127.0.0.1:8000" and args.model == "m"

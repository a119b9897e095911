"""`sluiceway probe` as a user runs it, in a subprocess against the loopback server:
the table, the JSON report, the exit status, and Ctrl-C closing every stream."""

from __future__ import annotations

import json
import signal
import subprocess
import sys
from pathlib import Path

import trio
from broken_server import BrokenServer, Flaws

from polling import eventually

PROBE = [sys.executable, "-m", "sluiceway.cli", "probe"]


async def start(nursery: trio.Nursery, flaws: Flaws) -> BrokenServer:
    server: BrokenServer = await nursery.start(BrokenServer(flaws).serve)
    return server


async def test_passing_run_prints_the_table_writes_json_and_exits_0(
    nursery: trio.Nursery, tmp_path: Path
) -> None:
    server = await start(nursery, Flaws())
    out = tmp_path / "probe.json"
    done = await trio.run_process(
        [*PROBE, server.url + "/v1", "--only", "parallel_streams,n_choices", "--json", str(out)],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    text = done.stdout.decode()
    assert done.returncode == 0, (text, done.stderr.decode())
    assert "parallel_streams" in text and "n_choices" in text and "2 pass" in text
    report = json.loads(out.read_text())
    assert report["model"] == "broken" and not report["failed"]
    by_name = {s["name"]: s for s in report["scenarios"]}
    assert by_name["parallel_streams"]["numbers"]["peak_overlap"] == 4
    assert by_name["parallel_streams"]["load"] == {
        "requests": 4,
        "peak_concurrency": 4,
        "max_tokens": 32,
        "kinds": {"POST /v1/chat/completions stream max_tokens=32": 4},
    }
    assert by_name["n_choices"]["load"]["kinds"] == {
        "POST /v1/chat/completions stream n=4 max_tokens=32": 1
    }


async def test_a_failed_scenario_exits_1(nursery: trio.Nursery) -> None:
    server = await start(nursery, Flaws(serialise=True))
    done = await trio.run_process(
        [*PROBE, server.url, "--only", "parallel_streams", "--json", "-"],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert done.returncode == 1, done.stderr.decode()
    assert '"verdict": "fail"' in done.stdout.decode()


async def test_an_unknown_scenario_exits_2_before_sending_anything(nursery: trio.Nursery) -> None:
    server = await start(nursery, Flaws())
    done = await trio.run_process(
        [*PROBE, server.url, "--only", "no_such_thing"],
        capture_stdout=True,
        capture_stderr=True,
        check=False,
    )
    assert done.returncode == 2
    assert "unknown scenarios ['no_such_thing']" in done.stderr.decode()
    assert not server.owners


async def test_ctrl_c_closes_every_stream_and_exits_130(nursery: trio.Nursery) -> None:
    server = await start(nursery, Flaws())
    process = await trio.lowlevel.open_process(
        [*PROBE, server.url, "--only", "disconnect_frees_work"],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        await eventually(lambda: len(server.running) == 4, limit_s=30)
        process.send_signal(signal.SIGINT)
        with trio.fail_after(30):
            code = await process.wait()
    finally:
        process.kill()
    assert code == 130
    await eventually(lambda: not server.running and server.busy_slots == 0)

"""Runs batches: one batch at a time, `concurrency` of its lines at once, each
line through the same code as its endpoint's HTTP requests but at background
priority in the engine (`Sequence.background`), so interactive requests go
first. A line's result is stored as soon as it has one (`BatchStore`).

A line the server cannot take now (draining, engine unhealthy: a 503) stays
pending, and so does its batch: a restart on the same `--batch-store` file
resumes it with the lines that have no result. A full queue (429) is waited
out, and so is the budget of the key that created the batch: each line takes a
request and its tokens from it as it runs (`rate_limits.py`), also in a process
that resumes the batch, which finds the key by the hash the store records of it
(a key that has no budget there any more leaves the lines unbudgeted). Every other
answer, success or error, is the line's result. Cancelling a batch aborts its
lines in flight; the lines done by then make its output.
Lines run on behalf of the batch's owner: its output and error files are that
owner's (`BatchStore.close_batch`), whichever process finishes it.
"""

from __future__ import annotations

import json
import logging
import time
import uuid
from collections.abc import Awaitable, Callable, Iterator, Mapping
from typing import Any

import attrs
import trio
from quart import current_app

from sluiceway.api.batches.store import UNFINISHED, BatchLine, BatchStore
from sluiceway.api.http.errors import APIError
from sluiceway.api.state import ServerState
from sluiceway.protocol.batches import Batch

log = logging.getLogger(__name__)

# How long a line refused for a full queue waits before it asks again.
_QUEUE_FULL_WAIT = 0.05


LineAnswer = Callable[[ServerState, bytes, str | None], Awaitable[dict[str, Any]]]
"""How one endpoint answers a line's body for a key, at background priority: the
response body, or `APIError` raised as the endpoint would answer it. Each surface
that batches may call provides its own (see `app.create_app`)."""


class _Unavailable(Exception):
    """The server takes no work now (draining or failed): the line stays pending."""


class BatchRunner:
    """Owns the running of every batch of one `BatchStore`; `run` is its task."""

    def __init__(
        self,
        state: ServerState,
        store: BatchStore,
        concurrency: int,
        answers: Mapping[str, LineAnswer],
    ) -> None:
        self.state = state
        self.answers = answers
        self.store = store
        self.concurrency = concurrency
        self._send, self._queue = trio.open_memory_channel[str](float("inf"))
        self._running: dict[str, trio.CancelScope] = {}
        self.idle = trio.Event()  # set while no batch is queued or running (tests)
        self._queued = 0
        self._paused = False
        # The budgeted keys (`--api-key-budgets`) by the hash the store records of
        # the key that pays for a batch: how a batch finds its payer, also one that
        # an earlier process created (its owner may be a project, naming no key).
        self._budgeted = {store.hash_payer(key): key for key in state.server_config.api_key_budgets}

    def submit(self, batch_id: str) -> None:
        """Queue a stored batch to run (after those queued before it), its lines
        charged as they run to the budget of the key the store records as paying
        for it."""
        self._queued += 1
        self.idle = trio.Event() if self.idle.is_set() else self.idle
        self._send.send_nowait(batch_id)

    def cancel(self, batch: Batch) -> Batch:
        """Cancel `batch`: one running is `cancelling` until its lines in flight have
        left the engine, then cancelled; one queued or paused is cancelled at once.
        Returns it as it is then."""
        now = int(time.time())
        batch = attrs.evolve(batch, status="cancelling", cancelling_at=now)
        self.store.put_batch(batch)
        scope = self._running.get(batch.id)
        if scope is None:
            return self._close(batch.id)
        scope.cancel()
        return batch

    def pause(self) -> None:
        """Stop running batches in this process (it is draining): the lines in
        flight are aborted and stay pending, with their batches in progress, for
        the next process on the same store."""
        self._paused = True
        for scope in self._running.values():
            scope.cancel()

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        """Resume the batches a previous process left unfinished, then run batches
        as they are submitted, until cancelled (a batch in flight then keeps its
        pending lines for the next process)."""
        for batch_id in self.store.unfinished():
            self.submit(batch_id)
        if not self._queued:
            self.idle.set()
        task_status.started()
        async for batch_id in self._queue:
            try:
                await self._run_batch(batch_id)
            finally:
                self._queued -= 1
                if not self._queued:
                    self.idle.set()

    async def _run_batch(self, batch_id: str) -> None:
        batch = self.store.batch(batch_id, owner=None)  # the server's own work
        if batch is None or batch.status not in UNFINISHED or self._paused:
            return  # gone, cancelled while queued, or left for the next process
        if batch.status == "validating":
            batch = attrs.evolve(batch, status="in_progress", in_progress_at=int(time.time()))
            self.store.put_batch(batch)
        if batch.status == "in_progress":
            key = self._payer(batch_id)
            scope = self._running[batch_id] = trio.CancelScope()
            answered = False
            try:
                with scope:
                    answered = await self._run_lines(batch, key)
            finally:
                del self._running[batch_id]
            if self._paused or not (answered or scope.cancelled_caught):
                log.info("batch %s paused: the server takes no work now", batch_id)
                return
        self._close(batch_id)

    def _payer(self, batch_id: str) -> str | None:
        """The budgeted key that pays for the batch's lines (None: no budget)."""
        recorded = self.store.batch_payer(batch_id)
        if recorded is None:
            return None  # made without a budgeted key, or before payers were recorded
        key = self._budgeted.get(recorded)
        if key is None:
            # Only a batch an earlier process created: its key has left the budgets.
            log.warning(
                "batch %s: the key that created it has no budget in --api-key-budgets"
                " now; its lines run unbudgeted",
                batch_id,
            )
        return key

    def _close(self, batch_id: str) -> Batch:
        """Ends a batch: cancelled when it was cancelling, else completed; its
        output and error files written. Returns it as stored."""
        batch = self.store.batch(batch_id, owner=None)
        assert batch is not None
        now = int(time.time())
        if batch.status == "cancelling":
            batch = attrs.evolve(batch, status="cancelled", cancelled_at=now)
        else:
            batch = attrs.evolve(batch, status="completed", finalizing_at=now, completed_at=now)
        return self.store.close_batch(batch, batch_id)

    async def _run_lines(self, batch: Batch, key: str | None) -> bool:
        """Answer every pending line, `concurrency` at once, charged to `key`'s
        budget; False (the lines in flight aborted, and pending) once the server
        takes no work now."""
        lines = iter(self.store.pending_lines(batch.id))
        unavailable: list[_Unavailable] = []
        async with trio.open_nursery() as nursery:
            for _ in range(self.concurrency):
                nursery.start_soon(
                    self._work_through, batch, key, lines, unavailable, nursery.cancel_scope
                )
        return not unavailable

    async def _work_through(
        self,
        batch: Batch,
        key: str | None,
        lines: Iterator[BatchLine],
        unavailable: list[_Unavailable],
        stop: trio.CancelScope,
    ) -> None:
        for line in lines:  # shared by the workers: each line goes to one of them
            try:
                status_code, body = await self._run_line(batch, key, line)
            except _Unavailable as exc:
                unavailable.append(exc)
                stop.cancel()
                return
            result = {
                "id": f"batch_req_{uuid.uuid4().hex}",
                "custom_id": line.custom_id,
                "response": {
                    "status_code": status_code,
                    "request_id": uuid.uuid4().hex,
                    "body": body,
                },
                "error": None,
            }
            self.store.finish_line(
                batch.id,
                line.line,
                "completed" if status_code == 200 else "failed",
                json.dumps(result),
            )

    async def _run_line(
        self, batch: Batch, key: str | None, line: BatchLine
    ) -> tuple[int, dict[str, Any]]:
        data = line.body.encode("utf-8")
        # A line is a request of its key's, as it would be sent alone; unlike one, it
        # waits for the budget (here, and for its tokens where they are counted).
        await self.state.rate_limits.take_when_there(key, requests=1)
        while True:
            try:
                return 200, await self.answers[batch.endpoint](self.state, data, key)
            except APIError as exc:
                if exc.code == "queue_full":
                    await trio.sleep(_QUEUE_FULL_WAIT)
                    continue
                if exc.status == 503:
                    raise _Unavailable() from None
                return exc.status, exc.body()
            except Exception:
                # A bug of ours: the line gets the 500 an HTTP request would.
                log.exception("batch %s line %d failed", batch.id, line.line)
                return 500, APIError(
                    500, "Internal server error.", "internal_server_error", None, None
                ).body()


def app_batch_runner(app: Any) -> BatchRunner:
    """The batch runner of `app` (`create_app` makes one for every app)."""
    return app.config["SLUICEWAY_BATCHES"]


def current_batch_runner() -> BatchRunner:
    """The batch runner of the app serving the current request."""
    return app_batch_runner(current_app)

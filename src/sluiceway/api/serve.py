"""Run the server: hypercorn's trio worker around the app, the engine loop beside it,
and a drain on SIGTERM/SIGINT.

Drain: the first signal (or `RunningServer.shutdown()`) closes the engine to new
work (new requests get 503, /health turns 503) while open requests carry on for
`ServerConfig.drain_grace_seconds`; then whatever is still open is cut (streams
get an error event and `[DONE]`, non-streaming requests a 503), hypercorn stops,
and the engine loop is cancelled. A second signal cuts at once.
"""

from __future__ import annotations

import logging
import signal
import sys

import attrs
import trio
from hypercorn.config import Config as HypercornConfig
from hypercorn.trio import serve as hypercorn_serve

from sluiceway.api.app import SluicewayApp, create_app
from sluiceway.api.batches.runner import BatchRunner, app_batch_runner
from sluiceway.api.state import ServerState
from sluiceway.config import EngineConfig, ModelConfig, ServerConfig
from sluiceway.engine.engine import Engine
from sluiceway.fleet.kv_events_serving import publishing_kv_events
from sluiceway.transport import access_log, connection_limits, tcp_server

log = logging.getLogger(__name__)

# After the grace period, how long cut requests get to write their last event; a
# client that has not taken it by then is reset. A client reading its stream takes
# it within milliseconds.
_CUT_SECONDS = 0.4
# After that, how long hypercorn waits for connections to close before cancelling
# them: by then every request has ended and every idle connection closes at once,
# so only a client still sending a body nobody reads can be left.
_CLOSE_SECONDS = 0.3


@attrs.frozen(eq=False)
class RunningServer:
    """Handle to a server started with `serve_async`. `url` is e.g. http://127.0.0.1:PORT."""

    url: str
    app: SluicewayApp
    state: ServerState
    _stop: trio.Event

    @property
    def batch_runner(self) -> BatchRunner:
        return app_batch_runner(self.app)

    def shutdown(self) -> None:
        """Begin draining (what SIGTERM does). Returns at once."""
        self._stop.set()

    def cut(self) -> None:
        """End the grace period now: open requests end their responses."""
        self.state.cut_open_requests()


async def _drain_when(
    stop: trio.Event,
    state: ServerState,
    limits: connection_limits.ConnectionLimits,
    hypercorn_stop: trio.Event,
) -> None:
    await stop.wait()
    log.info(
        "draining: %d open requests, grace %.0f s",
        state.active,
        state.server_config.drain_grace_seconds,
    )
    state.start_draining()
    with trio.move_on_after(state.server_config.drain_grace_seconds):
        await state.wait_idle()
    state.cut_open_requests()
    with trio.move_on_after(_CUT_SECONDS):
        await state.wait_idle()
    limits.cut_sends()  # nothing waits on a client that does not read
    hypercorn_stop.set()


async def _watch_signals(running: RunningServer) -> None:
    with trio.open_signal_receiver(signal.SIGTERM, signal.SIGINT) as signals:
        count = 0
        async for signum in signals:
            count += 1
            log.info("received %s", signal.Signals(signum).name)
            running.shutdown()
            if count > 1:
                running.cut()


def hypercorn_config(server_config: ServerConfig) -> HypercornConfig:
    config = tcp_server.TransportConfig()
    config.bind = [f"{server_config.host}:{server_config.port}"]
    config.accesslog = None
    config.errorlog = logging.getLogger("hypercorn.error")
    config.graceful_timeout = _CLOSE_SECONDS
    config.include_server_header = False
    config.keep_alive_timeout = server_config.keep_alive_timeout
    connection_limits.attach(
        config,
        connection_limits.ConnectionLimits(
            max_body_bytes=server_config.max_body_bytes,
            body_timeout=server_config.body_timeout,
            send_stall_timeout=server_config.send_stall_timeout,
            max_connections=server_config.max_connections
            or connection_limits.default_max_connections(),
        ),
    )
    return config


async def serve_async(
    engine: Engine,
    *,
    server_config: ServerConfig,
    model_name: str,
    model_vocab_size: int | None = None,
    model_type: str | None = None,
    handle_signals: bool = False,
    task_status: trio.TaskStatus[RunningServer] = trio.TASK_STATUS_IGNORED,
) -> None:
    """Serve `engine` over HTTP until drained; reports a `RunningServer` once listening.

    Runs the engine loop itself. Returns after a drain (see module doc); cancelling
    it stops everything at once. `port=0` picks a free port (see `RunningServer.url`).
    """
    app = create_app(
        engine,
        server_config=server_config,
        model_name=model_name,
        model_vocab_size=model_vocab_size,
        model_type=model_type,
    )
    state: ServerState = app.config["SLUICEWAY_STATE"]
    tcp_server.install()  # logs why where hypercorn's own transport must serve
    stop, hypercorn_stop = trio.Event(), trio.Event()
    config = hypercorn_config(server_config)
    async with (
        publishing_kv_events(engine, state, server_config.kv_events),
        trio.open_nursery() as engine_nursery,
    ):
        await engine_nursery.start(engine.run)
        async with trio.open_nursery() as http:
            state.background_nursery = http  # background responses run here
            await http.start(app_batch_runner(app).run)

            async def run_http(task_status: trio.TaskStatus[list[str]]) -> None:
                await hypercorn_serve(
                    app,
                    config,
                    shutdown_trigger=hypercorn_stop.wait,
                    task_status=task_status,
                )
                http.cancel_scope.cancel()  # the drainer and the signal watcher too

            binds = await http.start(run_http)
            running = RunningServer(binds[0], app, state, stop)
            http.start_soon(_drain_when, stop, state, connection_limits.of(config), hypercorn_stop)
            if handle_signals:
                http.start_soon(_watch_signals, running)
            log.info("serving %s at %s", model_name, running.url)
            task_status.started(running)
        engine_nursery.cancel_scope.cancel()
    log.info("stopped serving")


def load_engine(
    model_config: ModelConfig, engine_config: EngineConfig
) -> tuple[Engine, str, int | None, str | None]:
    """Load the model and build its engine: (engine, served model name, vocab size,
    transformers model type). Raises `ModelLoadError` for a missing or unreadable
    model."""
    from sluiceway import model_engine

    bundle = model_engine.load_bundle_on_thread(model_config, engine_config)
    engine = model_engine.build_engine(bundle, engine_config)
    vocab = getattr(bundle.loaded.hf_config, "vocab_size", None)
    model_type = getattr(bundle.loaded.hf_config, "model_type", None)
    return engine, model_config.served_model_name or bundle.name, vocab, model_type


def serve(
    model_config: ModelConfig, engine_config: EngineConfig, server_config: ServerConfig
) -> int:
    """Load the model and serve until SIGTERM/SIGINT and the drain end. Returns an exit code."""
    if not logging.getLogger().handlers:
        logging.basicConfig(
            level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s"
        )
    if server_config.access_log is not None:
        access_log.install_handler()
    from sluiceway.runner.loading import ModelLoadError

    try:
        engine, name, vocab, model_type = load_engine(model_config, engine_config)
    except ModelLoadError as exc:
        print(f"sluiceway: {exc}", file=sys.stderr)
        return 2

    async def main() -> None:
        await serve_async(
            engine,
            server_config=server_config,
            model_name=name,
            model_vocab_size=vocab,
            model_type=model_type,
            handle_signals=True,
        )

    try:
        trio.run(main)
    except OSError as exc:
        print(
            f"sluiceway: cannot listen on {server_config.host}:{server_config.port}: {exc}",
            file=sys.stderr,
        )
        return 1
    return 0

"""The quart-trio app factory: routes, auth, CORS and error objects.

`create_app(engine, ...)` builds an app around an already constructed engine; the
caller runs `engine.run` in a nursery (see `serve.serve_async`).
"""

from __future__ import annotations

import hmac
import logging
import time
from typing import Any

from quart import Response, g, has_request_context, request
from quart_trio import QuartTrio
from werkzeug.exceptions import HTTPException

from sluiceway.api.anthropic.errors import ANTHROPIC_PREFIX, anthropic_error_body
from sluiceway.api.anthropic.routes import blueprint as anthropic_blueprint
from sluiceway.api.batches.routes import blueprint as batches_blueprint
from sluiceway.api.batches.runner import BatchRunner
from sluiceway.api.batches.store import BatchStore
from sluiceway.api.embeddings.routes import blueprint as embeddings_blueprint
from sluiceway.api.embeddings.routes import embed_in_background
from sluiceway.api.fleet.routes import blueprint as fleet_blueprint
from sluiceway.api.http import errors
from sluiceway.api.http.json_body import encode_json, json_response
from sluiceway.api.http.request_body import LimitedRequest
from sluiceway.api.keys.owners import Owner
from sluiceway.api.keys.rate_limits import BUDGETED_PATHS, RateLimits, budgeted_key
from sluiceway.api.lora.routes import blueprint as lora_blueprint
from sluiceway.api.observability.metrics import Metrics
from sluiceway.api.openai_chat.routes import answer_chat_line, answer_completion_line
from sluiceway.api.openai_chat.routes import blueprint as openai_chat_blueprint
from sluiceway.api.pipeline import prompts
from sluiceway.api.pipeline.formatting import TokenText
from sluiceway.api.responses.routes import blueprint as responses_blueprint
from sluiceway.api.responses.store import SqliteResponseStore
from sluiceway.api.service.routes import blueprint as misc_blueprint
from sluiceway.api.state import ServerState
from sluiceway.config import AccessLogStyle, ServerConfig
from sluiceway.engine.engine import Engine
from sluiceway.reasoning import ReasoningFormat, chosen_format
from sluiceway.transport import access_log
from sluiceway.transport.connection import SluicewayHTTPConnection

log = logging.getLogger(__name__)

# Liveness, scraping and the API description stay reachable without a key.
OPEN_PATHS = frozenset({"/health", "/metrics", "/openapi.json"})


class SluicewayApp(QuartTrio):
    asgi_http_class = SluicewayHTTPConnection
    request_class = LimitedRequest
    # The access log's style, or None when it is off (read once per request).
    access_log_style: AccessLogStyle | None = None

    @property
    def state(self) -> ServerState:
        return self.config["SLUICEWAY_STATE"]

    async def __call__(self, scope: Any, receive: Any, send: Any) -> None:
        """Plain `GET /health` is answered here, before quart: quart's request
        machinery costs several times the check itself, CPU taken from the model's
        threads while a load balancer probes under load (`docs/benchmarks.md`,
        "Measurements behind choices in the code"). Browser checks (an Origin
        header) still go through quart, for CORS. Its request id is the client's or
        a counter's, and it is timed only when the access log is on."""
        if _is_plain_health_check(scope):
            style = self.access_log_style
            exchange = access_log.Exchange.of(scope, timed=style is not None)
            status, body = self.state.health()
            data = encode_json(body).encode()
            headers = [
                (b"content-type", b"application/json"),
                (b"content-length", b"%d" % len(data)),
                (access_log.HEADER, exchange.id().encode()),
            ]
            exchange.status = status
            await send({"type": "http.response.start", "status": status, "headers": headers})
            await send({"type": "http.response.body", "body": data, "more_body": False})
            exchange.complete = True
            if style is not None:
                access_log.write(style, exchange)
            return
        if scope["type"] == "http" and scope["method"] == "POST":
            # From here until the route has it ready for the engine (or the
            # request ends), an idle engine holds its first step for it, so that
            # a burst of parallel requests is prefilled together (`Arrivals`).
            with prompts.arriving(self.state.engine.arrivals):
                await super().__call__(scope, receive, send)
            return
        await super().__call__(scope, receive, send)


def _is_plain_health_check(scope: Any) -> bool:
    return (
        scope["type"] == "http"
        and scope["path"] == "/health"
        and scope["method"] == "GET"
        and all(name != b"origin" for name, _ in scope["headers"])
    )


def _error_response(error: errors.APIError) -> Response:
    body = error.body()
    if has_request_context() and request.path.startswith(ANTHROPIC_PREFIX):
        body = anthropic_error_body(error)  # what Anthropic's SDK reads
    response = json_response(body, error.status)
    for name, value in error.headers:
        response.headers[name] = value
    return response


def _http_error(exc: HTTPException) -> Response:
    status = exc.code or 500
    kinds = {404: "not_found", 405: "method_not_allowed", 413: "request_too_large"}
    error = errors.APIError(
        status, exc.description or exc.name, "invalid_request_error", None, kinds.get(status)
    )
    response = _error_response(error)
    if status == 413:
        # The rest of the body may still be on its way; don't read it, just close.
        response.headers["Connection"] = "close"
    return response


def _authorization() -> str | None:
    """The `Authorization` header, or Anthropic's `x-api-key` as a bearer key."""
    header = request.headers.get("Authorization")
    if header is None and (api_key := request.headers.get("x-api-key")) is not None:
        header = f"Bearer {api_key}"
    return header


def _key_ok(header: str | None, keys: tuple[str, ...]) -> bool:
    scheme, _, token = (header or "").partition(" ")
    presented = token.strip().encode()
    ok = False
    for key in keys:  # compare against every key: no early exit to time
        ok |= hmac.compare_digest(presented, key.encode())
    return ok and scheme.lower() == "bearer"


def _install_hooks(app: SluicewayApp, config: ServerConfig, state: ServerState) -> None:
    keys = config.accepted_keys

    @app.before_request
    async def authenticate() -> Response | None:
        if not keys or request.method == "OPTIONS" or request.path in OPEN_PATHS:
            return None
        header = _authorization()
        if not _key_ok(header, keys):
            return _error_response(errors.unauthorized())
        key = (header or "").partition(" ")[2].strip()
        g.owner = Owner.of_key(key, config.api_key_budgets)
        if key in config.api_key_budgets:
            g.budgeted_key = key
            if request.method == "POST" and request.path in BUDGETED_PATHS:
                state.rate_limits.take(key, requests=1)
        return None

    @app.after_request
    async def rate_limit_headers(response: Response) -> Response:
        for name, value in state.rate_limits.headers(budgeted_key()):
            response.headers.setdefault(name, value)
        return response

    @app.after_request
    async def cors(response: Response) -> Response:
        origin = request.headers.get("Origin")
        allowed = config.allowed_origins
        if origin and ("*" in allowed or origin in allowed):
            response.headers["Access-Control-Allow-Origin"] = "*" if "*" in allowed else origin
            response.headers["Access-Control-Allow-Methods"] = "GET, POST, OPTIONS"
            response.headers["Access-Control-Allow-Headers"] = (
                "Authorization, Content-Type, x-api-key, anthropic-version"
            )
            response.headers["Access-Control-Max-Age"] = "600"
            if "*" not in allowed:
                response.headers["Vary"] = "Origin"
        return response

    @app.errorhandler(errors.APIError)
    async def api_error(exc: errors.APIError) -> Response:
        return _error_response(exc)

    @app.errorhandler(HTTPException)
    async def http_error(exc: HTTPException) -> Response:
        return _http_error(exc)

    @app.errorhandler(Exception)
    async def unexpected(exc: Exception) -> Response:
        log.exception(
            "unexpected error handling %s %s request_id=%s",
            request.method,
            request.path,
            access_log.current_request_id(),
        )
        return _error_response(
            errors.APIError(500, "Internal server error.", "internal_server_error", None, None)
        )


def create_app(
    engine: Engine,
    *,
    server_config: ServerConfig,
    model_name: str,
    model_vocab_size: int | None = None,
    model_type: str | None = None,
) -> SluicewayApp:
    """An app serving `engine` under `model_name` (a model of the transformers
    `model_type`, when known). The engine loop is not started here."""
    app = SluicewayApp(__name__)
    app.access_log_style = server_config.access_log
    app.config.update(
        # Streams may run as long as generation does; --request-timeout is the limit.
        RESPONSE_TIMEOUT=None,
        MAX_CONTENT_LENGTH=server_config.max_body_bytes,
        # A form field is bounded by the body it is in: one limit, one flag, and a
        # 413 that can name them (quart's default bounds a field at 500 kB).
        MAX_FORM_MEMORY_SIZE=None,
        BODY_TIMEOUT=server_config.body_timeout,
        JSON_SORT_KEYS=False,
    )
    state = ServerState(
        engine=engine,
        server_config=server_config,
        model_name=model_name,
        metrics=Metrics(engine.stats, model_name),
        token_text=TokenText(engine.tokenizer),
        created=int(time.time()),
        model_vocab_size=model_vocab_size,
    )
    state.rate_limits = RateLimits(server_config.api_key_budgets)
    state.reasoning = _reasoning_format(server_config, engine.tokenizer, model_type)
    if server_config.response_store is not None:
        state.response_store = SqliteResponseStore(server_config.response_store)
    batch_runner = BatchRunner(
        state,
        BatchStore(server_config.batch_store or ":memory:"),
        server_config.batch_concurrency,
        answers={
            "/v1/chat/completions": answer_chat_line,
            "/v1/completions": answer_completion_line,
            "/v1/embeddings": embed_in_background,
        },
    )
    state.drain_hooks.append(batch_runner.pause)
    app.config["SLUICEWAY_STATE"] = state
    app.config["SLUICEWAY_BATCHES"] = batch_runner
    app.register_blueprint(openai_chat_blueprint)
    app.register_blueprint(responses_blueprint)
    app.register_blueprint(embeddings_blueprint)
    app.register_blueprint(batches_blueprint)
    app.register_blueprint(misc_blueprint)
    app.register_blueprint(fleet_blueprint)
    app.register_blueprint(lora_blueprint)
    app.register_blueprint(anthropic_blueprint)
    _install_hooks(app, server_config, state)
    return app


def _reasoning_format(
    config: ServerConfig, tokenizer: Any, model_type: str | None
) -> ReasoningFormat | None:
    """The reasoning parser `config` asks for ("auto": the model family's, else by
    the chat template), said in the log."""
    template = config.chat_template or getattr(tokenizer, "chat_template", None)
    fmt, why = chosen_format(
        config.reasoning_parser, model_type, template if isinstance(template, str) else None
    )
    if fmt is None:
        log.info("reasoning parser: %s", why)
    else:
        log.info("reasoning parser %s (%s)", fmt.name, why)
    return fmt


def app_state(app: Any) -> ServerState:
    return app.config["SLUICEWAY_STATE"]

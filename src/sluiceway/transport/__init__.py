"""HTTP/1.1 transport under the app: the one package that depends on the private
parts of hypercorn, h11 and quart-trio.

`sluiceway.api` holds routes and wire logic and talks to this package through
four names only:

- `tcp_server.TransportConfig` (the hypercorn config of a server of ours) and
  `tcp_server.install()`: servers started with such a config build
  `ImmediateSendTCPServer` and `RecyclingH11Protocol` instead of hypercorn's
  classes; any other hypercorn server in the process keeps hypercorn's. Where
  the internals no longer look as checked, `install()` patches nothing, logs
  what changed and returns False;
- `connection.SluicewayHTTPConnection` is the app's quart-trio connection class;
  `connection_nursery()` / `connection_send()` give a route its request's nursery
  and ASGI send;
- `chunk_socket.ChunkSocket.of(...)` gives a streaming route a direct chunk
  writer, or None when the ASGI path must be used;
- `connection_limits` and `access_log` carry the per-server limits and the access
  line.

What it needs from below, and why:

- hypercorn's trio `TCPServer` (`protocol_send`, `_close`, `_read_data`,
  `_idle_timeout`, its `send_lock`/`stream`/`protocol`/`idle_task` attributes): a send that
  goes out without three scheduler round trips, a bound on sends a client stops
  reading, a half-close after a response that must be the last, and a close as
  soon as the client has gone rather than when the keep-alive timer fires;
- hypercorn's `H11Protocol` (`_handle_events`, `_maybe_recycle`,
  `_close_stream`, `_create_stream`, `_send_h11_event`, `stream_send`) and
  `HTTPStream.app_send`: keep-alive recycling that does not wait on a finished
  stream, connection limits, and the state `ChunkSocket` checks before it
  writes;
- h11's `Connection._writer` (a `ChunkedWriter`) and `os.write` on the plain
  socket: a streamed chunk framed and written by its consumer, byte for byte what
  h11 would have written;
- quart-trio's `TrioASGIHTTPConnection` (`handle_messages`, `handle_request`,
  `_create_request_from_scope`): the request's nursery, request ids and the
  access line.

Each of those private parts is listed once, in `internals.py`, with the versions
it was checked against. pyproject.toml bounds hypercorn, h11 and quart-trio to
those minor versions, and `tests/api/test_server_internals.py` fails with the
name of whatever changed shape or version, so an upgrade is reviewed here and
nowhere else.
"""

# What `sluiceway.api` may import (`tests/test_import_layering.py` holds it to
# this); `h11_protocol` and `internals` are this package's own.
__all__ = ["access_log", "chunk_socket", "connection", "connection_limits", "tcp_server"]

"""HTTP/1.1 transport under the app: the one package that depends on the private
parts of hypercorn, h11 and quart-trio.

`sluiceway.api` holds routes and wire logic and talks to this package through
four names only:

- `tcp_server.install()` puts `ImmediateSendTCPServer` and `RecyclingH11Protocol`
  in place of hypercorn's classes before `hypercorn.trio.serve` starts (it
  returns False, and hypercorn's own classes stay, where the internals no longer
  look as expected);
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

pyproject.toml bounds hypercorn, h11 and quart-trio to the minor versions this
was written against, and `tests/api/test_server_internals.py` fails with the
name of whatever changed shape, so an upgrade is reviewed here and nowhere else.
"""

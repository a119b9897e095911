"""A loopback stand-in for the Hugging Face hub, in the hub's URL layout, for
`huggingface_hub` to fetch from through `HF_ENDPOINT`.

`GET /api/models/{repo}[/revision/{rev}]` answers the repository's metadata
(commit and files with sizes); `HEAD`/`GET /{repo}/resolve/{rev}/{file}` a file
with the headers `hf_hub_download` reads (X-Repo-Commit, ETag, Content-Length)
and byte ranges for resuming. Errors come in the hub's shapes: 401
RepoNotFound, 404 RevisionNotFound / EntryNotFound, 401/403 GatedRepo, and a
plain 401 for a token starting `hf_invalid` (the `X-Error-Code` header is what
huggingface_hub maps to its exceptions).

With `lfs_via_cdn`, a file is answered as the hub answers an LFS file: a 302
to a signed URL on another host (a second server, the CDN, serving blobs by
SHA-256 with byte ranges), with the blob's ETag and size in X-Linked-Etag and
X-Linked-Size; the CDN refuses any request that carries an Authorization
header, as a signed S3 URL does.

Faults for the tests: `drop_once(repo, file, after)` cuts the connection after
that many bytes of the file's first GET; `stall_once(repo, file, after)` sends
that many and then nothing until the event it returns is set; `refuse_resumes` answers 500 to any
ranged GET. Every request is recorded (method, path, headers).
"""

from __future__ import annotations

import hashlib
import json
import socket
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlsplit

import attrs


@attrs.frozen
class Request:
    method: str
    path: str
    headers: dict[str, str]  # names in lower case


@attrs.define
class StandInRepo:
    files: dict[str, bytes]
    commit: str
    # revision name -> commit; "main" always, a commit hash is its own revision
    revisions: dict[str, str]
    # Gated: only this token may fetch files (its metadata is public, as on the hub).
    gated_token: str | None = None


class StandInHub:
    """Start with `start()`, stop with `stop()`; `url` is its endpoint."""

    def __init__(self) -> None:
        self.repos: dict[str, StandInRepo] = {}
        self.requests: list[Request] = []
        self.refuse_resumes = False
        self.lfs_via_cdn = False
        self.cdn_url = ""
        self._cdn: ThreadingHTTPServer | None = None
        self._drops: dict[tuple[str, str], int] = {}
        self._stalls: dict[tuple[str, str], tuple[int, threading.Event]] = {}
        self._released: list[threading.Event] = []
        self._connections: set[socket.socket] = set()
        self._lock = threading.Lock()
        self._server: ThreadingHTTPServer | None = None
        self._thread: threading.Thread | None = None
        self.url = ""

    def add_repo(
        self, repo_id: str, files: dict[str, bytes], *, gated_token: str | None = None
    ) -> StandInRepo:
        digest = hashlib.sha1(repo_id.encode())
        for name in sorted(files):
            digest.update(name.encode() + b"\0" + files[name])
        commit = digest.hexdigest()
        repo = StandInRepo(dict(files), commit, {"main": commit}, gated_token)
        self.repos[repo_id] = repo
        return repo

    def drop_once(self, repo_id: str, name: str, after: int) -> None:
        """The next full GET of `name` sends `after` bytes, then the connection drops."""
        self._drops[(repo_id, name)] = after

    def stall_once(self, repo_id: str, name: str, after: int) -> threading.Event:
        """The next full GET of `name` sends `after` bytes, then waits for the event
        returned (set by `stop` at the latest) before it drops the connection."""
        released = threading.Event()
        self._stalls[(repo_id, name)] = (after, released)
        self._released.append(released)
        return released

    def gets(self, suffix: str = "") -> list[Request]:
        """The GETs of files (not metadata) whose path ends with `suffix`."""
        return [
            r for r in self.requests if r.method == "GET" and "/resolve/" in r.path and r.path.endswith(suffix)
        ]

    def start(self) -> StandInHub:
        hub = self

        class Handler(_Handler):
            stand_in = hub

        class CdnHandler(_CdnHandler):
            stand_in = hub

        self._server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self.url = f"http://127.0.0.1:{self._server.server_address[1]}"
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)
        self._thread.start()
        self._cdn = ThreadingHTTPServer(("127.0.0.1", 0), CdnHandler)
        self._cdn.daemon_threads = True
        self.cdn_url = f"http://127.0.0.1:{self._cdn.server_address[1]}"
        threading.Thread(target=self._cdn.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        """Stop listening and cut the connections a client keeps alive: a stopped
        hub answers nothing."""
        for released in self._released:
            released.set()
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None
        if self._cdn is not None:
            self._cdn.shutdown()
            self._cdn.server_close()
            self._cdn = None
        with self._lock:
            for connection in self._connections:
                try:
                    connection.shutdown(socket.SHUT_RDWR)
                except OSError:
                    pass  # already closed by the client
            self._connections.clear()
        if self._thread is not None:
            self._thread.join()
            self._thread = None

    def _take_drop(self, repo_id: str, name: str) -> tuple[int, threading.Event | None] | None:
        with self._lock:
            if (repo_id, name) in self._stalls:
                return self._stalls.pop((repo_id, name))
            after = self._drops.pop((repo_id, name), None)
            return None if after is None else (after, None)


class _Handler(BaseHTTPRequestHandler):
    stand_in: StandInHub
    protocol_version = "HTTP/1.1"

    def setup(self) -> None:
        super().setup()
        with self.stand_in._lock:
            self.stand_in._connections.add(self.connection)

    def log_message(self, format: str, *args: object) -> None:
        pass  # the tests read `requests`, not stderr

    def do_GET(self) -> None:
        self._answer(body=True)

    def do_HEAD(self) -> None:
        self._answer(body=False)

    def _answer(self, body: bool) -> None:
        hub = self.stand_in
        raw = urlsplit(self.path).path
        hub.requests.append(Request(self.command, unquote(raw), {k.lower(): v for k, v in self.headers.items()}))
        parts = [unquote(p) for p in raw.strip("/").split("/")]
        if self.headers.get("Authorization", "").startswith("Bearer hf_invalid"):
            self._error(401, None, "Invalid credentials in Authorization header")
            return
        if parts[:2] == ["api", "models"] and len(parts) >= 4:
            revision = parts[5] if len(parts) >= 6 and parts[4] == "revision" else "main"
            self._metadata(f"{parts[2]}/{parts[3]}", revision)
        elif len(parts) >= 5 and parts[2] == "resolve":
            self._file(f"{parts[0]}/{parts[1]}", parts[3], "/".join(parts[4:]), body)
        else:
            self._error(404, None, "Not found")

    def _found(self, repo_id: str, revision: str) -> tuple[StandInRepo, str] | None:
        """The repository and the commit `revision` names, or None once the
        error that one of them is missing is sent."""
        repo = self.stand_in.repos.get(repo_id)
        if repo is None:
            self._error(401, "RepoNotFound", "Repository not found")
            return None
        commit = _commit(repo, revision)
        if commit is None:
            self._error(404, "RevisionNotFound", "Invalid rev id: " + revision)
            return None
        return repo, commit

    def _metadata(self, repo_id: str, revision: str) -> None:
        if (found := self._found(repo_id, revision)) is None:
            return
        repo, commit = found
        info = {
            "_id": repo.commit[:24],
            "id": repo_id,
            "modelId": repo_id,
            "sha": commit,
            "private": False,
            "gated": "manual" if repo.gated_token else False,
            "disabled": False,
            "tags": [],
            "siblings": [
                {"rfilename": name, "size": len(data), "blobId": hashlib.sha1(data).hexdigest()}
                for name, data in sorted(repo.files.items())
            ],
        }
        self._send(200, {"Content-Type": "application/json"}, json.dumps(info).encode(), True)

    def _file(self, repo_id: str, revision: str, name: str, body: bool) -> None:
        hub = self.stand_in
        if (found := self._found(repo_id, revision)) is None:
            return
        repo, commit = found
        if repo.gated_token is not None:
            auth = self.headers.get("Authorization")
            if auth != f"Bearer {repo.gated_token}":
                status = 401 if auth is None else 403
                self._error(status, "GatedRepo", f"Access to model {repo_id} is restricted.")
                return
        data = repo.files.get(name)
        if data is None:
            self._error(404, "EntryNotFound", f"{name} does not exist")
            return
        digest = hashlib.sha256(data).hexdigest()
        if hub.lfs_via_cdn:
            redirect = {
                "Location": f"{hub.cdn_url}/blobs/{digest}?signature=stand-in",
                "X-Repo-Commit": commit,
                "X-Linked-Etag": f'"{digest}"',
                "X-Linked-Size": str(len(data)),
                "ETag": '"a-git-pointer"',
            }
            self._send(302, redirect, b"", body)
            return
        headers = {
            "Content-Type": "application/octet-stream",
            "X-Repo-Commit": commit,
            "ETag": f'"{digest}"',
            "Accept-Ranges": "bytes",
        }
        ranged = self.headers.get("Range")
        if ranged is not None and self.command == "GET":
            if hub.refuse_resumes:
                self._error(500, None, "Internal Error")
                return
            start = int(ranged.removeprefix("bytes=").split("-")[0])
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            self._send(206, headers, data[start:], body)
            return
        drop = hub._take_drop(repo_id, name) if self.command == "GET" else None
        if drop is not None:
            after, released = drop
            self.send_response(200)
            for key, value in {**headers, "Content-Length": str(len(data))}.items():
                self.send_header(key, value)
            self.end_headers()
            self.wfile.write(data[:after])
            self.wfile.flush()
            if released is not None:
                released.wait()
            self.connection.shutdown(socket.SHUT_RDWR)
            self.close_connection = True
            return
        self._send(200, headers, data, body)

    def _error(self, status: int, code: str | None, message: str) -> None:
        headers = {"Content-Type": "application/json", "X-Error-Message": message}
        if code is not None:
            headers["X-Error-Code"] = code
        self._send(status, headers, json.dumps({"error": message}).encode(), self.command != "HEAD")

    def _send(self, status: int, headers: dict[str, str], data: bytes, body: bool) -> None:
        self.send_response(status)
        for key, value in headers.items():
            self.send_header(key, value)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        if body:
            self.wfile.write(data)


class _CdnHandler(_Handler):
    """The CDN: `GET /blobs/{sha256}` of any file of any repository, with ranges;
    a request with an Authorization header is a 400."""

    def _answer(self, body: bool) -> None:
        hub = self.stand_in
        path = urlsplit(self.path).path
        hub.requests.append(Request(self.command, "cdn:" + path, {k.lower(): v for k, v in self.headers.items()}))
        if self.headers.get("Authorization") is not None:
            self._error(400, None, "Only one auth mechanism allowed")
            return
        blobs = {
            hashlib.sha256(data).hexdigest(): data
            for repo in hub.repos.values()
            for data in repo.files.values()
        }
        data = blobs.get(path.rpartition("/")[2])
        if data is None:
            self._error(404, None, "NoSuchKey")
            return
        headers = {"Content-Type": "application/octet-stream", "Accept-Ranges": "bytes"}
        ranged = self.headers.get("Range")
        if ranged is not None and self.command == "GET":
            start = int(ranged.removeprefix("bytes=").split("-")[0])
            headers["Content-Range"] = f"bytes {start}-{len(data) - 1}/{len(data)}"
            self._send(206, headers, data[start:], body)
            return
        self._send(200, headers, data, body)


def _commit(repo: StandInRepo, revision: str) -> str | None:
    if revision in repo.revisions:
        return repo.revisions[revision]
    return revision if revision == repo.commit or revision in repo.revisions.values() else None

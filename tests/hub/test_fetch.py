"""Hub ids fetched from a stand-in hub into the Hugging Face cache: only what
serving needs, reused afterwards, from the cache alone offline, resumed after
a dropped connection, continued by the next start after an interrupted one,
with a bar per file on a terminal, and one clear line for each way it can fail."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from hub_stand_in import StandInHub

from polling import eventually_blocking
from sluiceway.hub import HubError, HubOptions, resolve_model
from sluiceway.hub import fetch as fetch_module

SHARD_1 = b"first shard " * 300
SHARD_2 = b"second shard " * 200
# Only these are fetched of `_model_repo`; the rest are other formats.
SERVED = {
    "config.json": json.dumps({"model_type": "llama"}).encode(),
    "generation_config.json": b'{"eos_token_id": 2}',
    "tokenizer.json": b'{"model": {}}',
    "tokenizer_config.json": b'{"chat_template": "{{ messages }}"}',
    "special_tokens_map.json": b"{}",
    "chat_template.jinja": b"{{ messages }}",
    "modules.json": b"[]",
    "1_Pooling/config.json": b'{"pooling_mode_mean_tokens": true}',
    "model.safetensors.index.json": json.dumps(
        {
            "weight_map": {
                "a": "model-00001-of-00002.safetensors",
                "b": "model-00002-of-00002.safetensors",
                "c": "model-00001-of-00002.safetensors",
            }
        }
    ).encode(),
    "model-00001-of-00002.safetensors": SHARD_1,
    "model-00002-of-00002.safetensors": SHARD_2,
}
NOT_SERVED = {
    "pytorch_model.bin": b"pickle",
    "pytorch_model.bin.index.json": b"{}",
    "onnx/model.onnx": b"onnx",
    "original/consolidated.00.pth": b"pickle",
    "consolidated.safetensors": b"mistral",
    "README.md": b"# a model",
}


def _model_repo(hub: StandInHub, repo_id: str = "org/tiny", **kw):
    return hub.add_repo(repo_id, {**SERVED, **NOT_SERVED}, **kw)


def _files(directory: Path) -> dict[str, bytes]:
    return {
        str(p.relative_to(directory)): p.read_bytes() for p in directory.rglob("*") if p.is_file()
    }


def test_a_hub_id_fetches_only_what_serving_needs_into_the_hub_cache(hub, hf_home):
    repo = _model_repo(hub)
    resolved = resolve_model("org/tiny")
    snapshot = hf_home / "hub" / "models--org--tiny" / "snapshots" / repo.commit
    assert resolved.path == str(snapshot)
    assert resolved.served_name == "org/tiny"
    assert _files(snapshot) == SERVED
    assert (hf_home / "hub" / "models--org--tiny" / "refs" / "main").read_text() == repo.commit
    fetched = {r.path.rpartition(f"/resolve/{repo.commit}/")[2] for r in hub.gets()}
    assert fetched == set(SERVED)


def test_a_local_path_wins_and_is_never_looked_up(hub, tmp_path, monkeypatch):
    _model_repo(hub)
    local = tmp_path / "org" / "tiny"
    local.mkdir(parents=True)
    monkeypatch.chdir(tmp_path)
    assert resolve_model("org/tiny").path == "org/tiny"
    assert resolve_model(None).path is None
    assert hub.requests == []


def test_a_second_start_reuses_the_cache_and_needs_no_hub(hub, caplog):
    _model_repo(hub)
    first = resolve_model("org/tiny")
    gets = len(hub.gets())
    again = resolve_model("org/tiny")
    assert again == first
    assert len(hub.gets()) == gets  # asked which commit main is, fetched nothing
    hub.stop()
    with caplog.at_level(logging.WARNING):
        assert resolve_model("org/tiny") == first
    assert "cannot reach" in caplog.text


def test_offline_serves_from_the_cache_and_asks_the_hub_nothing(hub, monkeypatch):
    _model_repo(hub)
    first = resolve_model("org/tiny")
    asked = len(hub.requests)
    assert resolve_model("org/tiny", HubOptions(offline=True)) == first
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    assert resolve_model("org/tiny") == first
    assert len(hub.requests) == asked
    with pytest.raises(HubError, match=r"org/other \(revision 'main'\) is not in the hub cache"):
        resolve_model("org/other")
    # A shard gone from the cache is named.
    (Path(first.path) / "model-00002-of-00002.safetensors").unlink()
    with pytest.raises(HubError, match=r"lacks shards model-00002-of-00002\.safetensors"):
        resolve_model("org/tiny")
    assert len(hub.requests) == asked


def test_a_revision_is_fetched_and_recorded_for_offline_starts(hub, hf_home):
    repo = _model_repo(hub)
    tagged = "ab" * 20  # the tag names another commit (of the same files, here)
    repo.revisions["v2"] = tagged
    resolved = resolve_model("org/tiny", HubOptions(revision="v2"))
    assert Path(resolved.path).name == tagged
    assert (hf_home / "hub" / "models--org--tiny" / "refs" / "v2").read_text() == tagged
    assert resolve_model("org/tiny", HubOptions(revision="v2", offline=True)) == resolved
    assert not (hf_home / "hub" / "models--org--tiny" / "refs" / "main").exists()


def test_errors_are_one_line_each(hub, monkeypatch):
    _model_repo(hub)
    hub.add_repo("org/pickles", {"config.json": b"{}", **NOT_SERVED})
    cases = {
        "nobody/missing": r"model nobody/missing not found on http://127\.0\.0\.1:\d+ and no local "
        r"directory of that name \(check the id; a private one needs --hf-token or HF_TOKEN\)",
        "org/pickles": r"org/pickles has no weights in a format sluiceway serves \(safetensors or "
        r"GGUF\); it holds: Mistral consolidated safetensors, ONNX, PyTorch \.pth/\.pt, PyTorch \.bin",
    }
    for model, message in cases.items():
        with pytest.raises(HubError, match=f"^{message}$") as caught:
            resolve_model(model)
        assert "\n" not in str(caught.value)
    with pytest.raises(HubError, match=r"^revision 'nope' not found in org/tiny$"):
        resolve_model("org/tiny", HubOptions(revision="nope"))
    with pytest.raises(HubError) as caught:
        resolve_model("org/tiny", HubOptions(token="hf_invalid_secret_42"))
    assert str(caught.value) == (
        "the hub refused the token given for org/tiny (HTTP 401): check --hf-token or HF_TOKEN"
    )


SECRET = "hf_not_this_one_0123456789"
GRANTED = "hf_granted_9876543210"


def test_a_gated_repo_says_how_to_get_access_and_never_shows_the_token(
    hub, monkeypatch, caplog, hf_home
):
    caplog.set_level(logging.DEBUG)
    _model_repo(hub, "org/gated", gated_token=GRANTED)
    with pytest.raises(HubError) as caught:
        resolve_model("org/gated")
    assert str(caught.value) == (
        f"org/gated is gated: accept its terms at {hub.url}/org/gated, then pass a token of "
        "that account with --hf-token or HF_TOKEN (https://huggingface.co/settings/tokens)"
    )
    monkeypatch.setenv("HF_TOKEN", SECRET)
    with pytest.raises(HubError) as caught:
        resolve_model("org/gated")
    assert str(caught.value) == (
        f"org/gated is gated and the token given has no access: accept its terms at "
        f"{hub.url}/org/gated with the account the token belongs to"
    )
    asked = [r for r in hub.requests if "/resolve/" in r.path]
    assert asked[-1].headers["authorization"] == f"Bearer {SECRET}"
    monkeypatch.delenv("HF_TOKEN")
    resolved = resolve_model("org/gated", HubOptions(token=GRANTED))
    assert _files(Path(resolved.path)) == SERVED
    assert SECRET not in caplog.text and GRANTED not in caplog.text
    assert GRANTED not in repr(HubOptions(token=GRANTED))


def test_not_enough_disk_space_says_how_much_was_needed(hub, monkeypatch, hf_home):
    _model_repo(hub)
    monkeypatch.setattr(fetch_module, "free_bytes", lambda path: 1000)
    needed = sum(len(v) for v in SERVED.values()) - len(SERVED["model.safetensors.index.json"])
    with pytest.raises(HubError) as caught:
        resolve_model("org/tiny")
    message = str(caught.value)
    assert message.startswith("not enough disk space for org/tiny: ")
    assert f"{needed / 1024:.1f} KiB needed for 10 files, 1000 B free in {hf_home / 'hub'}" in message


def test_a_disk_that_fills_during_the_download_is_named(hub, monkeypatch):
    import errno

    from huggingface_hub import file_download

    _model_repo(hub)
    real = file_download.http_get

    def full(url, temp_file, **kw):
        if url.endswith(".safetensors"):
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(url, temp_file, **kw)

    monkeypatch.setattr(file_download, "http_get", full)
    with pytest.raises(HubError, match=r"^disk full while fetching model-00001-of-00002\.safetensors "
                       r"of org/tiny into .*: [\d.]+ KiB needed for \d+ files, .* free$"):
        resolve_model("org/tiny")


def test_a_dropped_connection_resumes_from_the_byte_it_reached(hub, quick_resume):
    repo = _model_repo(hub)
    hub.drop_once("org/tiny", "model-00001-of-00002.safetensors", after=1000)
    resolved = resolve_model("org/tiny")
    assert (Path(resolved.path) / "model-00001-of-00002.safetensors").read_bytes() == SHARD_1
    gets = hub.gets(f"/resolve/{repo.commit}/model-00001-of-00002.safetensors")
    assert [g.headers.get("range") for g in gets] == [None, "bytes=768-"]  # 3 chunks written


def _partials(storage: Path) -> dict[str, int]:
    """The partial files in a repository's cache folder, with their sizes."""
    return {p.name: p.stat().st_size for p in (storage / "blobs").glob("*.incomplete")}


def test_an_interrupted_download_is_never_served_and_the_next_start_continues_it(
    hub, hf_home, quick_resume
):
    repo = _model_repo(hub)
    hub.drop_once("org/tiny", "model-00002-of-00002.safetensors", after=500)
    hub.refuse_resumes = True
    with pytest.raises(HubError, match=r"^the hub failed while sending model-00002"):
        resolve_model("org/tiny")
    storage = hf_home / "hub" / "models--org--tiny"
    etag = hashlib.sha256(SHARD_2).hexdigest()
    assert _partials(storage) == {f"{etag}.incomplete": 256}  # one whole chunk was written
    assert not (storage / "blobs" / etag).exists()
    snapshot = storage / "snapshots" / repo.commit
    assert not (snapshot / "model-00002-of-00002.safetensors").exists()
    assert (snapshot / "model-00001-of-00002.safetensors").read_bytes() == SHARD_1
    hub.refuse_resumes = False
    resolved = resolve_model("org/tiny")
    assert _files(Path(resolved.path)) == SERVED
    assert _partials(storage) == {}
    interrupted = hub.gets(f"/resolve/{repo.commit}/model-00002-of-00002.safetensors")
    # cut after one whole chunk; its resume refused; the next start goes on from there
    assert [g.headers.get("range") for g in interrupted] == [None, "bytes=256-", "bytes=256-"]
    for name in set(SERVED) - {"model-00002-of-00002.safetensors"}:  # fetched once
        assert len(hub.gets(f"/resolve/{repo.commit}/{name}")) == 1, name


def test_a_partial_file_that_does_not_check_out_is_fetched_whole(hub, hf_home, caplog):
    repo = _model_repo(hub)
    blobs = hf_home / "hub" / "models--org--tiny" / "blobs"
    blobs.mkdir(parents=True)
    etag = hashlib.sha256(SHARD_1).hexdigest()
    (blobs / f"{etag}.incomplete").write_bytes(b"X" * 700)  # not the file's first bytes
    with caplog.at_level(logging.WARNING):
        resolved = resolve_model("org/tiny")
    assert _files(Path(resolved.path)) == SERVED
    assert "model-00001-of-00002.safetensors resumed from an earlier start did not check out " \
        "(its SHA-256 is not the hub's); fetching it again" in caplog.text
    gets = hub.gets(f"/resolve/{repo.commit}/model-00001-of-00002.safetensors")
    assert [g.headers.get("range") for g in gets] == ["bytes=700-", None]


def test_a_process_killed_mid_file_is_continued_by_the_next_start(hub, hf_home):
    """A start killed outright (SIGKILL, no cleanup) leaves the bytes it received;
    the next start asks only for the rest."""
    repo = _model_repo(hub)
    released = hub.stall_once("org/tiny", "model-00001-of-00002.safetensors", after=1024)
    script = (
        "from huggingface_hub import constants; constants.DOWNLOAD_CHUNK_SIZE = 256\n"
        "from sluiceway.hub import resolve_model; resolve_model('org/tiny')\n"
    )
    child = subprocess.Popen([sys.executable, "-c", script], env=os.environ.copy(),
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)  # fmt: skip
    storage = hf_home / "hub" / "models--org--tiny"
    etag = hashlib.sha256(SHARD_1).hexdigest()
    try:
        eventually_blocking(lambda: _partials(storage).get(f"{etag}.incomplete") == 1024, limit_s=60)
    finally:
        child.kill()
        stderr = child.communicate()[1]
    assert child.returncode == -signal.SIGKILL, stderr
    released.set()
    resolved = resolve_model("org/tiny")
    assert _files(Path(resolved.path)) == SERVED
    gets = hub.gets(f"/resolve/{repo.commit}/model-00001-of-00002.safetensors")
    assert [g.headers.get("range") for g in gets] == [None, "bytes=1024-"]


GGUF_REPO = {
    "Tiny-Q4_K_M.gguf": b"GGUF q4_k_m",
    "Tiny-Q8_0.gguf": b"GGUF q8_0",
    "F16/Tiny-F16-00001-of-00002.gguf": b"GGUF f16 part one",
    "F16/Tiny-F16-00002-of-00002.gguf": b"GGUF f16 part two",
    "mmproj-Tiny-F16.gguf": b"GGUF projector",
    "README.md": b"# quants",
}


def test_a_gguf_quant_is_picked_and_only_its_files_are_fetched(hub, hf_home, caplog):
    repo = hub.add_repo("org/Tiny-GGUF", GGUF_REPO)
    snapshot = hf_home / "hub" / "models--org--Tiny-GGUF" / "snapshots" / repo.commit
    resolved = resolve_model("org/Tiny-GGUF:q8_0")
    assert resolved.path == str(snapshot / "Tiny-Q8_0.gguf")
    assert resolved.served_name == "org/Tiny-GGUF:q8_0"
    assert Path(resolved.path).read_bytes() == b"GGUF q8_0"
    with caplog.at_level(logging.INFO):
        assert resolve_model("org/Tiny-GGUF").path == str(snapshot / "Tiny-Q4_K_M.gguf")
    assert "holds 3 quants (F16, Q4_K_M, Q8_0): serving Q4_K_M" in caplog.text
    split = resolve_model("org/Tiny-GGUF:F16")
    assert split.path == str(snapshot / "F16" / "Tiny-F16-00001-of-00002.gguf")
    assert (snapshot / "F16" / "Tiny-F16-00002-of-00002.gguf").read_bytes() == b"GGUF f16 part two"
    fetched = sorted(r.path.rpartition(f"/resolve/{repo.commit}/")[2] for r in hub.gets())
    assert fetched == sorted(set(GGUF_REPO) - {"mmproj-Tiny-F16.gguf", "README.md"})
    with pytest.raises(HubError, match=r"^org/Tiny-GGUF has no Q5_K_M GGUF; quants there: F16, Q4_K_M, Q8_0$"):
        resolve_model("org/Tiny-GGUF:Q5_K_M")
    # Offline, only the quants in the cache count.
    (snapshot / "Tiny-Q8_0.gguf").unlink()
    assert resolve_model("org/Tiny-GGUF:Q4_K_M", HubOptions(offline=True)).path == str(
        snapshot / "Tiny-Q4_K_M.gguf"
    )
    with pytest.raises(HubError, match=r"^org/Tiny-GGUF has no Q8_0 GGUF; quants there: F16, Q4_K_M "
                       r"\(offline: only the hub cache .* was searched\)$"):
        resolve_model("org/Tiny-GGUF:Q8_0", HubOptions(offline=True))


def test_ctrl_c_mid_file_leaves_the_cache_whole_and_the_next_start_finishes(hub, hf_home, monkeypatch):
    from huggingface_hub import file_download

    repo = _model_repo(hub)
    real = file_download.http_get

    def interrupted(url, temp_file, **kw):
        if url.endswith("model-00002-of-00002.safetensors"):
            temp_file.write(SHARD_2[:100])
            raise KeyboardInterrupt
        return real(url, temp_file, **kw)

    monkeypatch.setattr(file_download, "http_get", interrupted)
    with pytest.raises(KeyboardInterrupt):
        resolve_model("org/tiny")
    storage = hf_home / "hub" / "models--org--tiny"
    assert _partials(storage) == {f"{hashlib.sha256(SHARD_2).hexdigest()}.incomplete": 100}
    assert not (storage / "snapshots" / repo.commit / "model-00002-of-00002.safetensors").exists()
    monkeypatch.setattr(file_download, "http_get", real)
    assert _files(Path(resolve_model("org/tiny").path)) == SERVED
    gets = hub.gets(f"/resolve/{repo.commit}/model-00002-of-00002.safetensors")
    assert [g.headers.get("range") for g in gets] == ["bytes=100-"]


def _fetch_in_a_process(hf_home: Path, stderr_on_a_terminal: bool) -> str:
    """What `sluiceway serve org/tiny` writes to stderr while it fetches, run with
    stderr on a pseudo-terminal or on a pipe (the model is only fetched)."""
    import fcntl
    import pty
    import struct
    import termios

    script = (
        "from sluiceway import cli\n"
        "args = cli.build_parser().parse_args(['serve', 'org/tiny'])\n"
        "cli.configure_logging()\n"
        "cli._resolve_model(args)\n"
    )
    env = {**os.environ, "HF_HOME": str(hf_home), "TERM": "xterm"}
    if not stderr_on_a_terminal:
        done = subprocess.run([sys.executable, "-c", script], env=env, capture_output=True, timeout=120)
        assert done.returncode == 0, done.stderr
        return done.stderr.decode()
    parent, child_end = pty.openpty()
    # A new pseudo-terminal is 0 columns wide, where tqdm draws nothing.
    fcntl.ioctl(child_end, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 120, 0, 0))
    child = subprocess.Popen([sys.executable, "-c", script], env=env, stderr=child_end,
                             stdout=subprocess.DEVNULL)  # fmt: skip
    os.close(child_end)
    written = b""
    try:
        while True:
            try:
                chunk = os.read(parent, 65536)
            except OSError:  # EIO: the child closed the terminal
                break
            if not chunk:
                break
            written += chunk
    finally:
        os.close(parent)
        assert child.wait(timeout=120) == 0, written
    return written.decode(errors="replace")


def test_a_terminal_gets_a_progress_bar_per_file_and_a_log_a_line_per_file(hub, tmp_path):
    _model_repo(hub)
    on_terminal = _fetch_in_a_process(tmp_path / "terminal", stderr_on_a_terminal=True)
    in_a_log = _fetch_in_a_process(tmp_path / "log", stderr_on_a_terminal=False)
    for name in ("model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"):
        size = len(SERVED[name])
        # huggingface_hub's own bar, drawn to the end
        assert re.search(rf"{re.escape(name)}: 100%\|[^\r\n]*\| {size / 1000:.2f}k/{size / 1000:.2f}k", on_terminal), on_terminal
        assert f"fetching {name} (" not in on_terminal
        assert f"fetching {name} ({size / 1024:.1f} KiB)" in in_a_log
    assert "%|" not in in_a_log
    assert re.search(r"fetched [\d.]+ KiB of org/tiny in [\d.]+ s", in_a_log)


def test_an_lfs_file_comes_from_the_cdn_without_the_token(hub, hf_home):
    """The hub sends an LFS file's bytes through a signed CDN URL on another host,
    which refuses a token: the token goes to the hub, never to the CDN, also
    when a start continues what an earlier one left."""
    hub.add_repo("org/gated", dict(SERVED), gated_token="hf_cdn_token_0001")
    hub.lfs_via_cdn = True
    blobs = hf_home / "hub" / "models--org--gated" / "blobs"
    blobs.mkdir(parents=True)
    etag = hashlib.sha256(SHARD_1).hexdigest()
    (blobs / f"{etag}.incomplete").write_bytes(SHARD_1[:1000])
    resolved = resolve_model("org/gated", HubOptions(token="hf_cdn_token_0001"))
    assert _files(Path(resolved.path)) == SERVED
    cdn = [r for r in hub.requests if r.path.startswith("cdn:")]
    assert cdn and all("authorization" not in r.headers for r in cdn)
    shard = [r for r in cdn if r.method == "GET" and r.path.endswith(etag)]
    assert [r.headers.get("range") for r in shard] == ["bytes=1000-"]
    hub_side = [r for r in hub.requests if not r.path.startswith("cdn:") and "/resolve/" in r.path]
    assert hub_side and all(
        r.headers.get("authorization") == "Bearer hf_cdn_token_0001" for r in hub_side
    )

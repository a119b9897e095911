"""Fetching a hub model's files into the standard Hugging Face cache.

Files go where `huggingface_hub` puts them (`HF_HUB_CACHE`, else `HF_HOME/hub`,
else `~/.cache/huggingface/hub`), in its layout, so that what transformers,
vLLM or `hf download` fetched before is reused and what is fetched here is
theirs too. Each file is a `hf_hub_download` of the commit the revision
resolved to: one the cache holds is not asked for again; one being fetched is
written beside the blobs and renamed into place when complete, so the cache
never serves a partial file, and a start that is interrupted leaves what it
wrote for the next start to continue from (`partial_file`). A connection
dropped mid-file is resumed by the library from the byte it reached.

Offline (`offline=True`, or `HF_HUB_OFFLINE=1`) nothing is asked of the hub:
the model is served from the cache or the error names what is missing. A hub
that cannot be reached is treated the same way, with a warning.
"""

from __future__ import annotations

import errno
import json
import logging
import os
import re
import shutil
import sys
import time
from collections.abc import Collection
from pathlib import Path
from typing import TYPE_CHECKING

from sluiceway.hub.files import (
    HubError,
    adapter_plan,
    directory_plan,
    gguf_plan,
    is_gguf_repo,
    listed_shards,
    shards_of,
)
from sluiceway.hub.model_id import HubModelId
from sluiceway.hub.partial_file import PartialFileError, fetch_into_cache, repo_folder

if TYPE_CHECKING:
    from huggingface_hub import HfApi

log = logging.getLogger(__name__)

_COMMIT = re.compile(r"^[0-9a-f]{40}$")
_TOKENS_PAGE = "https://huggingface.co/settings/tokens"


def hub_cache_dir() -> Path:
    """The hub cache, read from the environment on every call, as huggingface_hub
    reads it at import: `HF_HUB_CACHE`, else `HF_HOME/hub`, else
    `$XDG_CACHE_HOME/huggingface/hub` (default `~/.cache/huggingface/hub`)."""
    configured = os.environ.get("HF_HUB_CACHE") or os.environ.get("HUGGINGFACE_HUB_CACHE")
    if configured:
        return Path(os.path.expandvars(configured)).expanduser()
    home = os.environ.get("HF_HOME") or os.path.join(
        os.environ.get("XDG_CACHE_HOME") or "~/.cache", "huggingface"
    )
    return Path(os.path.expandvars(home)).expanduser() / "hub"


def hub_endpoint() -> str:
    """`HF_ENDPOINT` (a mirror), else the Hugging Face hub."""
    return (os.environ.get("HF_ENDPOINT") or "https://huggingface.co").rstrip("/")


def offline_from_environment() -> bool:
    """`HF_HUB_OFFLINE` (or transformers' `TRANSFORMERS_OFFLINE`) set to a true value."""
    value = os.environ.get("HF_HUB_OFFLINE") or os.environ.get("TRANSFORMERS_OFFLINE") or ""
    return value.strip().upper() in {"1", "ON", "YES", "TRUE"}


def free_bytes(path: Path) -> int:
    """Free space on the file system that holds `path` (or its nearest existing
    parent)."""
    for candidate in (path, *path.parents):
        if candidate.exists():
            return shutil.disk_usage(candidate).free
    return shutil.disk_usage(".").free


def fetch(
    model: HubModelId, *, revision: str | None, token: str | None, offline: bool, adapter: bool = False
) -> Path:
    """The local path serving `model` needs: the snapshot directory of a Hugging
    Face model (of a PEFT LoRA adapter, with `adapter`), or a GGUF file (a split
    one's first part, its other parts beside it), fetched into the hub cache
    unless there already. `token=None`
    takes `HF_TOKEN` or the saved login, as huggingface_hub does. HubError for
    anything that stops it, in one line without the token. KeyboardInterrupt
    leaves the cache as it was plus the files completed."""
    revision = revision or "main"
    if offline:
        return _from_cache(model, revision, reason="offline", adapter=adapter)
    try:
        commit, sizes = _listing(model, revision, token)
    except _Unreachable as exc:
        log.warning("cannot reach %s (%s); serving %s from the cache", hub_endpoint(), exc, model.repo_id)
        return _from_cache(
            model, revision, reason=f"cannot reach {hub_endpoint()} ({exc})", adapter=adapter
        )
    names = set(sizes)
    if adapter:
        _download(model.repo_id, commit, adapter_plan(model.repo_id, names), sizes, token)
        _remember_revision(model.repo_id, revision, commit)
        return _snapshot(model.repo_id, commit)
    if model.quant is not None or is_gguf_repo(names):
        gguf = gguf_plan(model.repo_id, names, model.quant)
        paths = _download(model.repo_id, commit, gguf.files, sizes, token)
        _remember_revision(model.repo_id, revision, commit)
        log.info("serving %s %s: %s", model.repo_id, gguf.quant, paths[0])
        return paths[0]
    plan = directory_plan(model.repo_id, names)
    files = list(plan.files)
    if plan.index is not None:
        # The index says which shards there are: fetch it first (it is small).
        [index_path] = _download(model.repo_id, commit, (plan.index,), sizes, token)
        shards = shards_of(model.repo_id, plan.index, _weight_map(index_path), names)
        files += shards
    _download(model.repo_id, commit, tuple(files), sizes, token)
    _remember_revision(model.repo_id, revision, commit)
    return _snapshot(model.repo_id, commit)


class _Unreachable(Exception):
    """The hub did not answer (no connection, a timeout, a server error)."""


def _api(token: str | None) -> HfApi:
    from huggingface_hub import HfApi

    return HfApi(endpoint=hub_endpoint(), token=token, library_name="sluiceway")


def _listing(model: HubModelId, revision: str, token: str | None) -> tuple[str, dict[str, int | None]]:
    """(commit, {file: size}) of `model` at `revision`, from the hub."""
    from huggingface_hub.errors import (
        GatedRepoError,
        HfHubHTTPError,
        OfflineModeIsEnabled,
        RepositoryNotFoundError,
        RevisionNotFoundError,
    )

    try:
        info = _api(token).model_info(model.repo_id, revision=revision, files_metadata=True)
    except RevisionNotFoundError:
        raise HubError(f"revision {revision!r} not found in {model.repo_id}") from None
    except GatedRepoError:
        raise HubError(_gated(model.repo_id, token)) from None
    except RepositoryNotFoundError:
        raise HubError(_not_found(model.repo_id, token)) from None
    except _transport_errors(OfflineModeIsEnabled) as exc:
        raise _Unreachable(type(exc).__name__) from None
    except HfHubHTTPError as exc:
        status = exc.response.status_code if exc.response is not None else None
        if status == 401:  # not a missing repository: the token itself
            raise HubError(
                f"the hub refused the token given for {model.repo_id} (HTTP 401): check "
                "--hf-token or HF_TOKEN"
            ) from None
        if status is not None and status < 500 and status not in (408, 429):
            raise HubError(f"the hub refused {model.repo_id}: HTTP {status}") from None
        raise _Unreachable(f"HTTP {status}") from None
    if info.sha is None or not info.siblings:
        raise HubError(f"the hub listed no files for {model.repo_id} at {revision!r}")
    return info.sha, {s.rfilename: s.size for s in info.siblings}


def _transport_errors(*more: type[Exception]) -> tuple[type[Exception], ...]:
    """The HTTP client's errors for a hub that does not answer (httpx2's since
    huggingface_hub 2, httpx's before), and `more`."""
    found: list[type[Exception]] = [ConnectionError, TimeoutError, *more]
    for module in ("httpx2", "httpx"):
        try:
            found.append(__import__(module).TransportError)
        except (ImportError, AttributeError):
            pass
    return tuple(found)


def _download(
    repo_id: str,
    commit: str,
    files: tuple[str, ...],
    sizes: dict[str, int | None],
    token: str | None,
) -> list[Path]:
    """Each of `files` of `repo_id` at `commit`, from the cache or the hub."""
    from huggingface_hub import hf_hub_download, try_to_load_from_cache
    from huggingface_hub.errors import (
        EntryNotFoundError,
        GatedRepoError,
        HfHubHTTPError,
        RepositoryNotFoundError,
    )

    cache = hub_cache_dir()
    missing = [
        f for f in files if not isinstance(try_to_load_from_cache(repo_id, f, cache_dir=cache, revision=commit), str)
    ]
    needed = sum(sizes.get(f) or 0 for f in missing)
    if missing:
        free = free_bytes(cache)
        if needed > free:
            raise HubError(
                f"not enough disk space for {repo_id}: {_size(needed)} needed for "
                f"{len(missing)} files, {_size(free)} free in {cache}"
            )
        log.info(
            "fetching %d files of %s (%s) from %s into %s",
            len(missing),
            repo_id,
            _size(needed),
            hub_endpoint(),
            cache,
        )
    paths: list[Path] = []
    on_terminal = sys.stderr.isatty()
    started = time.monotonic()
    for name in files:
        if name in missing and not on_terminal:
            log.info("fetching %s (%s)", name, _size(sizes.get(name) or 0))
        try:
            if name in missing:
                _fetch_whole(repo_id, name, commit, cache, token)
            # The blob is in the cache now: this links it into the snapshot.
            path = hf_hub_download(
                repo_id, name, revision=commit, cache_dir=cache, endpoint=hub_endpoint(), token=token
            )
        except GatedRepoError:
            raise HubError(_gated(repo_id, token)) from None
        except RepositoryNotFoundError:
            raise HubError(_not_found(repo_id, token)) from None
        except EntryNotFoundError:
            raise HubError(f"{name} is listed in {repo_id} but the hub does not serve it") from None
        except HfHubHTTPError as exc:
            status = exc.response.status_code if exc.response is not None else None
            raise HubError(f"the hub failed while sending {name} of {repo_id}: HTTP {status}") from None
        except OSError as exc:
            if exc.errno in (errno.ENOSPC, errno.EDQUOT):
                raise HubError(
                    f"disk full while fetching {name} of {repo_id} into {cache}: {_size(needed)} "
                    f"needed for {len(missing)} files, {_size(free_bytes(cache))} free"
                ) from None
            raise HubError(f"cannot fetch {name} of {repo_id}: {_scrub(str(exc), token)}") from None
        paths.append(Path(path))
    if missing:
        log.info("fetched %s of %s in %.1f s", _size(needed), repo_id, time.monotonic() - started)
    return paths


def _fetch_whole(repo_id: str, name: str, commit: str, cache: Path, token: str | None) -> None:
    """`name`'s blob in the cache, continuing what an earlier start wrote of it
    (`partial_file`); a continued file that does not check out is fetched again
    whole."""
    for attempt in (1, 2):
        try:
            fetch_into_cache(
                repo_id=repo_id, name=name, commit=commit, cache=cache, endpoint=hub_endpoint(), token=token
            )
            return
        except PartialFileError as exc:
            if attempt == 2:
                raise OSError(str(exc)) from None
            log.warning("%s; fetching it again", exc)


def _from_cache(model: HubModelId, revision: str, *, reason: str, adapter: bool) -> Path:
    """`model` served from the hub cache alone. HubError naming what is missing."""
    cache = hub_cache_dir()
    storage = repo_folder(cache, model.repo_id)
    commit: str | None = revision if _COMMIT.match(revision) else None
    ref = storage / "refs" / revision
    if commit is None and ref.is_file():
        commit = ref.read_text().strip()
    snapshot = storage / "snapshots" / commit if commit else None
    if snapshot is None or not snapshot.is_dir():
        raise HubError(
            f"{model.repo_id} (revision {revision!r}) is not in the hub cache {cache} and the hub "
            f"is not asked ({reason}); fetch it once online first"
        )
    names = {str(p.relative_to(snapshot)) for p in snapshot.rglob("*") if p.is_file()}
    try:
        if adapter:
            adapter_plan(model.repo_id, names)
            log.info("serving the adapter %s from the hub cache (%s): %s", model.repo_id, reason, snapshot)
            return snapshot
        if model.quant is not None or is_gguf_repo(names):
            gguf = gguf_plan(model.repo_id, names, model.quant)
            log.info("serving %s %s from the hub cache (%s)", model.repo_id, gguf.quant, reason)
            return snapshot / gguf.files[0]
        if "config.json" not in names:
            raise HubError(f"config.json of {model.repo_id} is missing")
        plan = directory_plan(model.repo_id, names)
    except HubError as exc:
        raise HubError(f"{exc} ({reason}: only the hub cache {cache} was searched)") from None
    if plan.index is not None:
        listed = listed_shards(plan.index, _weight_map(snapshot / plan.index))
        lacking = [s for s in listed if s not in names]
        if lacking:
            raise HubError(f"{model.repo_id} in the hub cache ({reason}) lacks shards {', '.join(lacking)}")
    log.info("serving %s from the hub cache (%s): %s", model.repo_id, reason, snapshot)
    return snapshot


def _snapshot(repo_id: str, commit: str) -> Path:
    return repo_folder(hub_cache_dir(), repo_id) / "snapshots" / commit


def _remember_revision(repo_id: str, revision: str, commit: str) -> None:
    """Record which commit `revision` (a branch or tag) is, as huggingface_hub's
    cache layout does (`refs/<revision>`), so that offline starts find it."""
    if _COMMIT.match(revision):
        return
    ref = repo_folder(hub_cache_dir(), repo_id) / "refs" / revision
    try:
        if ref.is_file() and ref.read_text() == commit:
            return
        ref.parent.mkdir(parents=True, exist_ok=True)
        tmp = ref.with_name(f"{ref.name}.{os.getpid()}.tmp")
        tmp.write_text(commit)
        os.replace(tmp, ref)
    except OSError as exc:  # a read-only cache still serves; only offline starts need it
        log.warning("cannot record %s of %s in the cache: %s", revision, repo_id, exc)


def _weight_map(index: Path) -> Collection[str]:
    try:
        return set(json.loads(index.read_text())["weight_map"].values())
    except (OSError, ValueError, KeyError, AttributeError) as exc:
        raise HubError(f"cannot read the safetensors index {index.name}: {exc}") from None


def _not_found(repo_id: str, token: str | None) -> str:
    auth = "" if token or os.environ.get("HF_TOKEN") else "; a private one needs --hf-token or HF_TOKEN"
    return (
        f"model {repo_id} not found on {hub_endpoint()} and no local directory of that name "
        f"(check the id{auth})"
    )


def _gated(repo_id: str, token: str | None) -> str:
    if token or os.environ.get("HF_TOKEN"):
        return (
            f"{repo_id} is gated and the token given has no access: accept its terms at "
            f"{hub_endpoint()}/{repo_id} with the account the token belongs to"
        )
    return (
        f"{repo_id} is gated: accept its terms at {hub_endpoint()}/{repo_id}, then pass a "
        f"token of that account with --hf-token or HF_TOKEN ({_TOKENS_PAGE})"
    )


def _scrub(text: str, token: str | None) -> str:
    """`text`'s first line, with no token in it."""
    line = (text.strip().splitlines() or [""])[0]
    for secret in (token, os.environ.get("HF_TOKEN")):
        if secret:
            line = line.replace(secret, "***")
    return line


def _size(n: int) -> str:
    """Bytes for a person: 512 B, 3.4 MiB, 4.1 GiB."""
    if n < 1024:
        return f"{n} B"
    value, unit = n / 1024, "KiB"
    for bigger in ("MiB", "GiB", "TiB"):
        if value < 1024:
            break
        value, unit = value / 1024, bigger
    return f"{value:.1f} {unit}"

"""One hub file brought into the cache, resumed across starts.

huggingface_hub 2 writes each download to a temporary name unique to the
process and deletes it when the download fails, so a start stopped at 90% of a
5 GB GGUF (Ctrl-C, a dropped network past its retries, a killed process)
fetches it again from byte 0. Here the bytes go to `blobs/<etag>.incomplete` in
the repository's cache folder (the name huggingface_hub 0.x and 1.x resumed
from), under the library's own lock for that blob, and the next start
continues from the last byte written, with the library's `http_get` (a `Range`
request, its retries and its progress bar). Only a whole file is renamed to
`blobs/<etag>`; `hf_hub_download` then links it into the snapshot as it links
any blob it finds, so the cache never shows a partial file.

A file continued from an earlier start is checked before it is used: its size,
and where the ETag is a SHA-256 (every LFS file: the weights), its digest. A
partial file that does not check out is deleted and fetched whole.
"""

from __future__ import annotations

import hashlib
import logging
import os
import re
from pathlib import Path
from urllib.parse import urlsplit

log = logging.getLogger("sluiceway.hub.fetch")

_SHA256 = re.compile(r"^[0-9a-f]{64}$")
_READ = 1 << 22


def repo_folder(cache: Path, repo_id: str) -> Path:
    """The folder of model `repo_id` in the hub cache, named as huggingface_hub
    names it (`models--ORG--NAME`)."""
    from huggingface_hub.file_download import repo_folder_name

    return cache / repo_folder_name(repo_id=repo_id, repo_type="model")


class PartialFileError(Exception):
    """The bytes of a continued download are not the file's: the partial file
    is gone, and the next attempt fetches the file whole."""


def fetch_into_cache(
    *, repo_id: str, name: str, commit: str, cache: Path, endpoint: str, token: str | None
) -> None:
    """Make `blobs/<etag>` of `name` (at `commit`) exist in the cache, continuing
    the partial file an earlier start left. Raises what huggingface_hub raises
    (a missing repository or file, HTTP errors, `OSError` for a full disk);
    cancelled (KeyboardInterrupt), it keeps what it wrote for the next start."""
    from huggingface_hub import file_download, get_hf_file_metadata, hf_hub_url
    from huggingface_hub.utils import WeakFileLock, build_hf_headers

    url = hf_hub_url(repo_id, name, revision=commit, endpoint=endpoint)
    metadata = get_hf_file_metadata(url, token=token, endpoint=endpoint, library_name="sluiceway")
    if metadata.etag is None or metadata.location is None:
        raise OSError(f"the hub sent no ETag or location for {name}")
    folder = repo_folder(cache, repo_id)
    blob = folder / "blobs" / metadata.etag
    partial = blob.with_name(blob.name + ".incomplete")
    lock = cache / ".locks" / folder.name / f"{metadata.etag}.lock"
    blob.parent.mkdir(parents=True, exist_ok=True)
    lock.parent.mkdir(parents=True, exist_ok=True)
    with WeakFileLock(str(lock)):  # the lock hf_hub_download takes for this blob
        if blob.exists():
            return
        kept = partial.stat().st_size if partial.exists() else 0
        if metadata.size is not None and kept > metadata.size:
            partial.unlink()
            kept = 0
        if kept:
            log.info("resuming %s of %s at byte %d of %s", name, repo_id, kept, metadata.size)
        headers = build_hf_headers(token=token, library_name="sluiceway")
        # As hf_hub_download: a file in Xet storage is fetched from its hub URL
        # (which redirects), an LFS file from the signed CDN URL the hub sent,
        # without the token, which that URL does not take.
        source = url if metadata.xet_file_data is not None else metadata.location
        if urlsplit(source).netloc != urlsplit(url).netloc:
            headers.pop("authorization", None)
        # Unbuffered: what was received is on disk even if the process is killed.
        with open(partial, "ab", buffering=0) as out:
            file_download.http_get(
                source,
                out,
                resume_size=kept,
                headers=headers,
                expected_size=metadata.size,
                displayed_filename=name,
            )
        if kept:
            _check(partial, name, metadata.etag, metadata.size)
        os.replace(partial, blob)


def _check(partial: Path, name: str, etag: str, size: int | None) -> None:
    """Raise PartialFileError (deleting `partial`) unless it has `size` bytes and,
    for a SHA-256 ETag, that digest."""
    problem = None
    if size is not None and partial.stat().st_size != size:
        problem = f"{partial.stat().st_size} bytes, not {size}"
    elif _SHA256.match(etag):
        digest = hashlib.sha256()
        with open(partial, "rb") as stream:
            while chunk := stream.read(_READ):
                digest.update(chunk)
        if digest.hexdigest() != etag:
            problem = "its SHA-256 is not the hub's"
    if problem is not None:
        partial.unlink(missing_ok=True)
        raise PartialFileError(f"{name} resumed from an earlier start did not check out ({problem})")

"""Download with SHA-256 verification and HTTP range resume.

``fetch`` streams a URL into ``<dest>.part``. If the connection drops, the next attempt (or the
next run) sends ``Range: bytes=N-`` and appends; a server that ignores ranges answers 200 and the
file restarts from zero. The finished file is hashed; a digest that differs from the expected one
is an error, and the bad bytes are removed so a retry starts clean.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import sys
import tarfile
import time
import zipfile
from pathlib import Path
from typing import Callable

import httpx

from turngym.data.registry import COMPLETE_STAMP, cache_root, download_dir, get_dataset

CHUNK = 1 << 20


class ChecksumError(RuntimeError):
    """A downloaded file's SHA-256 differs from the expected (known or pinned) digest."""


class DownloadError(RuntimeError):
    """A download failed after all retries."""


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file, read in chunks."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(CHUNK), b""):
            h.update(block)
    return h.hexdigest()


def fetch(
    url: str,
    dest: Path,
    sha256: str | None = None,
    *,
    retries: int = 3,
    timeout_s: float = 60.0,
    backoff_s: float = 1.0,
    client: httpx.Client | None = None,
) -> str:
    """Download ``url`` to ``dest``, resuming a partial ``dest.part`` and checking the digest.

    Args:
        url: What to fetch (http or https).
        dest: Final path; written only once the digest is right.
        sha256: Expected hex digest, or None to accept any (the caller pins it).
        retries: Extra attempts after a network error or a 5xx answer (each resumes).
        timeout_s: Connect/read timeout per attempt.
        backoff_s: Sleep before retry ``i`` is ``backoff_s * 2**i``.
        client: An httpx client to reuse (tests pass one); a new one is made otherwise.

    Returns:
        The file's hex SHA-256.

    Raises:
        ChecksumError: the finished file does not match ``sha256`` (the partial file is removed).
        DownloadError: the server kept failing, or answered 4xx.
    """
    dest = Path(dest)
    dest.parent.mkdir(parents=True, exist_ok=True)
    part = dest.with_name(dest.name + ".part")
    own = client is None
    client = client or httpx.Client(timeout=timeout_s, follow_redirects=True)
    try:
        last: Exception | None = None
        for attempt in range(retries + 1):
            try:
                _fetch_once(client, url, part)
                last = None
                break
            except (httpx.TransportError, _Retryable) as e:
                last = e
                if attempt < retries:
                    time.sleep(backoff_s * 2**attempt)
        if last is not None:
            raise DownloadError(f"download of {url} failed after {retries + 1} attempts: {last}") from last
    finally:
        if own:
            client.close()
    digest = sha256_file(part)
    if sha256 is not None and digest.lower() != sha256.lower():
        part.unlink()
        raise ChecksumError(
            f"SHA-256 mismatch for {url}: expected {sha256}, got {digest}. The file was removed; "
            "the upstream file changed or the download was corrupted or tampered with."
        )
    part.replace(dest)
    return digest


class _Retryable(Exception):
    pass


def _fetch_once(client: httpx.Client, url: str, part: Path) -> None:
    offset = part.stat().st_size if part.exists() else 0
    headers = {"Range": f"bytes={offset}-"} if offset else {}
    with client.stream("GET", url, headers=headers) as r:
        if r.status_code == 416 and offset:
            return  # nothing left to send: the partial file is already whole
        if r.status_code >= 500 or r.status_code == 429:
            raise _Retryable(f"HTTP {r.status_code}")
        if r.status_code >= 400:
            raise DownloadError(f"HTTP {r.status_code} for {url}")
        if r.headers.get("content-type", "").startswith("text/html") and not url.endswith((".html", ".htm")):
            # file hosts answer quota or login problems with a web page; never save (or pin) that
            raise DownloadError(f"{url} returned a web page instead of the file (a quota, login or moved-file page?)")
        mode = "ab"
        if r.status_code == 206:
            start = _range_start(r.headers.get("content-range", ""))
            if start != offset:
                raise _Retryable(f"server resumed at byte {start}, expected {offset}")
        else:  # 200: the server ignored the range, start over
            mode = "wb"
        with open(part, mode) as f:
            for block in r.iter_bytes():  # unbuffered: bytes reach disk as they arrive, for resume
                f.write(block)


def _range_start(content_range: str) -> int | None:
    # "bytes 100-199/200"
    try:
        return int(content_range.split()[1].split("-")[0])
    except (IndexError, ValueError):
        return None


# ----- pins (trust on first use) ----------------------------------------------------------------
def pins_path() -> Path:
    return cache_root() / "data" / "pins.json"


def load_pins() -> dict[str, str]:
    p = pins_path()
    return json.loads(p.read_text()) if p.exists() else {}


def save_pin(url: str, digest: str) -> None:
    pins = load_pins()
    pins[url] = digest
    p = pins_path()
    p.parent.mkdir(parents=True, exist_ok=True)
    tmp = p.with_suffix(".tmp")
    tmp.write_text(json.dumps(pins, indent=1, sort_keys=True))
    tmp.replace(p)


# ----- archives ---------------------------------------------------------------------------------
def extract(archive: Path, into: Path) -> None:
    """Unpack a zip or tar archive into ``into``, refusing members that would land outside it.

    Raises:
        ValueError: an unsafe member path, or an unknown archive type.
    """
    into = into.resolve()
    if zipfile.is_zipfile(archive):
        with zipfile.ZipFile(archive) as z:
            for m in z.namelist():
                if not (into / m).resolve().is_relative_to(into):
                    raise ValueError(f"unsafe path in archive {archive.name}: {m!r}")
            z.extractall(into)
    elif tarfile.is_tarfile(archive):
        with tarfile.open(archive) as t:
            t.extractall(into, filter="data")  # the "data" filter rejects absolute and ../ paths
    else:
        raise ValueError(f"{archive.name} is neither a zip nor a tar archive")


# ----- whole datasets ---------------------------------------------------------------------------
def download(
    name: str,
    *,
    force: bool = False,
    client: httpx.Client | None = None,
    log: Callable[[str], None] | None = None,
    retries: int = 3,
) -> Path:
    """Download dataset ``name`` into the cache (``download_dir(name)``) and return its folder.

    Known digests are checked; files without one are pinned on first download (the digest is
    printed and stored in ``pins.json``) and checked against the pin afterwards.

    Raises:
        KeyError: unknown dataset.
        ChecksumError / DownloadError: see ``fetch``.
    """
    log = log or (lambda s: print(s, file=sys.stderr))
    ds = get_dataset(name)
    folder = download_dir(name)
    stamp = folder / COMPLETE_STAMP
    if stamp.exists() and not force:
        log(f"{name}: already downloaded in {folder}")
        return folder
    folder.mkdir(parents=True, exist_ok=True)
    stamp.unlink(missing_ok=True)
    pins = load_pins()
    new_pins: dict[str, str] = {}
    for f in ds.files:
        expected = f.sha256 or pins.get(f.url)
        dest = folder / f.filename
        log(f"{name}: fetching {f.url}")
        digest = fetch(f.url, dest, expected, client=client, retries=retries)
        if expected is None:
            new_pins[f.url] = digest
        else:
            log(f"{name}: {f.filename} sha256 ok")
        if f.extract:
            extract(dest, folder)
            dest.unlink()
    if ds.prepare is not None:
        ds.prepare(folder)
    for url, digest in new_pins.items():  # pinned only once the whole dataset unpacked and prepared
        save_pin(url, digest)
        log(f"{name}: no published SHA-256 is recorded in turngym for {url}; pinned sha256={digest} in "
            f"{pins_path()} (later downloads must match it)")
    stamp.write_text("ok\n")
    return folder


def remove(name: str) -> None:
    """Delete a downloaded dataset from the cache (local copies are never touched)."""
    shutil.rmtree(download_dir(name), ignore_errors=True)

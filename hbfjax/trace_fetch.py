"""Download catalogued traces (``hbfjax.trace_catalog``) exactly as published, verified by SHA-256.

Each file is streamed into a temporary file in the destination folder and renamed onto its name only
after its size and checksum match the catalogue, so an interrupted or corrupted download never leaves
a file under a trace's name; a trace published as several files is assembled in a temporary folder
that is renamed into place once every file has verified. Standard library only (``urllib.request``).
The base URL (default raw GitHub) may be overridden with ``$HBFJAX_TRACE_BASE_URL`` or an argument,
e.g. to point at a mirror or a local test server laid out as ``BASE/OWNER/REPO/COMMIT/PATH``.
"""

from __future__ import annotations

import hashlib
import http.client
import os
import shutil
import sys
import tempfile
import urllib.error
import urllib.request
from pathlib import Path
from typing import Callable

from hbfjax.trace_catalog import RAW_GITHUB, TraceSource, UpstreamFile
from hbfjax.traces import TraceError, fetch_dir

BASE_URL_ENV = "HBFJAX_TRACE_BASE_URL"
CHUNK_BYTES = 1 << 16
TIMEOUT_S = 60.0  # per blocking socket operation, not per file


def base_url(override: str | None = None) -> str:
    """``override``, else ``$HBFJAX_TRACE_BASE_URL``, else raw GitHub."""
    return override or os.environ.get(BASE_URL_ENV) or RAW_GITHUB


def sha256_file(path: Path) -> str:
    """Hex SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(CHUNK_BYTES), b""):
            h.update(chunk)
    return h.hexdigest()


def _file_ok(path: Path, expected: UpstreamFile) -> bool:
    return path.is_file() and path.stat().st_size == expected.size_bytes and sha256_file(path) == expected.sha256


def _member(folder: Path, file: UpstreamFile) -> Path:
    """Where a file of a several-file trace lies inside its folder (flat, upstream file name)."""
    return folder / Path(file.path).name


def verified(source: TraceSource, path: Path) -> bool:
    """``path`` holds ``source`` exactly as catalogued (every file's size and SHA-256; extra files ignored)."""
    if source.is_folder:
        return path.is_dir() and all(_file_ok(_member(path, f), f) for f in source.files)
    return _file_ok(path, source.files[0])


class Progress:
    """Bytes received of one trace, on stderr: a rewritten line on a terminal, else one line at the end."""

    def __init__(self, label: str, total_bytes: int, stream=None):
        self.label, self.total, self.done = label, total_bytes, 0
        self.stream = stream if stream is not None else sys.stderr
        self.tty = hasattr(self.stream, "isatty") and self.stream.isatty()

    def _line(self) -> str:
        return f"[traces] {self.label}: {self.done / 1e6:.1f} / {self.total / 1e6:.1f} MB"

    def add(self, n: int) -> None:
        self.done += n
        if self.tty:
            print("\r" + self._line(), end="", file=self.stream, flush=True)

    def finish(self, what: str) -> None:
        print(("\r" if self.tty else "") + self._line() + f" {what}", file=self.stream, flush=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _readable(path: Path, mode: int) -> None:
    """Give a file (0o666) or folder (0o777) made by ``tempfile`` (private: 0o600/0o700) the usual
    permissions under the user's umask."""
    os.chmod(path, mode & ~_umask())


def download(url: str, target: Path, expected: UpstreamFile, progress: Callable[[int], None] = lambda n: None) -> None:
    """Stream ``url`` into a temporary file beside ``target``; rename it onto ``target`` only when the size
    (bytes) and SHA-256 match ``expected``. Any failure raises :class:`TraceError` and leaves nothing."""
    fd, tmp_name = tempfile.mkstemp(dir=target.parent, prefix=f".{target.name}.", suffix=".part")
    tmp = Path(tmp_name)
    try:
        h, got = hashlib.sha256(), 0
        with os.fdopen(fd, "wb") as out, urllib.request.urlopen(url, timeout=TIMEOUT_S) as resp:
            while chunk := resp.read(CHUNK_BYTES):
                out.write(chunk)
                h.update(chunk)
                got += len(chunk)
                progress(len(chunk))
        if got != expected.size_bytes:
            raise TraceError(f"{url}: received {got} of {expected.size_bytes} bytes (connection closed early or "
                             "the file changed upstream); nothing kept, run the fetch again")
        if h.hexdigest() != expected.sha256:
            raise TraceError(f"{url}: sha256 {h.hexdigest()} does not match the catalogue's {expected.sha256}; "
                             "refused, nothing kept")
        _readable(tmp, 0o666)
        os.replace(tmp, target)
    except (urllib.error.URLError, http.client.HTTPException, OSError) as err:
        reason = getattr(err, "reason", None) or err
        raise TraceError(f"could not download {url}: {reason}") from None
    finally:
        tmp.unlink(missing_ok=True)


def _replace_folder(staging: Path, dest: Path) -> None:
    """Move the complete folder ``staging`` onto ``dest`` (an older ``dest`` is set aside, then removed)."""
    aside = None
    if dest.exists():
        aside = Path(tempfile.mkdtemp(dir=dest.parent, prefix=f".{dest.name}.", suffix=".old"))
        os.replace(dest, aside / dest.name)
    os.replace(staging, dest)
    if aside is not None:
        shutil.rmtree(aside, ignore_errors=True)


def fetch(source: TraceSource, folder: Path | None = None, base: str | None = None, stream=None) -> tuple[Path, bool]:
    """Put ``source`` into ``folder`` (default :func:`hbfjax.traces.fetch_dir`) as ``folder / source.local``.

    Returns ``(path, downloaded)``; ``downloaded`` is False when a verified copy was already there.
    Raises :class:`TraceError` on a network error, a short download or a checksum mismatch (nothing kept).
    """
    folder = Path(folder) if folder is not None else fetch_dir()
    dest = folder / source.local
    if verified(source, dest):
        return dest, False
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as err:
        raise TraceError(f"cannot create the trace folder {folder}: {err.strerror}") from None
    progress = Progress(source.name, source.size_bytes, stream)
    url = base_url(base)
    if not source.is_folder:
        download(source.url(source.files[0], url), dest, source.files[0], progress.add)
    else:
        staging = Path(tempfile.mkdtemp(dir=folder, prefix=f".{source.local}.", suffix=".part"))
        try:
            for file in source.files:
                download(source.url(file, url), _member(staging, file), file, progress.add)
            _readable(staging, 0o777)
            _replace_folder(staging, dest)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
    progress.finish(f"verified (sha256), saved as {dest}")
    return dest, True

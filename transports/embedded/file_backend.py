"""A durable backend for the embedded nsqd: one append-only file and a read position per queue.

Implements :class:`nsq_sansio.server.backend.Backend` with real file IO (so it lives here, not
in the pure core). Each queue ``name`` (a topic, or ``topic:channel``) owns
``<data_path>/<name>.diskqueue.dat`` (records as ``[4-byte length][record]``) and
``<name>.diskqueue.meta.json`` (the read position). The position is saved every ``sync_every``
reads and on :meth:`FileBackend.close`, so after a crash a few records may come again (NSQ is
at-least-once), but none is lost. A record torn by a crash mid-append is cut off on reopen.
The file is truncated whenever it has been read to the end, and rewritten once the part already
read grows past ``compact_bytes`` and half the file.

Files are created ``0600`` (as nsqd's diskqueue does; existing ones are narrowed to it when
opened), the data folder ``0700`` when it is created here, and every file is opened with
``O_NOFOLLOW``: a symbolic link planted where a queue's file goes is refused, not followed.

Use it through :class:`FileBackendFactory` as ``NSQD(..., backend_factory=...)``, and keep the
topic/channel list with :func:`save_metadata` / :func:`load_metadata` (nsqd's ``nsqd.dat``).
"""

from __future__ import annotations

import json
import os
import struct
from pathlib import Path
from typing import Any, BinaryIO

from nsq_sansio.server.backend import BackendError

__all__ = ["FileBackend", "FileBackendFactory", "load_metadata", "save_metadata"]

_LENGTH = struct.Struct(">I")
#: Largest record accepted when reading back: anything larger is taken as corruption.
DEFAULT_MAX_RECORD_SIZE = 64 * 1024 * 1024
_METADATA_FILE = "nsqd.dat"


def _safe_name(name: str) -> str:
    # Topic/channel names are [.a-zA-Z0-9_-] (and '#'); ':' separates topic and channel and
    # is not allowed in file names everywhere: '~' cannot occur in a name, so no collisions.
    return name.replace(":", "~").replace("/", "_")


#: Files hold messages: readable by nsqd's user only, as nsqd writes them.
FILE_MODE = 0o600
DIRECTORY_MODE = 0o700
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def _open_private(path: Path, mode: str) -> BinaryIO:
    """Open ``path`` ("rb", "ab", "wb" or "r+b") without following a symbolic link, creating
    it ``0600`` for writing modes and narrowing an existing file to ``0600``."""
    flags = {
        "rb": os.O_RDONLY,
        "ab": os.O_WRONLY | os.O_CREAT | os.O_APPEND,
        "wb": os.O_WRONLY | os.O_CREAT | os.O_TRUNC,
        "r+b": os.O_RDWR,
    }[mode]
    fd = os.open(path, flags | _NOFOLLOW, FILE_MODE)
    try:
        if mode != "rb" and hasattr(os, "fchmod"):
            os.fchmod(fd, FILE_MODE)
        handle: BinaryIO = os.fdopen(fd, mode)  # type: ignore[assignment]
        return handle
    except BaseException:
        os.close(fd)
        raise


def _make_directory(path: Path) -> None:
    """Create the data folder (and parents) ``0700``; an existing one is left as it is."""
    path.mkdir(mode=DIRECTORY_MODE, parents=True, exist_ok=True)


def _atomic_write(path: Path, data: bytes, fsync: bool) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with _open_private(tmp, "wb") as handle:
        handle.write(data)
        if fsync:
            handle.flush()
            os.fsync(handle.fileno())
    os.replace(tmp, path)


class FileBackend:
    """One queue's records in a file; see the module docstring for the layout and guarantees."""

    def __init__(
        self,
        data_path: str | os.PathLike[str],
        name: str,
        *,
        sync_every: int = 2500,
        compact_bytes: int = 64 * 1024 * 1024,
        max_record_size: int = DEFAULT_MAX_RECORD_SIZE,
        fsync: bool = False,
    ) -> None:
        if sync_every < 1:
            raise ValueError(f"sync_every must be >= 1, got {sync_every}")
        self.name = name
        self.directory = Path(data_path)
        _make_directory(self.directory)
        base = _safe_name(name)
        self.data_file = self.directory / f"{base}.diskqueue.dat"
        self.meta_file = self.directory / f"{base}.diskqueue.meta.json"
        self._sync_every = sync_every
        self._compact_bytes = compact_bytes
        self._max_record_size = max_record_size
        self._fsync = fsync
        self._closed = False
        self._unsaved_reads = 0
        self._dirty_writes = False
        #: Bytes cut off on open because they were torn or corrupt.
        self.discarded_bytes = 0
        self._read_pos, saved_depth, saved_end = self._load_position()
        self._depth, self._end = self._scan(saved_depth, saved_end)
        self._writer: BinaryIO = _open_private(self.data_file, "ab")
        self._reader: BinaryIO = _open_private(self.data_file, "rb")
        self._reader.seek(self._read_pos)

    # -- opening ------------------------------------------------------------------------------

    def _load_position(self) -> tuple[int, int, int]:
        """The read position, and the depth and write position saved with it (-1 when the
        meta file does not have them: a file from an older version, or none at all)."""
        try:
            with _open_private(self.meta_file, "rb") as handle:
                meta = json.loads(handle.read())
            position = max(int(meta["read_pos"]), 0)
        except (OSError, ValueError, KeyError, TypeError):
            return 0, -1, -1
        try:
            depth, end = int(meta["depth"]), int(meta["end"])
        except (ValueError, KeyError, TypeError):
            return position, -1, -1
        return position, depth, end

    def _scan(self, saved_depth: int, saved_end: int) -> tuple[int, int]:
        """Count the records after the read position; cut a torn or corrupt tail off.

        Records up to the write position saved in the meta file are counted already (its
        depth): only what was appended since is read, so reopening a large queue that was
        closed cleanly costs nothing, as nsqd's diskqueue metadata does."""
        _open_private(self.data_file, "ab").close()  # created 0600, never through a link
        size = self.data_file.stat().st_size
        if self._read_pos > size:
            self._read_pos = 0
            saved_end = -1
        depth = 0
        pos = self._read_pos
        if saved_depth >= 0 and self._read_pos <= saved_end <= size:
            depth, pos = saved_depth, saved_end
        with _open_private(self.data_file, "rb") as handle:
            handle.seek(pos)
            while True:
                header = handle.read(4)
                if len(header) < 4:
                    break
                (length,) = _LENGTH.unpack(header)
                if length > self._max_record_size or pos + 4 + length > size:
                    break
                handle.seek(length, os.SEEK_CUR)
                pos += 4 + length
                depth += 1
        if pos < size:
            self.discarded_bytes = size - pos
            with _open_private(self.data_file, "r+b") as handle:
                handle.truncate(pos)
        return depth, pos

    # -- Backend protocol -----------------------------------------------------------------------

    @property
    def depth(self) -> int:
        return self._depth

    def put(self, data: bytes) -> None:
        if self._closed:
            raise BackendError(f"file backend {self.name!r} is closed")
        if len(data) > self._max_record_size:
            raise BackendError(
                f"record of {len(data)} bytes is above the file backend's {self._max_record_size}"
            )
        try:
            self._writer.write(_LENGTH.pack(len(data)))
            self._writer.write(data)
        except OSError as exc:
            raise BackendError(f"file backend {self.name!r} failed to write: {exc}") from exc
        self._end += 4 + len(data)
        self._depth += 1
        self._dirty_writes = True

    def get(self) -> bytes | None:
        if self._closed or self._depth == 0:
            return None
        if self._dirty_writes:
            self._writer.flush()
            self._dirty_writes = False
        header = self._reader.read(4)
        if len(header) < 4:
            self._depth = 0
            return None
        (length,) = _LENGTH.unpack(header)
        data = self._reader.read(length)
        if len(data) < length:
            self._depth = 0
            return None
        self._read_pos += 4 + length
        self._depth -= 1
        if self._depth == 0:
            self._reset()
        else:
            self._unsaved_reads += 1
            if self._unsaved_reads >= self._sync_every:
                self._maybe_compact()
                self._save_position()
        return data

    def empty(self) -> None:
        if self._closed:
            return
        self._reset()

    def close(self) -> None:
        if self._closed:
            return
        self._writer.flush()
        if self._fsync:
            os.fsync(self._writer.fileno())
        self._save_position()
        self._writer.close()
        self._reader.close()
        self._closed = True

    def delete(self) -> None:
        if not self._closed:
            self._writer.close()
            self._reader.close()
            self._closed = True
        self._depth = 0
        for path in (self.data_file, self.meta_file):
            path.unlink(missing_ok=True)

    # -- housekeeping ---------------------------------------------------------------------------

    def _save_position(self) -> None:
        self._unsaved_reads = 0
        state = {"read_pos": self._read_pos, "depth": self._depth, "end": self._end}
        payload = json.dumps(state).encode()
        _atomic_write(self.meta_file, payload, self._fsync)

    def _reset(self) -> None:
        """Everything was read: start the file over."""
        self._writer.flush()
        self._writer.truncate(0)
        # A buffered reader may serve a seek from its buffer: reopen it over the new file.
        self._reader.close()
        self._reader = _open_private(self.data_file, "rb")
        self._read_pos = 0
        self._end = 0
        self._depth = 0
        self._dirty_writes = False
        self._save_position()

    def _maybe_compact(self) -> None:
        if self._read_pos < self._compact_bytes or self._read_pos * 2 < self._end:
            return
        self._writer.flush()
        tmp = self.data_file.with_name(self.data_file.name + ".compact")
        with _open_private(tmp, "wb") as out:
            self._reader.seek(self._read_pos)
            while chunk := self._reader.read(1 << 20):
                out.write(chunk)
        self._writer.close()
        self._reader.close()
        os.replace(tmp, self.data_file)
        self._end -= self._read_pos
        self._read_pos = 0
        self._writer = _open_private(self.data_file, "ab")
        self._reader = _open_private(self.data_file, "rb")


class FileBackendFactory:
    """``backend_factory`` for :class:`~nsq_sansio.server.nsqd.NSQD`: a :class:`FileBackend`
    per queue under ``data_path`` (nsqd's ``--data-path``)."""

    def __init__(self, data_path: str | os.PathLike[str], **options: Any) -> None:
        self.data_path = Path(data_path)
        self.options = options

    def __call__(self, name: str) -> FileBackend:
        return FileBackend(self.data_path, name, **self.options)


def save_metadata(data_path: str | os.PathLike[str], metadata: dict[str, Any]) -> None:
    """Write ``NSQD.metadata()`` to ``<data_path>/nsqd.dat`` atomically."""
    directory = Path(data_path)
    _make_directory(directory)
    _atomic_write(directory / _METADATA_FILE, json.dumps(metadata).encode(), fsync=False)


def load_metadata(data_path: str | os.PathLike[str]) -> dict[str, Any] | None:
    """Read what :func:`save_metadata` wrote, or ``None`` when there is none (or it is bad)."""
    try:
        with _open_private(Path(data_path) / _METADATA_FILE, "rb") as handle:
            data = json.loads(handle.read())
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None

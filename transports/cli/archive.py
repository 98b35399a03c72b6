"""The files ``nsq-sansio to-file`` writes: :class:`FileArchive` names them from a format
(``<TOPIC>.<HOST><REV>.<DATETIME>.log``), rolls them by size or time, gzips them (one member per
sync, so a crash leaves only whole members: :func:`whole_gzip_members`) and fsyncs before the
messages are FIN'd.

File names are predictable, so every file is opened as nsqd opens its own: never through a
symbolic link (``O_NOFOLLOW``), only a regular file this user owns, created ``FILE_MODE``
(0640, narrower with the umask).
"""

from __future__ import annotations

import errno
import os
import re
import socket
import stat
import time
import zlib
from collections.abc import Callable, Sequence
from datetime import datetime
from typing import IO

from .common import CLIError, UsageError

__all__ = [
    "DEFAULT_FILENAME_FORMAT",
    "FILE_MODE",
    "FileArchive",
    "open_private",
    "whole_gzip_members",
]


DEFAULT_FILENAME_FORMAT = "<TOPIC>.<HOST><REV>.<DATETIME>.log"
#: Archive files: owner read-write, group read, others nothing (the umask can narrow it).
FILE_MODE = 0o640
#: Directories the file name format creates (``<TOPIC>/...``).
DIRECTORY_MODE = 0o750
_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0) | getattr(os, "O_CLOEXEC", 0)


def open_private(path: str, flags: int) -> int:
    """``os.open`` of an archive file: not through a symbolic link, a regular file owned by
    this user, its mode narrowed to :data:`FILE_MODE`; anything else is a :class:`CLIError`
    (a planted link or file in a shared directory is refused, never followed or appended to)."""
    try:
        fd = os.open(path, flags | _NOFOLLOW, FILE_MODE)
    except OSError as err:
        if err.errno in (errno.ELOOP, errno.EMLINK) or os.path.islink(path):
            raise CLIError(f"refusing to open {path}: it is a symbolic link") from None
        raise
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise CLIError(f"refusing to open {path}: not a regular file")
        if hasattr(os, "geteuid") and info.st_uid != os.geteuid():
            raise CLIError(f"refusing to open {path}: owned by another user (uid {info.st_uid})")
        mode = stat.S_IMODE(info.st_mode)
        if mode & ~FILE_MODE and hasattr(os, "fchmod"):
            os.fchmod(fd, mode & FILE_MODE)
    except BaseException:
        os.close(fd)
        raise
    return fd


class FileArchive:
    """nsq_to_file's files: named by ``--filename-format``, rotated when ``<DATETIME>``
    changes, after ``rotate_size`` bytes or ``rotate_interval`` seconds; written in
    ``work_dir`` and moved to ``output_dir`` when closed, never over an existing file.

    Each :meth:`write_synced` is one ``write()`` then ``fsync``; with gzip it is one whole
    gzip member (compressed in memory first), so a crash between two batches leaves a file
    ``gzip -d`` reads entirely (gzip reads concatenated members). A crash during the write
    itself can leave a partial member at the end of a file in the work directory; when the
    work directory is not the output directory, :meth:`recover` (run at start) cuts it off
    and moves such files to the output directory.
    """

    def __init__(
        self,
        *,
        output_dir: str,
        work_dir: str | None = None,
        filename_format: str = DEFAULT_FILENAME_FORMAT,
        datetime_format: str = "%Y-%m-%d_%H",
        topic: str,
        host: str | None = None,
        gzip_level: int | None = None,
        rotate_size: int = 0,
        rotate_interval: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        now: Callable[[], datetime] = datetime.now,
    ) -> None:
        self.output_dir = output_dir
        self.work_dir = work_dir or output_dir
        self.gzip_level = gzip_level
        self.rotate_size = rotate_size
        self.rotate_interval = rotate_interval
        self.datetime_format = datetime_format
        self.clock = clock
        self.now = now
        needs_rev = (
            gzip_level is not None
            or rotate_size > 0
            or rotate_interval > 0
            or os.path.abspath(self.work_dir) != os.path.abspath(output_dir)
        )
        if needs_rev and "<REV>" not in filename_format:
            raise UsageError(
                "--filename-format needs <REV> with --gzip, rotation or a separate --work-dir"
            )
        if not needs_rev:
            filename_format = filename_format.replace("<REV>", "")
        hostname = socket.gethostname()
        short = hostname.split(".")[0]
        identifier = host or short
        identifier = identifier.replace("<SHORT_HOST>", short).replace("<HOSTNAME>", hostname)
        fmt = (
            filename_format.replace("<TOPIC>", topic)
            .replace("<HOST>", identifier)
            .replace("<PID>", str(os.getpid()))
        )
        if gzip_level is not None and not fmt.endswith(".gz"):
            fmt += ".gz"
        self.format = fmt
        self.file: IO[bytes] | None = None
        self.name = ""  # the current file name with <REV> unresolved
        self.rev = 0
        self.path = ""  # the current file in the work directory
        self.opened_at = 0.0
        self.size = 0  # bytes written to the current file, before compression
        self.bytes_written = 0  # bytes written to disk, all files
        self.paths: list[str] = []  # every file finished in the output directory, in order

    # --- names ----------------------------------------------------------------------------------

    def _current_name(self) -> str:
        return self.format.replace("<DATETIME>", self.now().strftime(self.datetime_format))

    @staticmethod
    def _with_rev(name: str, rev: int) -> str:
        return name.replace("<REV>", f"-{rev:06d}")

    def _pattern(self) -> re.Pattern[str]:
        parts = re.split(r"(<REV>|<DATETIME>)", self.format)
        regex = "".join(
            r"-\d{6}" if p == "<REV>" else ".+?" if p == "<DATETIME>" else re.escape(p)
            for p in parts
        )
        return re.compile(regex + "$")

    # --- rotation -------------------------------------------------------------------------------

    def needs_rotation(self) -> bool:
        if self.file is None:
            return True
        if self._current_name() != self.name:
            return True
        if self.rotate_interval > 0 and self.clock() - self.opened_at > self.rotate_interval:
            return True
        return self.rotate_size > 0 and self.size > self.rotate_size

    def _open(self) -> None:
        self.close()
        name = self._current_name()
        self.rev = 0 if name != self.name else self.rev + 1
        self.name = name
        exclusive = self.gzip_level is not None or self.rotate_interval > 0
        separate = os.path.abspath(self.work_dir) != os.path.abspath(self.output_dir)
        while True:
            filename = self._with_rev(name, self.rev)
            path = os.path.join(self.work_dir, filename)
            os.makedirs(os.path.dirname(path) or ".", DIRECTORY_MODE, exist_ok=True)
            if separate:
                final = os.path.join(self.output_dir, filename)
                os.makedirs(os.path.dirname(final) or ".", DIRECTORY_MODE, exist_ok=True)
                if os.path.lexists(final):
                    self.rev += 1
                    continue
            flags = os.O_WRONLY | os.O_CREAT | (os.O_EXCL if exclusive else os.O_APPEND)
            try:
                fd = open_private(path, flags)
            except FileExistsError:
                self.rev += 1
                continue
            size = os.fstat(fd).st_size
            if self.rotate_size > 0 and size > self.rotate_size:
                os.close(fd)
                self.rev += 1
                continue
            break
        self.file = os.fdopen(fd, "ab")
        self.path = path
        self.size = size
        self.opened_at = self.clock()

    # --- writing --------------------------------------------------------------------------------

    def write_synced(self, bodies: Sequence[bytes]) -> None:
        """Append ``bodies`` (one per line) and fsync before returning."""
        if self.needs_rotation():
            self._open()
        f = self.file
        assert f is not None
        data = b"".join(body + b"\n" for body in bodies)
        out = data
        if self.gzip_level is not None:
            member = zlib.compressobj(self.gzip_level, zlib.DEFLATED, 31)  # 31: gzip wrapper
            out = member.compress(data) + member.flush()
        f.write(out)
        f.flush()
        os.fsync(f.fileno())
        self.size += len(data)
        self.bytes_written += len(out)

    def close(self) -> None:
        """fsync and close the current file, then move it to the output directory."""
        if self.file is None:
            return
        f, self.file = self.file, None
        f.flush()
        os.fsync(f.fileno())
        f.close()
        self.paths.append(self._finish(self.path, self.name, self.rev))

    def _finish(self, path: str, name: str, rev: int) -> str:
        """Move ``path`` from the work directory to the output directory without ever
        replacing a file there (link, then unlink; the revision goes up on a clash)."""
        if os.path.abspath(self.work_dir) == os.path.abspath(self.output_dir):
            return path
        relative = os.path.relpath(path, self.work_dir)
        target = os.path.join(self.output_dir, relative)
        while True:
            try:
                os.link(path, target, follow_symlinks=False)
            except FileExistsError:
                rev += 1
                target = os.path.join(
                    self.output_dir, os.path.dirname(relative), self._with_rev(name, rev)
                )
                if "<REV>" not in name:
                    raise
                continue
            os.unlink(path)
            return target

    def recover(self) -> list[str]:
        """Files a killed run left in a separate work directory: a partial gzip member at
        the end is cut off (the whole members before it are kept), then the file is moved
        to the output directory. Returns the moved files."""
        if os.path.abspath(self.work_dir) == os.path.abspath(self.output_dir):
            return []
        pattern = self._pattern()
        moved = []
        for entry in sorted(os.listdir(self.work_dir)):
            path = os.path.join(self.work_dir, entry)
            if not pattern.match(entry) or not _own_regular_file(path):
                continue  # not left by this archiver: a link, a directory, another user's
            if self.gzip_level is not None:
                fd = open_private(path, os.O_RDWR)
                try:
                    with os.fdopen(os.dup(fd), "rb") as f:
                        data = f.read()
                    good = _whole_gzip_prefix(data)
                    if good < len(data):
                        os.ftruncate(fd, good)
                finally:
                    os.close(fd)
            rev_name = re.sub(r"-\d{6}(?=[^/]*$)", "<REV>", entry, count=1)
            moved.append(self._finish(path, rev_name, 0))
        return moved


def _own_regular_file(path: str) -> bool:
    info = os.lstat(path)
    owned = not hasattr(os, "geteuid") or info.st_uid == os.geteuid()
    return stat.S_ISREG(info.st_mode) and owned


def whole_gzip_members(path: str) -> int:
    """The length of the longest prefix of ``path`` made of complete gzip members."""
    with os.fdopen(os.open(path, os.O_RDONLY | _NOFOLLOW), "rb") as f:
        return _whole_gzip_prefix(f.read())


def _whole_gzip_prefix(data: bytes) -> int:
    end = 0
    while end < len(data):
        member = zlib.decompressobj(31)
        try:
            member.decompress(data[end:])
        except zlib.error:
            break
        if not member.eof:
            break
        end = len(data) - len(member.unused_data)
    return end

"""Find and run the real NSQ binaries (nsqd, nsqlookupd and the Go tools) beside the project.

The real nsqd is the referee of this project: conformance tests run against it as well as
against the embedded broker, benchmarks measure against it, and real Go clients drive the
embedded broker. None of that may fail on a machine without the binaries, so everything here
answers "not found" (:func:`find_binaries` returns ``None``) rather than raising; tests skip
and benchmarks say so and exit.

Where the binaries are looked for: the ``bin_dir`` argument (a benchmark's ``--nsqd-bin``)
when one is given, and nowhere else; otherwise, first match wins:

1. ``$NSQ_BIN_DIR``, a folder holding ``nsqd``: the ``bin/`` folder of an NSQ release
   (https://nsq.io/deployment/installing.html);
2. the copy of the v1.3.0 release that this project's development setup keeps beside the
   checkout, when there is one.

:class:`RealNSQD` and :class:`RealLookupd` start one process each on free loopback ports with a
private data directory, wait until ``/ping`` answers, and stop it (SIGTERM, then SIGKILL) on
exit; both are context managers.
"""

from __future__ import annotations

import atexit
import contextlib
import json
import os
import signal
import socket
import subprocess
import tempfile
import time
import urllib.error
import urllib.request
import weakref
from collections.abc import Sequence
from pathlib import Path
from types import TracebackType
from typing import Any

__all__ = [
    "MISSING_BINARIES",
    "REFERENCE_VERSION",
    "RealLookupd",
    "RealNSQD",
    "find_binaries",
    "free_port",
    "go_duration",
    "nsqd_flags",
    "tool",
]

#: The release the workplace's reference copy was built from.
REFERENCE_VERSION = "1.3.0"

#: Why a test that needs the real binaries is skipped, and how to get them (the pytest plugin
#: counts these skips and says so once at the end of the run).
MISSING_BINARIES = (
    "real NSQ binaries not found: set NSQ_BIN_DIR to the bin/ folder of an NSQ release "
    "(https://nsq.io/deployment/installing.html)"
)

_REPO_ROOT = Path(__file__).resolve().parents[2]  # transports/testing/real_nsq.py
_REFERENCE_SCRIPT = _REPO_ROOT.parent / "shared" / "reference" / f"nsq-{REFERENCE_VERSION}" / "bin"
_found: dict[str | None, Path | None] = {}
# Every process started and not stopped yet: killed when the interpreter exits, so a test run
# that is interrupted leaves no nsqd behind.
_live: weakref.WeakSet[_Process] = weakref.WeakSet()


def find_binaries(bin_dir: str | os.PathLike[str] | None = None) -> Path | None:
    """The folder holding ``nsqd`` (and the other tools), or ``None`` when there is none."""
    key = None if bin_dir is None else os.fspath(bin_dir)
    if key in _found:
        return _found[key]
    found: Path | None = None
    # an explicit folder is the only place looked at; otherwise $NSQ_BIN_DIR, then ../shared
    for candidate in (key,) if key is not None else (os.environ.get("NSQ_BIN_DIR"),):
        if candidate:
            folder = Path(candidate)
            if folder.is_file():  # the nsqd binary itself was given
                folder = folder.parent
            if (folder / "nsqd").is_file():
                found = folder
                break
    if found is None and key is None and _REFERENCE_SCRIPT.is_file():
        try:
            printed = subprocess.run(
                ["bash", str(_REFERENCE_SCRIPT)],
                capture_output=True,
                text=True,
                timeout=120,
                check=True,
            ).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            printed = ""
        if printed and (Path(printed) / "nsqd").is_file():
            found = Path(printed)
    _found[key] = found
    return found


def tool(name: str, bin_dir: str | os.PathLike[str] | None = None) -> Path | None:
    """Path of one binary (``nsqd``, ``to_nsq``, ``bench_reader``...), or ``None``."""
    folder = find_binaries(bin_dir)
    if folder is None:
        return None
    path = folder / name
    return path if path.is_file() else None


def free_port() -> int:
    """A TCP port on 127.0.0.1 that was free a moment ago (the OS picks it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def go_duration(seconds: float) -> str:
    """A duration flag value Go parses (``1500ms``), from seconds."""
    return f"{round(seconds * 1000)}ms"


# EmbeddedNSQD keyword arguments that are plain nsqd flags (durations in seconds).
_DURATION_FLAGS = {
    "msg_timeout",
    "max_msg_timeout",
    "max_req_timeout",
    "client_timeout",
    "max_heartbeat_interval",
    "max_output_buffer_timeout",
    "min_output_buffer_timeout",
    "output_buffer_timeout",
}
_VALUE_FLAGS = {
    "mem_queue_size",
    "max_msg_size",
    "max_body_size",
    "max_rdy_count",
    "max_channel_consumers",
    "max_output_buffer_size",
    "max_deflate_level",
    "node_id",
    "tls_cert",
    "tls_key",
    "tls_root_ca_file",
    "tls_client_auth_policy",
    "snappy",
    "deflate",
    "tls_required",
}


def nsqd_flags(**options: Any) -> tuple[list[str], list[str]]:
    """Real nsqd flags for :class:`~transports.embedded.EmbeddedNSQD` keyword arguments, so
    one test can start either broker: returns ``(flags, lookupd_tcp_addresses)``. Raises
    ``TypeError`` for an argument the real nsqd has no flag for (``auth_check``...)."""
    flags: list[str] = []
    lookupd: list[str] = []
    for name, value in options.items():
        flag = "--" + name.replace("_", "-")
        if name == "lookupd_tcp_addresses":
            lookupd.extend(value)
        elif name in _DURATION_FLAGS:
            flags.append(f"{flag}={go_duration(float(value))}")
        elif name in _VALUE_FLAGS:
            if isinstance(value, bool):
                value = "true" if value else "false"
            flags.append(f"{flag}={value}")
        elif name == "auth_http_addresses":
            flags.extend(f"--auth-http-address={address}" for address in value)
        else:
            raise TypeError(f"the real nsqd has no flag for {name}={value!r}")
    return flags, lookupd


# Starts tried when the picked ports turned out to be taken (see _Process.start).
_START_ATTEMPTS = 5


class _PortTaken(RuntimeError):
    """The process exited at start because one of its ports was taken meanwhile."""


@atexit.register
def _kill_leftovers() -> None:
    for process in list(_live):
        process.kill()


class _Process:
    """One real NSQ server process on loopback: start, wait for /ping, stop."""

    binary = ""

    def __init__(
        self,
        args: Sequence[str] = (),
        *,
        bin_dir: str | os.PathLike[str] | None = None,
        startup_timeout: float = 10.0,
    ) -> None:
        path = tool(self.binary, bin_dir)
        if path is None:
            raise FileNotFoundError(
                f"no {self.binary} binary found: pass bin_dir, or set NSQ_BIN_DIR to the bin/ "
                "folder of an NSQ release (https://nsq.io/deployment/installing.html)"
            )
        self.path = path
        self.extra_args = list(args)
        self.startup_timeout = startup_timeout
        self._pick_ports()
        self._data_dir: tempfile.TemporaryDirectory[str] | None = None
        self._process: subprocess.Popen[bytes] | None = None
        self._log: Any = None
        # a restart keeps its ports: clients and data refer to them
        self._started_once = False

    # --- addresses -------------------------------------------------------------------------

    def _pick_ports(self) -> None:
        self.tcp_port, self.http_port = free_port(), free_port()

    @property
    def tcp_address(self) -> str:
        return f"127.0.0.1:{self.tcp_port}"

    @property
    def http_address(self) -> str:
        return f"127.0.0.1:{self.http_port}"

    @property
    def http_url(self) -> str:
        return f"http://127.0.0.1:{self.http_port}"

    @property
    def data_path(self) -> str:
        assert self._data_dir is not None, "start() first"
        return self._data_dir.name

    # --- lifecycle -------------------------------------------------------------------------

    def command(self) -> list[str]:  # pragma: no cover - overridden
        raise NotImplementedError

    def start(self) -> _Process:
        """Start the process (a fresh data directory on first start) and wait for /ping.

        The ports were free when they were picked, not necessarily now (another test process's
        connection or server may have taken one since): on a first start that fails with
        "address already in use", fresh ports are picked and the start tried again."""
        if self._process is not None and self._process.poll() is None:
            return self
        for attempt in range(_START_ATTEMPTS):
            try:
                return self._start_once()
            except _PortTaken:
                if self._started_once or attempt == _START_ATTEMPTS - 1:
                    raise
                self._pick_ports()
        raise AssertionError("unreachable")  # pragma: no cover

    def _start_once(self) -> _Process:
        if self._data_dir is None:
            self._data_dir = tempfile.TemporaryDirectory(prefix=f"real-{self.binary}-")
        self._log = open(os.path.join(self._data_dir.name, f"{self.binary}.log"), "ab")  # noqa: SIM115
        logged_before = self._log.tell()
        self._process = subprocess.Popen(
            [str(self.path), *self.command(), *self.extra_args],
            stdout=self._log,
            stderr=subprocess.STDOUT,
            stdin=subprocess.DEVNULL,
        )
        _live.add(self)
        deadline = time.monotonic() + self.startup_timeout
        while True:
            if self._process.poll() is not None:
                returncode, self._process = self._process.returncode, None
                _live.discard(self)
                self._log.close()
                self._log = None
                log = self.log_text()[logged_before:]
                error = _PortTaken if "address already in use" in log else RuntimeError
                raise error(f"{self.binary} exited with {returncode} at start: {log[-2000:]}")
            with contextlib.suppress(OSError):
                if self.get("/ping", timeout=0.5) == b"OK":
                    self._started_once = True
                    return self
            if time.monotonic() > deadline:
                self.stop()
                raise TimeoutError(
                    f"{self.binary} did not answer /ping in {self.startup_timeout} s"
                )
            time.sleep(0.02)

    def stop(self, timeout: float = 10.0) -> None:
        """SIGTERM (nsqd flushes its queues to disk), SIGKILL after ``timeout``; keeps the data."""
        process, self._process = self._process, None
        _live.discard(self)
        if process is not None and process.poll() is None:
            process.send_signal(signal.SIGTERM)
            try:
                process.wait(timeout)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()
        if self._log is not None:
            self._log.close()
            self._log = None

    def kill(self) -> None:
        """SIGKILL: what a crash looks like (nothing is flushed)."""
        process, self._process = self._process, None
        _live.discard(self)
        if process is not None and process.poll() is None:
            process.kill()
            process.wait()

    def close(self) -> None:
        """Stop and delete the data directory."""
        self.stop()
        if self._data_dir is not None:
            self._data_dir.cleanup()
            self._data_dir = None

    @property
    def running(self) -> bool:
        return self._process is not None and self._process.poll() is None

    @property
    def pid(self) -> int | None:
        return None if self._process is None else self._process.pid

    def log_text(self) -> str:
        if self._data_dir is None:
            return ""
        try:
            return Path(self._data_dir.name, f"{self.binary}.log").read_text(errors="replace")
        except OSError:
            return ""

    def __enter__(self) -> _Process:
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()

    # --- HTTP --------------------------------------------------------------------------------

    def get(self, path: str, *, timeout: float = 5.0) -> bytes:
        """GET ``path`` on the HTTP port; raises ``urllib.error.HTTPError`` on an error status."""
        with urllib.request.urlopen(self.http_url + path, timeout=timeout) as answer:
            body: bytes = answer.read()
            return body

    def post(self, path: str, body: bytes = b"", *, timeout: float = 5.0) -> bytes:
        request = urllib.request.Request(self.http_url + path, data=body, method="POST")
        with urllib.request.urlopen(request, timeout=timeout) as answer:
            result: bytes = answer.read()
            return result

    def get_json(self, path: str, *, timeout: float = 5.0) -> Any:
        return json.loads(self.get(path, timeout=timeout))


class RealNSQD(_Process):
    """A real nsqd on loopback. ``args`` are extra flags (``--max-msg-size=1024``...);
    ``lookupd`` are nsqlookupd TCP addresses it registers with."""

    binary = "nsqd"

    def __init__(
        self,
        args: Sequence[str] = (),
        *,
        lookupd: Sequence[str] = (),
        bin_dir: str | os.PathLike[str] | None = None,
        startup_timeout: float = 10.0,
    ) -> None:
        super().__init__(args, bin_dir=bin_dir, startup_timeout=startup_timeout)
        self.lookupd = list(lookupd)

    def _pick_ports(self) -> None:
        # nsqd's HTTPS listener (opened when it has a TLS certificate) defaults to the fixed
        # 0.0.0.0:4152, which two TLS-enabled nsqd processes cannot share: give it a port too
        super()._pick_ports()
        self.https_port = free_port()

    @property
    def https_address(self) -> str:
        """Where nsqd serves HTTPS once it has a TLS certificate (``host:port``)."""
        return f"127.0.0.1:{self.https_port}"

    def command(self) -> list[str]:
        """The flags the binary is started with (addresses, data path, extra flags)."""
        return [
            f"--tcp-address={self.tcp_address}",
            f"--http-address={self.http_address}",
            f"--https-address={self.https_address}",
            "--broadcast-address=127.0.0.1",
            f"--data-path={self.data_path}",
            *(f"--lookupd-tcp-address={address}" for address in self.lookupd),
        ]

    def __enter__(self) -> RealNSQD:
        self.start()
        return self

    def stats(self, topic: str | None = None, channel: str | None = None) -> dict[str, Any]:
        """``/stats?format=json`` (optionally filtered), as a dict."""
        query = "/stats?format=json"
        if topic is not None:
            query += f"&topic={topic}"
        if channel is not None:
            query += f"&channel={channel}"
        data: dict[str, Any] = self.get_json(query)
        return data

    def topic_stats(self, topic: str) -> dict[str, Any] | None:
        """One topic's entry of /stats, or ``None`` when nsqd does not know it."""
        for entry in self.stats(topic).get("topics") or ():
            if entry.get("topic_name") == topic:
                found: dict[str, Any] = entry
                return found
        return None

    def channel_stats(self, topic: str, channel: str) -> dict[str, Any] | None:
        """One channel's entry of /stats, or ``None``."""
        entry = self.topic_stats(topic)
        for chan in (entry or {}).get("channels") or ():
            if chan.get("channel_name") == channel:
                found: dict[str, Any] = chan
                return found
        return None


class RealLookupd(_Process):
    """A real nsqlookupd on loopback (``args`` are extra flags)."""

    binary = "nsqlookupd"

    def command(self) -> list[str]:
        """The flags the binary is started with (addresses, data path, extra flags)."""
        return [
            f"--tcp-address={self.tcp_address}",
            f"--http-address={self.http_address}",
            "--broadcast-address=127.0.0.1",
        ]

    def __enter__(self) -> RealLookupd:
        self.start()
        return self

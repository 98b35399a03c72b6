"""The command line against hostile or careless surroundings: ``--tls-*`` flags never leave a
connection in plaintext, ``to-file`` never writes through a planted link or into a world-readable
file, and an HTTP server cannot take the process's memory or time with an endless answer."""

from __future__ import annotations

import contextlib
import json
import os
import socket
import stat
import subprocess
import sys
import threading
import time
import urllib.request
from collections.abc import Iterator
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsq_sansio.admin import NSQDAPI, AdminResponseError, NSQDStats
from nsq_sansio.http_client import HTTPAnswer
from transports.cli.archive import FileArchive, open_private
from transports.cli.common import CLIError
from transports.cli.stat import add_stats, format_stats
from transports.embedded import EmbeddedNSQD, ServerThread
from transports.sync import Producer

from .conftest import _env, channel_stats, cli, http_post, one_line_error

pytestmark = pytest.mark.timeout(90)


@pytest.fixture(scope="module")
def certificate() -> Iterator[tuple[str, str]]:
    from transports.testing.tls import self_signed_certificate

    try:
        with self_signed_certificate() as files:
            yield files
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("neither the cryptography package nor an openssl binary is available")


# --- TLS: every --tls-* flag turns it on, or is refused -------------------------------------


@pytest.mark.parametrize("command", ["tail", "pub"])
def test_tls_insecure_skip_verify_alone_turns_tls_on(
    command: str, certificate: tuple[str, str]
) -> None:
    """Against an nsqd that requires TLS of TCP clients, ``--tls-insecure-skip-verify`` alone
    must connect with TLS (in plaintext nsqd refuses the client)."""
    cert, key = certificate
    with ServerThread(EmbeddedNSQD(tls_cert=cert, tls_key=key, tls_required="tcp-https")) as nsqd:
        http_post(nsqd.http_address, "/topic/create?topic=secure")
        http_post(nsqd.http_address, "/channel/create?topic=secure&channel=c")
        common = ("--topic", "secure", "--nsqd-tcp-address", nsqd.tcp_address)
        if command == "pub":
            result = cli("pub", *common, "--tls-insecure-skip-verify", input=b"hello\n")
            assert result.returncode == 0, result.stderr
            assert channel_stats(nsqd.http_address, "secure", "c")["depth"] == 1
        else:
            publish = urllib.request.Request(  # plain HTTP is allowed by tcp-https
                f"http://{nsqd.http_address}/pub?topic=secure", data=b"hello", method="POST"
            )
            urllib.request.urlopen(publish, timeout=5).close()
            result = cli("tail", *common, "--channel", "c", "-n", "1", "--tls-insecure-skip-verify")
            assert result.returncode == 0, result.stderr
            assert result.stdout == b"hello\n"


@pytest.mark.parametrize("command", ["tail", "pub", "to-file"])
def test_tls_key_without_its_certificate_is_a_usage_error(command: str, tmp_path: Path) -> None:
    key = tmp_path / "client.key"
    key.write_text("not used")
    result = cli(
        command, "--topic", "t", "--nsqd-tcp-address", "127.0.0.1:1", "--tls-key", str(key)
    )
    line = one_line_error(result)
    assert result.returncode == 2
    assert (
        line
        == f"nsq-sansio {command}: --tls-key needs --tls-cert (the certificate the key belongs to)"
    )


@pytest.mark.parametrize(
    "flags",
    [
        ("--tls-root-ca-file", "ca.pem"),
        ("--tls-client-auth-policy", "require-verify"),
        ("--tls-required", "true"),
        ("--tls-key", "key.pem"),
    ],
    ids=lambda flags: flags[0],
)
def test_nsqd_tls_flag_without_a_certificate_is_refused_not_served_in_plaintext(
    flags: tuple[str, str],
) -> None:
    result = cli(
        "nsqd", "--tcp-address", "127.0.0.1:0", "--http-address", "127.0.0.1:0", *flags, timeout=20
    )
    line = one_line_error(result)
    assert result.returncode == 2
    assert flags[0] in line and "--tls-cert" in line


# --- to-file: private files, no planted links, a safe default folder ------------------------


def _publish(nsqd: EmbeddedNSQD, topic: str, bodies: list[bytes]) -> None:
    http_post(nsqd.http_address, f"/topic/create?topic={topic}")
    http_post(nsqd.http_address, f"/channel/create?topic={topic}&channel=arch")
    with Producer(nsqd.tcp_address) as producer:
        producer.multi_publish(topic, bodies)


@contextlib.contextmanager
def _umask(mask: int) -> Iterator[None]:
    """The children started inside get this umask (the test does not depend on the caller's)."""
    previous = os.umask(mask)
    try:
        yield
    finally:
        os.umask(previous)


@pytest.mark.parametrize("gzip", [False, True], ids=["plain", "gzip+work-dir"])
def test_to_file_files_are_0640_or_narrower(gzip: bool, nsqd: EmbeddedNSQD, tmp_path: Path) -> None:
    _publish(nsqd, "private", [b"a", b"b", b"c"])
    out = tmp_path / "out"
    out.mkdir()
    extra = ["--gzip", "--work-dir", str(tmp_path)] if gzip else []
    with _umask(0o022):
        result = cli(
            "to-file",
            "--topic",
            "private",
            "--channel",
            "arch",
            "--nsqd-tcp-address",
            nsqd.tcp_address,
            "--output-dir",
            str(out),
            "-n",
            "3",
            *extra,
        )
    assert result.returncode == 0, result.stderr
    files = list(out.iterdir())
    assert files
    for path in files:
        mode = stat.S_IMODE(path.stat().st_mode)
        assert mode & ~0o640 == 0, f"{path.name}: {oct(mode)}"


def test_an_existing_archive_file_opened_again_is_narrowed_to_0640(tmp_path: Path) -> None:
    """Appending within the hour reopens the hour's file: one left wider (by an older
    version, or a chmod) is narrowed, not kept readable by everyone."""
    path = tmp_path / "events.log"
    path.write_bytes(b"earlier\n")
    path.chmod(0o666)
    os.close(open_private(str(path), os.O_WRONLY | os.O_APPEND))
    assert stat.S_IMODE(path.stat().st_mode) == 0o640
    assert path.read_bytes() == b"earlier\n"


@pytest.mark.parametrize("target_exists", [True, False], ids=["to-a-file", "dangling"])
def test_to_file_refuses_a_planted_symbolic_link(
    target_exists: bool, nsqd: EmbeddedNSQD, tmp_path: Path
) -> None:
    """The archive's name is predictable: a link planted under it must not be followed
    (neither appended to nor created through); the message stays in nsqd."""
    _publish(nsqd, "planted", [b"payload"])
    out = tmp_path / "out"
    out.mkdir()
    victim = tmp_path / "victim"
    if target_exists:
        victim.write_bytes(b"precious\n")
    (out / "planted.log").symlink_to(victim)
    result = cli(
        "to-file",
        "--topic",
        "planted",
        "--channel",
        "arch",
        "--nsqd-tcp-address",
        nsqd.tcp_address,
        "--output-dir",
        str(out),
        "--filename-format",
        "<TOPIC>.log",
        "-n",
        "1",
    )
    line = one_line_error(result)
    assert result.returncode == 1
    assert (
        line == f"nsq-sansio to-file: refusing to open {out / 'planted.log'}: it is a symbolic link"
    )
    if target_exists:
        assert victim.read_bytes() == b"precious\n"
    else:
        assert not victim.exists()
    deadline = time.monotonic() + 10  # back in the queue once nsqd saw the connection close
    while channel_stats(nsqd.http_address, "planted", "arch")["depth"] != 1:
        assert time.monotonic() < deadline, "the message was not given back"
        time.sleep(0.05)


@pytest.mark.skipif(not hasattr(os, "geteuid") or os.geteuid() != 0, reason="needs chown")
def test_to_file_refuses_a_planted_file_of_another_user(nsqd: EmbeddedNSQD, tmp_path: Path) -> None:
    _publish(nsqd, "foreign", [b"payload"])
    planted = tmp_path / "foreign.log"
    planted.write_bytes(b"")
    os.chown(planted, 65534, 65534)
    result = cli(
        "to-file",
        "--topic",
        "foreign",
        "--channel",
        "arch",
        "--nsqd-tcp-address",
        nsqd.tcp_address,
        "--output-dir",
        str(tmp_path),
        "--filename-format",
        "<TOPIC>.log",
        "-n",
        "1",
    )
    assert "owned by another user" in one_line_error(result)
    assert planted.read_bytes() == b""


def test_to_file_writes_to_the_current_directory_by_default(
    nsqd: EmbeddedNSQD, tmp_path: Path
) -> None:
    _publish(nsqd, "here", [b"x"])
    result = cli(
        "to-file",
        "--topic",
        "here",
        "--channel",
        "arch",
        "--nsqd-tcp-address",
        nsqd.tcp_address,
        "--filename-format",
        "<TOPIC>.log",
        "-n",
        "1",
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert (tmp_path / "here.log").read_bytes() == b"x\n"
    assert f"in {tmp_path}" in result.stderr.decode()


def test_recover_leaves_a_planted_link_in_the_work_directory_alone(tmp_path: Path) -> None:
    """At start, files left in the work directory are cut to whole gzip members and moved:
    a link planted there under an archive's name must not truncate what it points to."""
    work, out = tmp_path / "work", tmp_path / "out"
    work.mkdir()
    out.mkdir()
    victim = tmp_path / "victim"
    victim.write_bytes(b"not gzip, and not ours to cut")
    (work / "events-000000.log.gz").symlink_to(victim)
    files = FileArchive(
        output_dir=str(out),
        work_dir=str(work),
        filename_format="<TOPIC><REV>.log",
        topic="events",
        gzip_level=6,
    )
    assert files.recover() == []
    assert victim.read_bytes() == b"not gzip, and not ours to cut"
    assert list(out.iterdir()) == []


# --- HTTP answers: capped in size and time ---------------------------------------------------


class HostileHTTPServer:
    """Answers every request with 200 and an endless chunked body: ``chunk`` bytes per chunk,
    every ``pause`` seconds, until the client goes away."""

    def __init__(self, chunk: int, pause: float = 0.0) -> None:
        self.chunk = chunk
        self.pause = pause
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.sent = 0
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> HostileHTTPServer:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stopping.set()
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)  # wakes the accept() (close alone does not)
        self.listener.close()
        self.thread.join(timeout=10)

    def _serve(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self.listener.accept()
            except OSError:
                return
            threading.Thread(target=self._answer, args=(conn,), daemon=True).start()

    def _answer(self, conn: socket.socket) -> None:
        with conn, contextlib.suppress(OSError):
            request = b""
            while b"\r\n\r\n" not in request:
                data = conn.recv(4096)
                if not data:
                    return
                request += data
            conn.sendall(
                b"HTTP/1.1 200 OK\r\nContent-Type: application/json\r\n"
                b"Transfer-Encoding: chunked\r\n\r\n"
            )
            piece = b"%x\r\n" % self.chunk + b" " * self.chunk + b"\r\n"
            while not self.stopping.is_set():
                conn.sendall(piece)
                self.sent += self.chunk
                if self.pause:
                    time.sleep(self.pause)


# Runs the command, then writes the process's peak resident memory (VmHWM: this image's own,
# where wait4's ru_maxrss may include the forking test process's) to the file in argv[1].
_MEASURED = """
import sys
from transports.cli.main import main
report, sys.argv[1:] = sys.argv[1], sys.argv[2:]
try:
    code = main()
finally:
    with open("/proc/self/status") as status, open(report, "w") as out:
        out.write(next(line for line in status if line.startswith("VmHWM:")).split()[1])
sys.exit(code)
"""


def _run_measured(report: Path, *args: str) -> tuple[subprocess.CompletedProcess[bytes], int]:
    """Run ``nsq-sansio *args``; what it did and its peak resident memory in bytes."""
    result = subprocess.run(
        [sys.executable, "-c", _MEASURED, str(report), *args],
        capture_output=True,
        timeout=60,
        env=_env(),
    )
    return result, int(report.read_text()) * 1024  # kB


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux's VmHWM")
@pytest.mark.parametrize(
    ("args", "limit"),
    [
        (("stat", "--count", "1", "--nsqd-http-address"), 16 * 1024 * 1024),
        (("tail", "--topic", "t", "--lookupd-http-address"), 4 * 1024 * 1024),
    ],
    ids=["stat-nsqd", "tail-lookupd"],
)
def test_an_endless_http_answer_is_refused_at_a_bound(
    args: tuple[str, ...], limit: int, tmp_path: Path
) -> None:
    with HostileHTTPServer(chunk=1024 * 1024) as hostile:
        result, peak = _run_measured(tmp_path / "peak", *args, hostile.address)
        sent = hostile.sent
    line = one_line_error(result)
    assert result.returncode == 1
    assert f"http://{hostile.address}/" in line  # names where it was reading
    assert f"HTTP answer body over {limit} bytes" in line
    assert sent < 200 * 1024 * 1024  # it stopped reading (the server has no end)
    assert peak < 100 * 1024 * 1024, f"peak memory {peak / 2**20:.0f} MiB"


def test_a_trickling_http_answer_is_refused_at_the_timeout() -> None:
    """A byte every 50 ms keeps each read within a socket timeout: the whole answer has one."""
    with HostileHTTPServer(chunk=1, pause=0.05) as hostile:
        started = time.monotonic()
        result = cli(
            "stat", "--count", "1", "--http-timeout", "1s", "--nsqd-http-address", hostile.address
        )
        elapsed = time.monotonic() - started
    line = one_line_error(result)
    assert result.returncode == 1
    assert line == f"nsq-sansio stat: http://{hostile.address}/stats: no answer in 1s"
    assert elapsed < 10


# --- HTTP answers: any JSON at all is either understood or one error line --------------------

_JSON = st.recursive(
    st.none()
    | st.booleans()
    | st.integers()
    | st.floats()  # json.loads reads Infinity and NaN too
    | st.text(max_size=70),
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=8), inner),
    max_leaves=12,
)
_CHANNEL = st.fixed_dictionaries(
    {"channel_name": _JSON | st.just("c")},
    optional={
        key: _JSON | st.integers(min_value=0)
        for key in ("depth", "in_flight_count", "message_count", "client_count", "clients")
    },
)
_TOPIC = st.fixed_dictionaries(
    {"topic_name": _JSON | st.just("t"), "channels": st.lists(_CHANNEL, max_size=3) | _JSON},
    optional={"depth": _JSON, "message_count": _JSON},
)
_STATS = st.fixed_dictionaries({"topics": st.lists(_TOPIC, max_size=3) | _JSON}) | _JSON


def _read_stats(answer: object) -> NSQDStats:
    """What ``stat`` gets from an nsqd that answered ``answer`` (the admin client's reading)."""
    body = json.dumps(answer).encode()
    return NSQDAPI.stats(include_clients=False).read(HTTPAnswer(200, body), "http://nsqd")


@settings(max_examples=100, deadline=None)
@given(answers=st.lists(_STATS, min_size=1, max_size=3))
def test_any_stats_answer_is_a_table_or_one_error(answers: list[object]) -> None:
    """Any JSON at all: refused by the admin client's reading (an AdminResponseError, one
    line naming the field), refused by ``stat`` (names it would not print as they are,
    negative counts: one line, nothing added), or rows of a table that fits 80 columns."""
    rows: dict[tuple[str, str], dict[str, int]] = {}
    for answer in answers:
        try:
            stats = _read_stats(answer)
        except AdminResponseError as err:
            assert "\n" not in str(err)
            continue
        before = {key: dict(row) for key, row in rows.items()}
        try:
            add_stats(rows, stats, "http://nsqd/stats", None, None)
        except CLIError as err:
            assert "not an nsqd /stats answer" in str(err)
            assert rows == before  # all or nothing
    text = format_stats(rows, None, 1.0)
    assert max(len(line) for line in text.splitlines()) <= 80
    assert all(ch.isprintable() for ch in text.replace("\n", ""))


def test_a_channel_name_with_an_escape_sequence_is_refused_not_printed() -> None:
    """A hostile nsqd cannot write to the operator's terminal through a name."""
    answer = {"topics": [{"topic_name": "t", "channels": [{"channel_name": "\x1b[2Jx"}]}]}
    rows: dict[tuple[str, str], dict[str, int]] = {}
    with pytest.raises(CLIError, match=r"not an nsqd /stats answer .*invalid channel name"):
        add_stats(rows, _read_stats(answer), "http://nsqd/stats", None, None)
    assert rows == {}

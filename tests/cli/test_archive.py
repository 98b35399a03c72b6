"""``to-file`` with nsq_to_file's gzip and rotation, ``pub`` through nsqlookupd, and the
progress lines of ``to-file`` and ``tail`` (a pseudo-terminal and a pipe)."""

from __future__ import annotations

import gzip
import os
import re
import shutil
import signal
import subprocess
import time
import zlib
from pathlib import Path
from typing import Any

import pytest
from support.brokers import get_json, wait_for

from transports.embedded import Cluster, EmbeddedNSQD, ServerThread
from transports.sync import Producer

from .conftest import channel_stats, cli, cli_in_pty, cli_popen, http_post, screen_lines

pytestmark = pytest.mark.timeout(90)


def gunzip(path: Path) -> list[bytes]:
    """Decompress with the gzip program (every member), failing on any error."""
    result = subprocess.run(["gzip", "-d", "-c", str(path)], capture_output=True, timeout=30)
    assert result.returncode == 0, (path, result.stderr)
    return result.stdout.splitlines()


needs_gzip = pytest.mark.skipif(shutil.which("gzip") is None, reason="needs the gzip program")


def prepare(nsqd: EmbeddedNSQD, topic: str, channel: str, bodies: list[bytes]) -> None:
    http_post(nsqd.http_address, f"/topic/create?topic={topic}")
    http_post(nsqd.http_address, f"/channel/create?topic={topic}&channel={channel}")
    with Producer(nsqd.tcp_address) as producer:
        for i in range(0, len(bodies), 500):
            producer.multi_publish(topic, bodies[i : i + 500])


@needs_gzip
def test_gzip_files_rotate_by_size_and_move_from_work_dir(
    nsqd: EmbeddedNSQD, tmp_path: Path
) -> None:
    bodies = [f"event-{i:05d}".encode() for i in range(2000)]
    prepare(nsqd, "clicks", "arch", bodies)
    out, work = tmp_path / "out", tmp_path / "work"
    out.mkdir()
    work.mkdir()
    result = cli(
        "to-file",
        "--topic",
        "clicks",
        "--channel",
        "arch",
        "--nsqd-tcp-address",
        nsqd.tcp_address,
        "--output-dir",
        str(out),
        "--work-dir",
        str(work),
        "--gzip",
        "--gzip-level",
        "9",
        "--host-identifier",
        "box",
        "--max-in-flight",
        "100",
        "--rotate-size",
        "5000",  # bytes before compression: 12 bytes a line, rotated every ~5 batches
        "-n",
        "2000",
    )
    assert result.returncode == 0, result.stderr
    assert list(work.iterdir()) == []  # every file closed and moved
    files = sorted(out.iterdir())
    assert len(files) >= 4
    name = re.compile(r"clicks\.box-(\d{6})\.\d{4}-\d\d-\d\d_\d\d\.log\.gz")
    revs = []
    for f in files:
        match = name.fullmatch(f.name)
        assert match, f.name
        revs.append(int(match.group(1)))
    assert revs == list(range(len(files)))  # -000000, -000001, ... within the hour
    lines = [line for f in files for line in gunzip(f)]
    assert sorted(lines) == bodies
    # one gzip member per fsync'd batch: more than one member per file
    with gzip.open(files[0]) as first:
        assert len(first.read().splitlines()) > 100
    stats = channel_stats(nsqd.http_address, "clicks", "arch")
    assert stats["depth"] == 0 and stats["in_flight_count"] == 0


@needs_gzip
def test_gzip_file_is_readable_after_sigkill_mid_file(nsqd: EmbeddedNSQD, tmp_path: Path) -> None:
    bodies = [f"record-{i:06d}-".encode() + b"x" * 40 for i in range(30000)]
    prepare(nsqd, "stream", "arch", bodies)
    proc = cli_popen(
        "to-file",
        "--topic",
        "stream",
        "--channel",
        "arch",
        "--nsqd-tcp-address",
        nsqd.tcp_address,
        "--output-dir",
        str(tmp_path),
        "--gzip",
        "--max-in-flight",
        "50",
    )
    try:
        deadline = time.monotonic() + 30
        written = 0
        while time.monotonic() < deadline:
            files = list(tmp_path.glob("stream.*.log.gz"))
            written = sum(f.stat().st_size for f in files)
            if written > 20_000:  # well into the file, still writing
                break
            time.sleep(0.01)
        assert written > 20_000
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == -signal.SIGKILL
    [path] = tmp_path.glob("stream.*.log.gz")
    lines = gunzip(path)  # `gzip -d` reads the whole file: whole members only
    assert 0 < len(lines) < len(bodies)
    assert set(lines) <= set(bodies) and len(set(lines)) == len(lines)

    # nothing FIN'd is missing from the file (FIN only after the member was fsync'd). Read
    # once the broker has seen the killed process's connection close, so every FIN it sent
    # before it died has been applied (read earlier, late FINs would go uncounted)
    def once_closed() -> dict[str, Any] | None:
        found = channel_stats(nsqd.http_address, "stream", "arch")
        return None if found["clients"] else found

    stats = wait_for(once_closed, what="the killed to-file's connection closed")
    finished = len(bodies) - stats["depth"] - stats["in_flight_count"] - stats["deferred_count"]
    assert len(lines) >= finished


@needs_gzip
def test_partial_gzip_member_left_in_work_dir_is_cut_and_moved(
    nsqd: EmbeddedNSQD, tmp_path: Path
) -> None:
    out, work = tmp_path / "out", tmp_path / "work"
    out.mkdir()
    work.mkdir()
    members = [gzip.compress(b"a1\na2\n"), gzip.compress(b"b1\n")]
    partial = gzip.compress(b"c1\nc2\nc3\n" * 50)[:-30]  # killed during its write
    crashed = work / "logs.box-000000.2026-01-01_10.log.gz"
    crashed.write_bytes(b"".join(members) + partial)
    unrelated = work / "notes.txt"
    unrelated.write_bytes(b"not ours")
    prepare(nsqd, "logs", "arch", [b"fresh"])
    result = cli(
        "to-file",
        "--topic",
        "logs",
        "--channel",
        "arch",
        "--nsqd-tcp-address",
        nsqd.tcp_address,
        "--output-dir",
        str(out),
        "--work-dir",
        str(work),
        "--gzip",
        "--host-identifier",
        "box",
        "-n",
        "1",
    )
    assert result.returncode == 0, result.stderr
    assert f"recovered {out / crashed.name}" in result.stderr.decode()
    assert gunzip(out / crashed.name) == [b"a1", b"a2", b"b1"]
    assert sorted(p.name for p in work.iterdir()) == ["notes.txt"]
    fresh = [f for f in out.iterdir() if f.name != crashed.name]
    assert [line for f in fresh for line in gunzip(f)] == [b"fresh"]


def test_filename_format_without_rev_is_refused_with_gzip(nsqd: EmbeddedNSQD) -> None:
    result = cli(
        "to-file",
        "--topic",
        "t",
        "--nsqd-tcp-address",
        nsqd.tcp_address,
        "--gzip",
        "--filename-format",
        "<TOPIC>.<DATETIME>.log",
    )
    assert result.returncode == 2  # flags that contradict each other: a usage error
    assert "needs <REV>" in result.stderr.decode()
    assert (
        cli(
            "to-file", "--topic", "t", "--nsqd-tcp-address", nsqd.tcp_address, "--gzip-level", "0"
        ).returncode
        == 2
    )


def test_plain_files_append_within_the_hour_like_nsq_to_file(
    nsqd: EmbeddedNSQD, tmp_path: Path
) -> None:
    prepare(nsqd, "audit", "arch", [b"one", b"two"])
    args = ("--topic", "audit", "--channel", "arch", "--nsqd-tcp-address", nsqd.tcp_address)
    args += ("--output-dir", str(tmp_path), "--host-identifier", "box")
    assert cli("to-file", *args, "-n", "2").returncode == 0
    with Producer(nsqd.tcp_address) as producer:
        producer.publish("audit", b"three")
    assert cli("to-file", *args, "-n", "1").returncode == 0
    [path] = tmp_path.iterdir()  # no <REV> without gzip/rotation: the same file, appended
    assert re.fullmatch(r"audit\.box\.\d{4}-\d\d-\d\d_\d\d\.log", path.name)
    assert path.read_bytes().splitlines() == [b"one", b"two", b"three"] or sorted(
        path.read_bytes().splitlines()
    ) == [b"one", b"three", b"two"]


def test_whole_gzip_members_prefix() -> None:
    from transports.cli.archive import whole_gzip_members

    one, two = gzip.compress(b"x\n"), zlib.compress(b"not gzip")
    for data, expected in [
        (b"", 0),
        (one, len(one)),
        (one + one, 2 * len(one)),
        (one + one[:5], len(one)),
        (one + two, len(one)),
    ]:
        path = Path(os.environ.get("TMPDIR", "/tmp")) / f"members-{os.getpid()}.gz"
        path.write_bytes(data)
        try:
            assert whole_gzip_members(str(path)) == expected
        finally:
            path.unlink()


# --- pub through lookupd ---------------------------------------------------------------------


def test_pub_finds_nsqd_through_lookupd() -> None:
    with ServerThread(Cluster(nsqd_count=2)) as cluster:
        assert cluster.lookupd is not None
        lookupd = cluster.lookupd.http_address
        lines = b"".join(f"m{i}\n".encode() for i in range(100))
        # each nsqd connects to nsqlookupd on its own after it started listening: wait until
        # both are listed, or pub would see (and publish to) only the first
        wait_for(lambda: len(get_json(f"http://{lookupd}/nodes")["producers"]) == 2, what="2 nodes")
        # no nsqd has the topic yet: every nsqd registered (/nodes), round robin
        pub = cli(
            "pub",
            "--topic",
            "orders",
            "--lookupd-http-address",
            lookupd,
            "--batch-size",
            "10",
            input=lines,
        )
        assert pub.returncode == 0, pub.stderr
        assert b"published 100 messages" in pub.stderr
        counts = [
            sum(
                t["message_count"]
                for t in _topics(node.http_address)
                if t["topic_name"] == "orders"
            )
            for node in cluster.nsqds
        ]
        assert sum(counts) == 100 and all(counts), counts
        # only one nsqd has 'audit': publish there (/lookup), not to the other
        first = cluster.nsqds[0]
        http_post(first.http_address, "/topic/create?topic=audit")
        cluster.wait_registered_blocking("audit", producers=1)
        pub = cli("pub", "--topic", "audit", "--lookupd-http-address", lookupd, input=lines)
        assert pub.returncode == 0, pub.stderr
        audit = [
            sum(t["message_count"] for t in _topics(n.http_address) if t["topic_name"] == "audit")
            for n in cluster.nsqds
        ]
        assert audit == [100, 0]


def test_pub_with_an_empty_lookupd_is_one_line() -> None:
    from transports.embedded import EmbeddedLookupd

    with ServerThread(EmbeddedLookupd()) as lookupd:
        result = cli(
            "pub", "--topic", "t", "--lookupd-http-address", lookupd.http_address, input=b"x\n"
        )
    assert result.returncode == 1
    assert "no nsqd registered with http://" in result.stderr.decode()


def _topics(http_address: str) -> list[dict[str, int | str]]:
    import json
    import urllib.request

    with urllib.request.urlopen(f"http://{http_address}/stats?format=json", timeout=5) as r:
        return list(json.loads(r.read())["topics"])


# --- progress of to-file and tail -------------------------------------------------------------


def test_to_file_progress_on_an_80_column_terminal(nsqd: EmbeddedNSQD, tmp_path: Path) -> None:
    prepare(nsqd, "big", "arch", [b"y" * 50] * 3000)
    code, output = cli_in_pty(
        "to-file",
        "--topic",
        "big",
        "--channel",
        "arch",
        "--nsqd-tcp-address",
        nsqd.tcp_address,
        "--output-dir",
        str(tmp_path),
        "--max-in-flight",
        "100",
        "-n",
        "3000",
        "--progress",
        columns=80,
    )
    assert code == 0, output
    lines = [line for line in screen_lines(output) if line.startswith("archive ")]
    assert lines, output
    for line in lines:
        assert len(line) < 80, line
        assert re.search(r"\] +\d+\.\d% [\d,]+/3,000 [\d,]+/s ETA (\d+:\d\d|--:--)", line), line
    assert "100.0% 3,000/3,000" in lines[-1] and "ETA 0:00" in lines[-1]
    assert "files 1" in output and "bytes 153,000" in output


def test_tail_progress_piped_is_plain_lines(nsqd: EmbeddedNSQD) -> None:
    prepare(nsqd, "feed", "watch", [b"z"] * 500)
    result = cli(
        "tail",
        "--topic",
        "feed",
        "--channel",
        "watch",
        "--nsqd-tcp-address",
        nsqd.tcp_address,
        "-n",
        "500",
        "--progress",
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count(b"\n") == 500
    err = result.stderr.decode().splitlines()
    assert err, result.stderr
    for line in err:
        assert len(line) < 100 and "\x1b" not in line
        assert re.fullmatch(r"\[\s*\d+:\d\d\] tail [\d.]+% [\d,]+/500 [\d,]+/s ETA \S+", line), line
    assert "100.0% 500/500" in err[-1]

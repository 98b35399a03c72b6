"""``nsq-sansio tail | pub | stat | to-file | nsqd | lookupd`` as a user runs them."""

from __future__ import annotations

import contextlib
import json
import re
import signal
import socket
import threading
import time
import urllib.error
from pathlib import Path

import pytest
from support.brokers import get_json, wait_for

from transports.embedded import Cluster, EmbeddedNSQD
from transports.sync import Producer

from .conftest import (
    STAT_COLUMNS,
    channel_stats,
    cli,
    cli_popen,
    http_post,
    one_line_error,
    stat_tables,
)

pytestmark = pytest.mark.timeout(60)


def test_pub_stdin_then_tail_raw_prints_every_line(nsqd: EmbeddedNSQD) -> None:
    lines = [f"line {i}" for i in range(50)]
    pub = cli(
        "pub",
        "--topic",
        "events",
        "--nsqd-tcp-address",
        nsqd.tcp_address,
        "--batch-size",
        "7",
        input=("\n".join(lines) + "\n").encode(),
    )
    assert pub.returncode == 0, pub.stderr
    assert b"published 50 messages" in pub.stderr

    tail = cli("tail", "--topic", "events", "--nsqd-tcp-address", nsqd.tcp_address, "-n", "50")
    assert tail.returncode == 0, tail.stderr
    assert sorted(tail.stdout.decode().splitlines()) == sorted(lines)


def test_tail_json_through_lookupd_and_finishes_what_it_printed(nsq_cluster: Cluster) -> None:
    nsqd = nsq_cluster.nsqd
    assert nsq_cluster.lookupd is not None
    with Producer(nsqd.tcp_address) as producer:
        producer.multi_publish("clicks", [b"a", "é".encode(), b"\xff\x00"])
    nsq_cluster.wait_registered_blocking("clicks")

    tail = cli(
        "tail",
        "-topic",
        "clicks",
        "--channel",
        "audit",
        "--format",
        "json",
        "-n",
        "3",
        "--lookupd-http-address",
        nsq_cluster.lookupd.http_address,
    )
    assert tail.returncode == 0, tail.stderr
    records = [json.loads(line) for line in tail.stdout.decode().splitlines()]
    assert len(records) == 3
    bodies = {r.get("body") or r.get("body_base64") for r in records}
    assert bodies == {"a", "é", "/wA="}
    for r in records:
        assert r["topic"] == "clicks" and r["channel"] == "audit"
        assert r["attempts"] == 1 and r["nsqd"] == nsqd.tcp_address
        assert re.fullmatch(r"[0-9a-f]{16}", r["id"])
    stats = channel_stats(nsqd.http_address, "clicks", "audit")
    assert stats["depth"] == 0 and stats["in_flight_count"] == 0 and stats["requeue_count"] == 0


def test_pub_file_with_rate_limit_and_custom_delimiter(nsqd: EmbeddedNSQD, tmp_path: Path) -> None:
    source = tmp_path / "input.txt"
    source.write_bytes(b"|".join(f"m{i}".encode() for i in range(40)))
    started = time.monotonic()
    pub = cli(
        "pub",
        "--topic",
        "paced",
        "--nsqd-tcp-address",
        nsqd.tcp_address,
        "--file",
        str(source),
        "--delimiter",
        "|",
        "--rate",
        "100",
    )
    elapsed = time.monotonic() - started
    assert pub.returncode == 0, pub.stderr
    http_post(nsqd.http_address, "/channel/create?topic=paced&channel=c")
    # 40 messages at 100/s: the last batch may not leave before ~0.3 s
    assert elapsed >= 0.3
    stats = json.loads(cli_stats_json(nsqd.http_address))
    topic = next(t for t in stats["topics"] if t["topic_name"] == "paced")
    assert topic["message_count"] == 40


def cli_stats_json(http_address: str) -> str:
    import urllib.request

    with urllib.request.urlopen(f"http://{http_address}/stats?format=json", timeout=5) as r:
        return str(r.read().decode())


def test_stat_table_from_every_nsqd_found_through_lookupd() -> None:
    from transports.embedded import ServerThread

    with ServerThread(Cluster(nsqd_count=2)) as cluster:
        assert cluster.lookupd is not None
        for i, node in enumerate(cluster.nsqds):
            http_post(node.http_address, "/topic/create?topic=orders")
            http_post(node.http_address, "/channel/create?topic=orders&channel=billing")
            with Producer(node.tcp_address) as producer:
                producer.multi_publish("orders", [b"x"] * (3 + i))
        cluster.wait_registered_blocking("orders", producers=2)
        result = cli(
            "stat",
            "--lookupd-http-address",
            cluster.lookupd.http_address,
            "--topic",
            "orders",
            "--count",
            "2",
            "--status-every",
            "100ms",
        )
    assert result.returncode == 0, result.stderr
    out = result.stdout.decode()
    assert out.count("2 nsqd") == 2
    assert max(len(line) for line in out.splitlines()) <= 80
    first, second = stat_tables(out)
    # a topic row and a channel row; the channel holds 3 + 4 messages over both nsqd
    assert set(second) == {("orders", ""), ("orders", "billing")}
    billing = dict(zip(STAT_COLUMNS, second[("orders", "billing")], strict=True))
    assert (billing["nsqd"], billing["lag"], billing["depth"], billing["inflt"]) == (
        "2",
        "7",
        "7",
        "0",
    )
    rate = STAT_COLUMNS.index("msg/s")
    assert first[("orders", "billing")][rate] == "-"  # msg/s needs a previous table
    assert second[("orders", "billing")][rate] == "0"  # between the two: nothing published


def test_stat_lag_is_what_the_channel_has_not_finished(nsqd: EmbeddedNSQD) -> None:
    """The lag column is the channel's lag as docs/admin.md defines it: waiting in the
    (paused) topic + queued in the channel + in flight + deferred."""
    from transports.sync import Consumer
    from transports.sync.admin import NSQDAdmin

    with NSQDAdmin(nsqd.http_url) as admin, Producer(nsqd.tcp_address) as producer:
        admin.create_topic("lagging")
        admin.create_channel("lagging", "slow")
        producer.multi_publish("lagging", [b"m%d" % i for i in range(10)])
        with Consumer("lagging", "slow", nsqd=[nsqd.tcp_address], max_in_flight=2) as consumer:
            held = [consumer.get(timeout=10) for _ in range(2)]
            assert None not in held
            held[0].requeue(delay=60, backoff=False)  # deferred; another comes in its place
            admin.pause_topic("lagging")
            producer.multi_publish("lagging", [b"late"] * 4)  # held in the topic
            deadline = time.monotonic() + 10
            while True:
                slow = admin.channel_stats("lagging", "slow")
                parts = (slow.topic_depth, slow.depth, slow.in_flight_count, slow.deferred_count)
                if parts == (4, 7, 2, 1):
                    break
                assert time.monotonic() < deadline, parts
                time.sleep(0.01)
            result = cli(
                "stat",
                "--nsqd-http-address",
                nsqd.http_address,
                "--topic",
                "lagging",
                "-count",
                "1",
            )
    assert result.returncode == 0, result.stderr
    (table,) = stat_tables(result.stdout.decode())
    channel = dict(zip(STAT_COLUMNS, table[("lagging", "slow")], strict=True))
    topic = dict(zip(STAT_COLUMNS, table[("lagging", "")], strict=True))
    assert (channel["lag"], channel["depth"], channel["inflt"], channel["def"]) == (
        "14",
        "7",
        "2",
        "1",
    )
    assert (topic["lag"], topic["depth"]) == ("-", "4")


class CountingProxy:
    """Relays every TCP connection to ``target`` (``host:port``) and counts them."""

    def __init__(self, target: str) -> None:
        host, _, port = target.rpartition(":")
        self.target = (host, int(port))
        self.listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self.listener.getsockname()[1]}"
        self.accepted = 0
        self.thread = threading.Thread(target=self._serve, daemon=True)

    def __enter__(self) -> CountingProxy:
        self.thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        with contextlib.suppress(OSError):
            self.listener.shutdown(socket.SHUT_RDWR)
        self.listener.close()
        self.thread.join(timeout=10)

    def _serve(self) -> None:
        while True:
            try:
                client, _ = self.listener.accept()
            except OSError:
                return
            self.accepted += 1
            upstream = socket.create_connection(self.target, timeout=5)
            for source, sink in ((client, upstream), (upstream, client)):
                threading.Thread(target=self._pipe, args=(source, sink), daemon=True).start()

    @staticmethod
    def _pipe(source: socket.socket, sink: socket.socket) -> None:
        with contextlib.suppress(OSError):
            while data := source.recv(65536):
                sink.sendall(data)
        with contextlib.suppress(OSError):
            sink.shutdown(socket.SHUT_WR)


def test_stat_keeps_one_connection_per_nsqd_across_tables(nsqd: EmbeddedNSQD) -> None:
    """Each nsqd's admin client is kept from one table to the next: its kept-alive HTTP
    connection serves every refresh (a connection per table would be 3 here)."""
    http_post(nsqd.http_address, "/topic/create?topic=kept")
    with CountingProxy(nsqd.http_address) as proxy:
        result = cli(
            "stat", "--nsqd-http-address", proxy.address, "--count", "3", "--status-every", "50ms"
        )
    assert result.returncode == 0, result.stderr
    assert len(stat_tables(result.stdout.decode())) == 3
    assert proxy.accepted == 1


def test_stat_over_two_nsqd_when_one_lacks_the_topic() -> None:
    """nsqd answers ``"topics": null`` for a topic it lacks; stat reads that as no topics."""
    from transports.embedded import ServerThread

    with ServerThread(Cluster(nsqd_count=2)) as cluster:
        with_topic, without = cluster.nsqds
        http_post(with_topic.http_address, "/topic/create?topic=only_here")
        result = cli(
            "stat",
            "--nsqd-http-address",
            with_topic.http_address,
            "--nsqd-http-address",
            without.http_address,
            "--topic",
            "only_here",
            "--count",
            "1",
        )
    assert result.returncode == 0, result.stderr
    (table,) = stat_tables(result.stdout.decode())
    assert list(table) == [("only_here", "")]
    assert table[("only_here", "")][0] == "1"  # found on one nsqd of two


def test_to_file_writes_rolling_files_and_fins_only_after_fsync(
    nsqd: EmbeddedNSQD, tmp_path: Path
) -> None:
    http_post(nsqd.http_address, "/topic/create?topic=archive")
    http_post(nsqd.http_address, "/channel/create?topic=archive&channel=to_file")
    bodies = [f"record-{i:04d}".encode() for i in range(300)]
    with Producer(nsqd.tcp_address) as producer:
        producer.multi_publish("archive", bodies)
    result = cli(
        "to-file",
        "--topic",
        "archive",
        "--channel",
        "to_file",
        "--nsqd-tcp-address",
        nsqd.tcp_address,
        "--output-dir",
        str(tmp_path),
        "--max-in-flight",
        "50",
        "--rotate-size",
        "1000",
        "-n",
        "300",
    )
    assert result.returncode == 0, result.stderr
    files = sorted(tmp_path.glob("archive.*.log"))
    assert len(files) >= 3  # 300 x 12 bytes, rotated at 1000 bytes
    lines = [line for f in files for line in f.read_bytes().splitlines()]
    assert sorted(lines) == bodies
    stats = channel_stats(nsqd.http_address, "archive", "to_file")
    assert stats["depth"] == 0 and stats["in_flight_count"] == 0


def test_to_file_stops_cleanly_on_sigterm(nsqd: EmbeddedNSQD, tmp_path: Path) -> None:
    http_post(nsqd.http_address, "/topic/create?topic=live")
    http_post(nsqd.http_address, "/channel/create?topic=live&channel=arch")
    proc = cli_popen(
        "to-file",
        "--topic",
        "live",
        "--channel",
        "arch",
        "--nsqd-tcp-address",
        nsqd.tcp_address,
        "--output-dir",
        str(tmp_path),
        "--sync-interval",
        "100ms",
    )
    try:
        with Producer(nsqd.tcp_address) as producer:
            producer.multi_publish("live", [b"one", b"two", b"three"])
        deadline = time.monotonic() + 15
        while time.monotonic() < deadline:
            written = b"".join(f.read_bytes() for f in tmp_path.glob("live.*.log"))
            if len(written.splitlines()) == 3:
                break
            time.sleep(0.05)
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert b"archived 3 messages" in err
    assert sorted(written.splitlines()) == [b"one", b"three", b"two"]
    stats = channel_stats(nsqd.http_address, "live", "arch")
    assert stats["depth"] == 0 and stats["in_flight_count"] == 0


def test_nsqd_and_lookupd_subcommands_serve_until_sigterm() -> None:
    lookupd = cli_popen("lookupd", "--tcp-address", "127.0.0.1:0", "--http-address", "127.0.0.1:0")
    nsqd = None
    try:
        assert lookupd.stderr is not None
        line = lookupd.stderr.readline().decode()
        match = re.search(r"TCP (\S+) HTTP (\S+)", line)
        assert match, line
        lookupd_tcp, lookupd_http = match.groups()
        nsqd = cli_popen(
            "nsqd",
            "-tcp-address",
            "127.0.0.1:0",
            "-http-address",
            "127.0.0.1:0",
            "-lookupd-tcp-address",
            lookupd_tcp,
        )
        assert nsqd.stderr is not None
        match = re.search(r"TCP (\S+) HTTP (\S+)", nsqd.stderr.readline().decode())
        assert match
        nsqd_tcp, _ = match.groups()
        pub = cli("pub", "--topic", "t", "--nsqd-tcp-address", nsqd_tcp, input=b"hello\n")
        assert pub.returncode == 0, pub.stderr
        # nsqd registers the topic with nsqlookupd after the publish is answered; tail asks
        # nsqlookupd once at start and again only a minute later (its poll interval): wait
        wait_for(lambda: lookupd_producers(lookupd_http, "t") == 1, what="t registered")
        tail = cli("tail", "--topic", "t", "--lookupd-http-address", lookupd_http, "-n", "1")
        assert tail.returncode == 0, tail.stderr
        assert tail.stdout == b"hello\n"
        for server in (nsqd, lookupd):
            server.send_signal(signal.SIGTERM)
            server.wait(timeout=10)
            assert server.returncode == 0
    finally:
        for proc in (nsqd, lookupd):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()


def lookupd_producers(lookupd_http: str, topic: str) -> int:
    """How many nsqd nsqlookupd lists for ``topic`` (0 while it does not know the topic)."""
    try:
        found = get_json(f"http://{lookupd_http}/lookup?topic={topic}")
    except urllib.error.HTTPError as err:
        if err.code == 404:  # TOPIC_NOT_FOUND
            return 0
        raise
    return len(found.get("producers") or [])


# --- errors: one clear line, non-zero exit, no traceback -------------------------------------


def test_unreachable_nsqd_is_one_line() -> None:
    for command in ("tail", "pub", "to-file"):
        result = cli(command, "--topic", "t", "--nsqd-tcp-address", "127.0.0.1:1", input=b"x\n")
        line = one_line_error(result)
        assert result.returncode == 1
        assert line.startswith(f"nsq-sansio {command}: cannot connect to nsqd 127.0.0.1:1")


def test_unreachable_lookupd_is_one_line() -> None:
    for args in (("tail", "--topic", "t"), ("stat",)):
        result = cli(*args, "--lookupd-http-address", "127.0.0.1:1")
        line = one_line_error(result)
        assert "cannot reach http://127.0.0.1:1/" in line


def test_bad_topic_name_is_one_line(nsqd: EmbeddedNSQD) -> None:
    for command in ("tail", "pub", "to-file", "stat"):
        address = nsqd.http_address if command == "stat" else nsqd.tcp_address
        flag = "--nsqd-http-address" if command == "stat" else "--nsqd-tcp-address"
        result = cli(command, "--topic", "bad topic!", flag, address, input=b"x\n")
        line = one_line_error(result)
        assert "invalid topic name 'bad topic!'" in line
        assert result.returncode == 2  # a bad value: a usage error


def test_usage_errors_exit_2() -> None:
    assert cli("no-such-command").returncode == 2
    assert cli("tail").returncode == 2  # --topic is required
    result = cli("--help")
    assert result.returncode == 0
    for command in ("demo", "tail", "pub", "stat", "to-file", "nsqd", "lookupd"):
        assert command in result.stdout.decode()


def test_tail_follows_until_sigint_and_leaves_nothing_in_flight(nsqd: EmbeddedNSQD) -> None:
    http_post(nsqd.http_address, "/topic/create?topic=follow")
    http_post(nsqd.http_address, "/channel/create?topic=follow&channel=watch")
    proc = cli_popen(
        "tail", "--topic", "follow", "--channel", "watch", "--nsqd-tcp-address", nsqd.tcp_address
    )
    try:
        with Producer(nsqd.tcp_address) as producer:
            producer.multi_publish("follow", [b"first", b"second"])
        assert proc.stdout is not None
        assert proc.stdout.readline() == b"first\n"
        assert proc.stdout.readline() == b"second\n"
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
    assert proc.returncode == 0, err
    assert b"Traceback" not in err
    stats = channel_stats(nsqd.http_address, "follow", "watch")
    assert stats["depth"] == 0 and stats["in_flight_count"] == 0


def test_nsqd_http_port_given_as_the_tcp_address_is_one_line(nsqd: EmbeddedNSQD) -> None:
    """A common slip: nsqd's HTTP port where its TCP port belongs. Each command stops with one
    line that names the address and says it is an HTTP port, not a hang or a traceback."""
    for command in ("tail", "pub", "to-file"):
        result = cli(command, "--topic", "t", "--nsqd-tcp-address", nsqd.http_address, input=b"x\n")
        line = one_line_error(result)
        assert nsqd.http_address in line, line
        assert "HTTP" in line, line

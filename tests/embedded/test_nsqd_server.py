"""The embedded nsqd as a runnable server: TLS, both anyio backends, CLI, fixtures, restarts."""

from __future__ import annotations

import json
import os
import signal
import socket
import ssl
import struct
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import anyio
import pytest
from conformance.wire import RawConn, http_request, unique, wait_for

from transports.embedded import Cluster, EmbeddedLookupd, EmbeddedNSQD, ServerThread
from transports.testing.tls import self_signed_certificate

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def cert_files() -> Iterator[tuple[str, str]]:
    """A throwaway self-signed certificate for 127.0.0.1 (cryptography, else openssl)."""
    try:
        with self_signed_certificate() as files:
            yield files
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("neither the cryptography package nor an openssl binary is available")


def read_frame(sock: socket.socket | ssl.SSLSocket) -> tuple[int, bytes]:
    buf = b""
    while len(buf) < 4:
        chunk = sock.recv(4 - len(buf))
        assert chunk, "closed"
        buf += chunk
    (size,) = struct.unpack(">i", buf)
    data = b""
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        assert chunk, "closed"
        data += chunk
    return struct.unpack(">i", data[:4])[0], data[4:]


def test_tls_upgrade_after_identify(cert_files: tuple[str, str]) -> None:
    cert, key = cert_files
    with ServerThread(EmbeddedNSQD(tls_cert=cert, tls_key=key)) as nsqd:
        raw = socket.create_connection(("127.0.0.1", nsqd.tcp_port), timeout=5)
        body = json.dumps({"tls_v1": True, "feature_negotiation": True}).encode()
        raw.sendall(b"  V2IDENTIFY\n" + struct.pack(">i", len(body)) + body)
        kind, data = read_frame(raw)
        assert kind == 0 and json.loads(data)["tls_v1"] is True
        ctx = ssl.create_default_context(cafile=cert)
        tls = ctx.wrap_socket(raw, server_hostname="127.0.0.1")
        assert read_frame(tls) == (0, b"OK")
        topic = unique()
        tls.sendall(f"PUB {topic}\n".encode() + struct.pack(">i", 6) + b"secret")
        assert read_frame(tls) == (0, b"OK")
        tls.sendall(f"SUB {topic} c\nRDY 1\n".encode())
        assert read_frame(tls) == (0, b"OK")
        kind, data = read_frame(tls)
        assert kind == 2 and data[26:] == b"secret"
        tls.close()


def test_tls_required_refuses_plaintext_commands(cert_files: tuple[str, str]) -> None:
    cert, key = cert_files
    server = EmbeddedNSQD(tls_cert=cert, tls_key=key, tls_required=True)
    with ServerThread(server) as nsqd, RawConn(nsqd.tcp_address) as c:
        c.pub(unique(), b"x")
        c.expect_error("E_INVALID")
        c.expect_closed()
        status, body, _ = http_request(nsqd.http_address, "POST", "/pub?topic=t", b"x")
        assert status == 403 and json.loads(body)["message"] == "TLS_REQUIRED"


def test_garbage_tls_handshake_closes_only_that_client(cert_files: tuple[str, str]) -> None:
    cert, key = cert_files
    with ServerThread(EmbeddedNSQD(tls_cert=cert, tls_key=key)) as nsqd:
        with RawConn(nsqd.tcp_address) as c:
            info = c.identify(tls_v1=True)
            assert isinstance(info, dict) and info["tls_v1"] is True
            c.send(b"this is not a TLS client hello" * 10)
            c.expect_closed()
        assert http_request(nsqd.http_address, "GET", "/ping")[:2] == (200, b"OK")


@pytest.mark.parametrize("backend", ["asyncio", "trio"])
def test_pub_sub_on_both_backends(backend: str) -> None:
    async def main() -> None:
        async with EmbeddedNSQD() as nsqd:
            stream = await anyio.connect_tcp("127.0.0.1", nsqd.tcp_port)
            async with stream:
                await stream.send(b"  V2SUB t c\nRDY 1\nPUB t\n\x00\x00\x00\x02hi")
                data = b""
                with anyio.fail_after(5):
                    while b"hi" not in data:
                        data += await stream.receive()

    anyio.run(main, backend=backend)


def test_binds_port_zero_and_exposes_real_ports() -> None:
    with ServerThread(EmbeddedNSQD()) as nsqd:
        assert nsqd.tcp_port > 0 and nsqd.http_port > 0 and nsqd.tcp_port != nsqd.http_port
        assert nsqd.tcp_address == f"127.0.0.1:{nsqd.tcp_port}"
        info = json.loads(http_request(nsqd.http_address, "GET", "/info")[1])
        assert (info["tcp_port"], info["http_port"]) == (nsqd.tcp_port, nsqd.http_port)


def test_nsqd_registers_with_a_lookupd_that_starts_later() -> None:
    probe = socket.socket()
    probe.bind(("127.0.0.1", 0))
    port = probe.getsockname()[1]
    probe.close()
    nsqd = EmbeddedNSQD(lookupd_tcp_addresses=[f"127.0.0.1:{port}"])
    with ServerThread(nsqd) as running:
        http_request(running.http_address, "POST", "/topic/create?topic=late")
        lookupd = EmbeddedLookupd(tcp_address=f"127.0.0.1:{port}")
        with ServerThread(lookupd) as lk:

            def registered() -> bool:
                status, body, _ = http_request(lk.http_address, "GET", "/lookup?topic=late")
                return status == 200 and len(json.loads(body)["producers"]) == 1

            wait_for(registered, timeout=10.0)


def test_cluster_of_two_nsqds_both_registered() -> None:
    with ServerThread(Cluster(nsqd_count=2)) as cluster:
        lookupd = cluster.lookupd
        assert lookupd is not None
        for n in cluster.nsqds:
            http_request(n.http_address, "POST", "/topic/create?topic=shared")

        def both() -> bool:
            status, body, _ = http_request(lookupd.http_address, "GET", "/lookup?topic=shared")
            return status == 200 and len(json.loads(body)["producers"]) == 2

        wait_for(both)


def test_fixtures_from_the_plugin(nsq_cluster: Cluster, nsqd: EmbeddedNSQD) -> None:
    assert nsq_cluster.nsqd.tcp_port != nsqd.tcp_port
    assert nsq_cluster.lookupd_http_urls[0].startswith("http://127.0.0.1:")
    assert http_request(nsqd.http_address, "GET", "/ping")[:2] == (200, b"OK")
    http_request(nsq_cluster.nsqd.http_address, "POST", "/topic/create?topic=fixture")
    nsq_cluster.wait_registered_blocking("fixture")
    with pytest.raises(TimeoutError):
        nsq_cluster.wait_registered_blocking("never", timeout=0.2)


def test_malformed_http_gets_400_and_server_keeps_serving(nsqd: EmbeddedNSQD) -> None:
    with socket.create_connection(("127.0.0.1", nsqd.http_port), timeout=5) as s:
        s.sendall(b"NOT HTTP AT ALL\r\n\r\n")
        data = s.recv(4096)
        assert data.startswith(b"HTTP/1.1 400")
    with socket.create_connection(("127.0.0.1", nsqd.http_port), timeout=5) as s:
        s.sendall(b"POST /pub?topic=t HTTP/1.1\r\nHost: x\r\nContent-Length: 5\r\n\r\nab")
        s.shutdown(socket.SHUT_WR)  # vanishes mid-body
        s.recv(4096)
    assert http_request(nsqd.http_address, "GET", "/ping")[:2] == (200, b"OK")
    _, body, _ = http_request(nsqd.http_address, "GET", "/stats?format=json&topic=t")
    assert json.loads(body)["topics"] is None  # the half request published nothing (no topic)


@pytest.mark.parametrize("which", ["nsqd", "lookupd"])
def test_cli_starts_serves_and_stops_on_sigterm(which: str) -> None:
    code = (
        "import sys; from transports.cli.servers import nsqd_main, lookupd_main; "
        f"sys.exit({which}_main(sys.argv[1:]))"
    )
    proc = subprocess.Popen(
        [
            sys.executable,
            "-c",
            code,
            "--tcp-address",
            "127.0.0.1:0",
            "-http-address",
            "127.0.0.1:0",
        ],
        stderr=subprocess.PIPE,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert proc.stderr is not None
        line = proc.stderr.readline().decode()
        assert " TCP 127.0.0.1:" in line and " HTTP 127.0.0.1:" in line, line
        http_address = line.split(" HTTP ")[1].strip()
        assert http_request(http_address, "GET", "/ping")[:2] == (200, b"OK")
        proc.send_signal(signal.SIGTERM)
        assert proc.wait(timeout=10) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_cli_rejects_bad_flags() -> None:
    from transports.cli.common import parse_duration
    from transports.cli.servers import nsqd_main

    assert parse_duration("1m30s") == 90.0 and parse_duration("250ms") == 0.25
    with pytest.raises(SystemExit):
        nsqd_main(["--msg-timeout", "soon"])
    assert nsqd_main(["--mem-queue-size", "-1", "--tcp-address", "127.0.0.1:0"]) == 2


def test_data_path_keeps_queued_and_in_flight_messages_across_restart(tmp_path: Path) -> None:
    topic = unique()
    bodies = [f"msg-{i}".encode() for i in range(30)]
    with ServerThread(EmbeddedNSQD(data_path=tmp_path, mem_queue_size=10)) as nsqd:
        http_request(nsqd.http_address, "POST", f"/topic/create?topic={topic}")
        http_request(nsqd.http_address, "POST", f"/channel/create?topic={topic}&channel=c")
        status, _, _ = http_request(
            nsqd.http_address, "POST", f"/mpub?topic={topic}", b"\n".join(bodies)
        )
        assert status == 200
        with RawConn(nsqd.tcp_address) as c:
            c.sub(topic, "c")
            c.command("RDY 5")
            taken = [c.read_message() for _ in range(5)]
            c.command(f"FIN {taken[0].id.decode()}")  # one finished ...
            c.read_message()  # ... which frees RDY for a sixth: five left in flight
            stats_path = f"/stats?format=json&topic={topic}"

            def in_flight() -> int:
                doc = json.loads(http_request(nsqd.http_address, "GET", stats_path)[1])
                return int(doc["topics"][0]["channels"][0]["in_flight_count"])

            wait_for(lambda: in_flight() == 5)
    with ServerThread(EmbeddedNSQD(data_path=tmp_path, mem_queue_size=10)) as nsqd:
        with RawConn(nsqd.tcp_address) as c:
            c.sub(topic, "c")
            c.command("RDY 100")
            got = {c.read_message().body for _ in range(29)}
            assert c.nothing_within(0.3)
        assert got == set(bodies) - {taken[0].body}


def test_a_restart_with_a_big_backlog_serves_at_once_and_moves_it_in_the_background(
    tmp_path: Path,
) -> None:
    # nsqd.dat lists the topic (unpaused) and its channel, and the topic's queue on disk holds
    # a backlog: the restarted broker serves while it moves the backlog into the channel, as
    # nsqd does (it used to move all of it inside start(), before serving anyone).
    topic, count = unique(), 200_000
    with ServerThread(EmbeddedNSQD(data_path=tmp_path, mem_queue_size=100)) as nsqd:
        assert http_request(nsqd.http_address, "POST", f"/topic/create?topic={topic}")[0] == 200
        http_request(nsqd.http_address, "POST", f"/channel/create?topic={topic}&channel=c")
        http_request(nsqd.http_address, "POST", f"/topic/pause?topic={topic}")
        with RawConn(nsqd.tcp_address) as producer:
            for _ in range(2):
                producer.mpub(topic, [b"x"] * (count // 2))
                producer.expect_ok()
    metadata = json.loads((tmp_path / "nsqd.dat").read_text())
    for entry in metadata["topics"]:
        entry["paused"] = False
    (tmp_path / "nsqd.dat").write_text(json.dumps(metadata))

    def depths(address: str) -> tuple[int, int]:
        stats_path = f"/stats?format=json&topic={topic}&include_mem=false"
        (found,) = json.loads(http_request(address, "GET", stats_path)[1])["topics"]
        return found["depth"], found["channels"][0]["message_count"]

    with ServerThread(EmbeddedNSQD(data_path=tmp_path, mem_queue_size=100)) as nsqd:
        waiting, _ = depths(nsqd.http_address)
        assert waiting > 0, "the whole backlog moved before the broker served anyone"
        assert http_request(nsqd.http_address, "GET", "/ping")[:2] == (200, b"OK")
        with RawConn(nsqd.tcp_address) as c:
            c.sub(topic, "c")
            c.command("RDY 1")
            assert c.read_message().body == b"x"
        wait_for(lambda: depths(nsqd.http_address) == (0, count), timeout=60)


def test_a_failing_core_call_costs_one_connection_not_the_broker() -> None:
    runner = ServerThread(EmbeddedNSQD())
    nsqd = runner.start()
    try:
        core = nsqd.core
        original = core.receive_data

        def exploding(conn_id: int, data: bytes, now: float) -> list[object]:
            if b"BOOM" in data:
                raise RuntimeError("simulated bug in the core")
            return original(conn_id, data, now)  # type: ignore[return-value]

        runner.call(setattr, core, "receive_data", exploding)
        with RawConn(nsqd.tcp_address) as bad:
            bad.send(b"BOOM\n")
            bad.expect_closed()
        with RawConn(nsqd.tcp_address) as good:
            good.pub(unique(), b"fine")
            good.expect_ok()
    finally:
        runner.stop()


def test_context_exit_closes_clients_and_listeners() -> None:
    runner = ServerThread(EmbeddedNSQD())
    nsqd = runner.start()
    port, http_port = nsqd.tcp_port, nsqd.http_port
    client = RawConn(nsqd.tcp_address)
    client.sub(unique(), "c")
    runner.stop()
    client.expect_closed()
    client.close()
    for p in (port, http_port):
        with pytest.raises(ConnectionRefusedError):  # nothing listens there any more
            socket.create_connection(("127.0.0.1", p), timeout=2).close()


def test_https_api(cert_files: tuple[str, str]) -> None:
    import http.client

    cert, key = cert_files
    server = EmbeddedNSQD(tls_cert=cert, tls_key=key, https_address="127.0.0.1:0")
    with ServerThread(server) as nsqd:
        assert nsqd.https_address is not None
        ctx = ssl.create_default_context(cafile=cert)
        conn = http.client.HTTPSConnection("127.0.0.1", nsqd.https_port, context=ctx, timeout=5)
        try:
            conn.request("POST", "/pub?topic=secure", body=b"over https")
            resp = conn.getresponse()
            assert (resp.status, resp.read()) == (200, b"OK")
        finally:
            conn.close()
        with RawConn(nsqd.tcp_address) as c:
            c.sub("secure", "c")
            c.command("RDY 1")
            assert c.read_message().body == b"over https"


@pytest.mark.parametrize("outer", ["asyncio", "trio"])
def test_server_built_inside_another_event_loop_runs_on_its_own(outer: str) -> None:
    """Constructing the servers must not bind anyio objects to the caller's loop."""
    other = "trio" if outer == "asyncio" else "asyncio"

    async def main() -> None:
        runner = ServerThread(Cluster(nsqd_count=1), backend=other)
        with runner as cluster, RawConn(cluster.nsqd.tcp_address) as c:
            c.pub(unique(), b"x")
            c.expect_ok()
            c.identify(heartbeat_interval=1000)
            assert c.read_frame(skip_heartbeats=False) == (0, b"_heartbeat_")  # timer works

    anyio.run(main, backend=outer)


@pytest.mark.parametrize("outer", ["asyncio", "trio"])
def test_servers_constructed_in_one_loop_run_on_a_thread_with_the_other(outer: str) -> None:
    """EmbeddedNSQD/EmbeddedLookupd/Cluster built directly in a trio (asyncio) coroutine, then
    run by a ServerThread on asyncio (trio): every anyio object must belong to the server's
    loop (timers, lookupd registration and delivery all work)."""
    other = "trio" if outer == "asyncio" else "asyncio"

    async def main() -> None:
        lookupd_runner = ServerThread(EmbeddedLookupd(), backend=other)
        cluster_runner = ServerThread(Cluster(nsqd_count=1), backend=other)
        with lookupd_runner as lookupd, cluster_runner as cluster:
            nsqd = EmbeddedNSQD(lookupd_tcp_addresses=[lookupd.tcp_address], msg_timeout=1.0)
            with ServerThread(nsqd, backend=other) as server:
                topic = unique()
                with RawConn(server.tcp_address) as c:
                    c.identify(heartbeat_interval=1000)
                    assert c.read_frame(skip_heartbeats=False) == (0, b"_heartbeat_")
                    c.sub(topic, "c")
                    c.command("RDY 1")
                    with RawConn(server.tcp_address) as p:
                        p.pub(topic, b"x")
                        p.expect_ok()
                    first = c.read_message()
                    # not FIN'd: the server's timer takes it back and delivers it again
                    again = c.read_message()
                    assert (first.body, again.body, again.attempts) == (b"x", b"x", 2)

                def registered() -> bool:
                    status, body, _ = http_request(
                        lookupd.http_address, "GET", f"/lookup?topic={topic}"
                    )
                    return status == 200 and len(json.loads(body)["producers"]) == 1

                wait_for(registered, timeout=10.0)
            with RawConn(cluster.nsqd.tcp_address) as c:
                c.identify(heartbeat_interval=1000)
                assert c.read_frame(skip_heartbeats=False) == (0, b"_heartbeat_")

    anyio.run(main, backend=outer)


@pytest.mark.parametrize("caller", ["asyncio", "trio"])
def test_wait_registered_and_core_reads_from_another_loop_use_the_servers_clock(
    caller: str,
) -> None:
    """A trio test driving a Cluster that runs on an asyncio ServerThread (and the reverse):
    trio's clock is far from asyncio's, so passing the caller's ``anyio.current_time()`` to
    the lookupd's registry made every producer look expired."""
    server_backend = "trio" if caller == "asyncio" else "asyncio"
    runner = ServerThread(Cluster(nsqd_count=2), backend=server_backend)
    with runner as cluster:
        lookupd = cluster.lookupd
        assert lookupd is not None
        topic = unique()
        for n in cluster.nsqds:
            http_request(n.http_address, "POST", f"/topic/create?topic={topic}")
        # now() is the server loop's clock, whoever asks
        servers: list[EmbeddedLookupd | EmbeddedNSQD] = [lookupd, *cluster.nsqds]
        for server in servers:
            assert abs(runner.call(anyio.current_time) - server.now()) < 1.0
            assert abs(runner.call(server.now) - server.now()) < 1.0

        async def main() -> None:
            assert abs(runner.call(anyio.current_time) - lookupd.now()) < 1.0
            await cluster.wait_registered(topic, timeout=10.0)
            assert len(lookupd.core.lookup(topic, lookupd.now())["producers"]) == 2

        anyio.run(main, backend=caller)
        runner.portal.call(cluster.wait_registered, topic)  # on the cluster's own loop, as before

"""The virtual clock and the simulated network: FIFO pipes, reordering across connections,
partitions that hold bytes, resets and crashes."""

from __future__ import annotations

import random

from nsq_sansio.testing.clock import Scheduler
from nsq_sansio.testing.network import ConnState, LinkSpec, Network, SimConn
from nsq_sansio.testing.nodes import SimNode


class Recorder(SimNode):
    """A node that records what happens to it and can answer."""

    def __init__(self, sim: object, name: str, ports: set[int] = frozenset()) -> None:  # type: ignore[assignment]
        super().__init__(sim, name)  # type: ignore[arg-type]
        self.ports = set(ports)
        self.log: list[tuple[str, int, bytes, float]] = []
        self.accepted: list[SimConn] = []

    def on_accept(self, conn: SimConn, now: float) -> None:
        self.accepted.append(conn)
        self.log.append(("accept", conn.id, b"", now))

    def on_connected(self, conn: SimConn, now: float) -> None:
        self.log.append(("connected", conn.id, b"", now))

    def on_connect_failed(self, conn: SimConn, now: float) -> None:
        self.log.append(("failed", conn.id, b"", now))

    def on_data(self, conn: SimConn, data: bytes, now: float) -> None:
        self.log.append(("data", conn.id, data, now))

    def on_eof(self, conn: SimConn, now: float) -> None:
        self.log.append(("eof", conn.id, b"", now))


def make(
    link: LinkSpec | None = None, seed: int = 0
) -> tuple[Scheduler, Network, Recorder, Recorder]:
    scheduler = Scheduler()
    net = Network(scheduler, random.Random(seed), link or LinkSpec(latency=0.01, jitter=0.0))
    client = Recorder(None, "client")
    server = Recorder(None, "server", {80})
    net.add_node(client)
    net.add_node(server)
    return scheduler, net, client, server


def data_of(node: Recorder, conn_id: int) -> bytes:
    return b"".join(d for kind, cid, d, _ in node.log if kind == "data" and cid == conn_id)


def test_scheduler_runs_in_time_order_and_ties_in_schedule_order() -> None:
    scheduler = Scheduler()
    seen: list[str] = []
    scheduler.call_at(2.0, seen.append, "late")
    scheduler.call_at(1.0, seen.append, "first")
    scheduler.call_at(1.0, seen.append, "second")
    handle = scheduler.call_at(1.5, seen.append, "cancelled", handle=True)
    assert handle is not None
    handle.cancel()
    scheduler.run_until(1.9)
    assert seen == ["first", "second"]
    assert scheduler.now == 1.9
    scheduler.run_until(5.0)
    assert seen == ["first", "second", "late"]


def test_bytes_arrive_after_latency_in_order_and_eof_last() -> None:
    scheduler, net, client, server = make()
    conn = net.connect(client, "server:80")
    scheduler.run_until(0.015)
    assert [k for k, *_ in server.log] == ["accept"]
    scheduler.run_until(0.025)
    assert [k for k, *_ in client.log] == ["connected"]
    for i in range(50):
        net.send(conn, client, b"%d," % i)
    net.close(conn, client)
    scheduler.run_until(1.0)
    assert data_of(server, conn.id) == b"".join(b"%d," % i for i in range(50))
    assert server.log[-1][0] == "eof"


def test_jitter_reorders_across_connections_never_within_one() -> None:
    link = LinkSpec(latency=0.001, jitter=0.05)
    scheduler, net, client, server = make(link, seed=3)
    conns = [net.connect(client, "server:80") for _ in range(8)]
    scheduler.run_until(1.0)
    arrivals: list[int] = []

    def record(conn: SimConn, data: bytes, now: float) -> None:
        arrivals.append(conn.id)
        server.log.append(("data", conn.id, data, now))

    server.on_data = record  # type: ignore[method-assign]
    for i in range(20):
        for conn in conns:
            net.send(conn, client, b"%03d" % i)
    scheduler.run_until(5.0)
    for conn in conns:
        assert data_of(server, conn.id) == b"".join(b"%03d" % i for i in range(20))
    # the writes went out round-robin; arrivals are not round-robin any more
    assert arrivals != [c.id for _ in range(20) for c in conns]


def test_bandwidth_limits_throughput() -> None:
    scheduler, net, client, server = make(LinkSpec(latency=0.0, jitter=0.0, bandwidth=1000.0))
    conn = net.connect(client, "server:80")
    scheduler.run_until(0.1)
    net.send(conn, client, b"x" * 500)
    net.send(conn, client, b"y" * 500)
    scheduler.run_until(0.59)  # 500 bytes at 1000 B/s take half a second
    assert data_of(server, conn.id) == b""
    scheduler.run_until(0.61)
    assert data_of(server, conn.id) == b"x" * 500
    scheduler.run_until(1.09)
    assert data_of(server, conn.id) == b"x" * 500
    scheduler.run_until(1.11)
    assert data_of(server, conn.id) == b"x" * 500 + b"y" * 500


def test_partition_holds_bytes_until_heal_and_blocks_new_connections() -> None:
    scheduler, net, client, server = make()
    conn = net.connect(client, "server:80")
    scheduler.run_until(0.1)
    net.partition([["client"], ["server"]])
    net.send(conn, client, b"held")
    late = net.connect(client, "server:80")
    scheduler.run_until(1.0)
    assert data_of(server, conn.id) == b""
    scheduler.run_until(5.0)
    assert ("failed", late.id) in [(k, c) for k, c, *_ in client.log]
    net.heal()
    scheduler.run_until(6.0)
    assert data_of(server, conn.id) == b"held"


def test_drop_loses_bytes_in_transit_and_both_ends_read_eof() -> None:
    scheduler, net, client, server = make()
    conn = net.connect(client, "server:80")
    scheduler.run_until(0.1)
    net.send(conn, client, b"lost")
    net.drop(conn)
    scheduler.run_until(1.0)
    assert data_of(server, conn.id) == b""
    assert ("eof", conn.id) in [(k, c) for k, c, *_ in server.log]
    assert ("eof", conn.id) in [(k, c) for k, c, *_ in client.log]
    assert conn.state is ConnState.CLOSED


def test_crash_resets_connections_and_refuses_new_ones() -> None:
    scheduler, net, client, server = make()
    conn = net.connect(client, "server:80")
    scheduler.run_until(0.1)
    net.crash_node(server)
    server.alive = False
    again = net.connect(client, "server:80")
    scheduler.run_until(1.0)
    kinds = [(k, c) for k, c, *_ in client.log]
    assert ("eof", conn.id) in kinds
    assert ("failed", again.id) in kinds


def test_crash_behind_a_partition_is_seen_when_it_heals() -> None:
    scheduler, net, client, server = make()
    conn = net.connect(client, "server:80")
    scheduler.run_until(0.1)
    net.partition([["client"], ["server"]])
    net.crash_node(server)
    server.alive = False
    scheduler.run_until(10.0)
    assert ("eof", conn.id) not in [(k, c) for k, c, *_ in client.log]
    net.heal()
    scheduler.run_until(11.0)
    assert ("eof", conn.id) in [(k, c) for k, c, *_ in client.log]


def test_overlapping_partitions_heal_separately_and_keep_each_pipe_fifo() -> None:
    # Regression: a second partition used to replace the first, and healing it released the
    # first one's held bytes after newer bytes that had gone straight through (reordering).
    scheduler, net, client, server = make()
    other = Recorder(None, "other")
    net.add_node(other)
    conn = net.connect(client, "server:80")
    scheduler.run_until(0.1)
    cut_client = net.partition([["client"], ["server", "other"]])
    net.send(conn, client, b"1")
    cut_other = net.partition([["other"], ["client", "server"]])
    net.send(conn, client, b"2")
    net.heal(cut_other)
    net.send(conn, client, b"3")
    scheduler.run_until(1.0)
    assert data_of(server, conn.id) == b""  # client is still cut off
    assert not net.reachable("client", "server") and net.reachable("other", "server")
    net.heal(cut_client)
    net.send(conn, client, b"4")
    scheduler.run_until(2.0)
    assert data_of(server, conn.id) == b"1234"


def test_segments_split_writes_but_keep_the_bytes_in_order() -> None:
    scheduler, net, client, server = make(LinkSpec(latency=0.01, jitter=0.0, segment=3))
    conn = net.connect(client, "server:80")
    scheduler.run_until(0.1)
    net.send(conn, client, b"abcdefgh")
    net.send(conn, client, b"ij")
    scheduler.run_until(1.0)
    pieces = [d for kind, cid, d, _ in server.log if kind == "data" and cid == conn.id]
    assert pieces == [b"abc", b"def", b"gh", b"ij"]

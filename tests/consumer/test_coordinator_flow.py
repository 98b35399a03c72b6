"""Backoff, reconnection, lookupd discovery and the connection handshake timeout."""

from __future__ import annotations

import itertools
import json
import random

from nsq_sansio.backoff import BackoffPhase
from nsq_sansio.config import Config
from nsq_sansio.consumer import (
    CloseConnection,
    Connect,
    ConsumerCoordinator,
    Disconnected,
    LookupdFailed,
    SendHTTPRequest,
)
from nsq_sansio.discovery import NSQDAddress

from .harness import World


def lookup_body(*addresses: NSQDAddress) -> bytes:
    return json.dumps(
        {
            "channels": [],
            "producers": [
                {"broadcast_address": a.host, "tcp_port": a.port, "http_port": 4151}
                for a in addresses
            ],
        }
    ).encode()


# --- backoff ---------------------------------------------------------------------------------


def test_backoff_rdy_zero_then_single_test_rdy_then_back_to_full() -> None:
    w = World(2, Config(max_in_flight=10, backoff_multiplier=1.0, max_backoff_duration=120.0))
    w.start()
    w.publish(0, 2)
    w.publish(1, 2)
    first, *rest = w.inbox
    w.inbox = rest
    c = w.coordinator
    c.requeue(first, w.now, delay=0.0)
    w.pump()
    assert c.backoff_phase is BackoffPhase.WAITING and c.backoff_level == 1
    assert w.rdy_by_conn() == {1: 0, 2: 0}
    for d in list(w.inbox):  # results inside the window do not count
        c.requeue(d, w.now, delay=0.0)
    w.inbox.clear()
    w.pump()
    assert c.backoff_level == 1
    w.advance(1.9)
    assert c.total_rdy == 0
    w.advance(0.1)  # window of 1 s * 2**1 is over: test the water
    assert c.backoff_phase is BackoffPhase.TESTING
    assert sorted(w.rdy_by_conn().values()) == [0, 1]
    assert len(w.inbox) == 1
    assert c.finish(w.inbox.pop(), w.now)  # success at level 1: back to level 0, full RDY
    w.pump()
    assert c.backoff_phase is BackoffPhase.NORMAL
    assert c.total_rdy == 10


def test_requeue_that_starts_backoff_writes_rdy_zero_before_the_req() -> None:
    # REQ first would let nsqd hand the requeued message (delay 0) straight back on this
    # connection, in flight for the whole backoff window.
    w = World(2, Config(max_in_flight=10, backoff_multiplier=1.0, max_backoff_duration=120.0))
    w.start()
    w.publish(0, 3)
    w.publish(1, 3)
    w.advance(1.0)  # the share node 0 gave up settles: node 1's RDY goes up, all 6 delivered
    c = w.coordinator
    assert len(w.inbox) == 6
    first = w.inbox.pop(0)
    w.sent.clear()
    w.rdy_sent.clear()
    c.requeue(first, w.now, delay=0.0)
    w.pump()
    assert c.backoff_phase is BackoffPhase.WAITING
    mine = [line for conn_id, line in w.sent if conn_id == first.conn_id]
    assert mine[:2] == [b"RDY 0", b"REQ " + first.message.id + b" 0"]
    assert w.rdy_by_conn() == {1: 0, 2: 0}
    assert {conn_id for conn_id, count in w.rdy_sent if count == 0} == {1, 2}
    # nsqd kept the message: nothing was delivered again during the window
    assert all(d.message.id != first.message.id for d in w.inbox)
    assert w.server_depth() == 1


def test_failures_raise_the_level_and_successes_lower_it() -> None:
    w = World(1, Config(max_in_flight=5, default_requeue_delay=0.0))
    w.start()
    w.publish(0, 20)
    c = w.coordinator
    for expected_level, wait in ((1, 2.0), (2, 4.0), (3, 8.0)):
        d = w.inbox.pop(0)
        c.requeue(d, w.now)
        w.pump()
        assert c.backoff_level == expected_level
        w.advance(wait - 0.01)
        assert c.backoff_phase is BackoffPhase.WAITING
        w.advance(0.01)
        assert c.backoff_phase is BackoffPhase.TESTING
    for level in (2, 1, 0):
        d = w.inbox.pop(0)
        c.finish(d, w.now)
        w.pump()
        assert c.backoff_level == level
        if level:
            w.advance(2.0**level)
    assert c.total_rdy == 5


def test_backoff_can_be_disabled_per_message_and_per_consumer() -> None:
    w = World(1, Config(max_in_flight=3))
    w.start()
    w.publish(0, 2)
    w.coordinator.requeue(w.inbox.pop(0), w.now, delay=0.0, backoff=False)
    w.pump()
    assert w.coordinator.backoff_phase is BackoffPhase.NORMAL
    w2 = World(1, Config(max_in_flight=3, backoff_enabled=False))
    w2.start()
    w2.publish(0, 2)
    w2.coordinator.requeue(w2.inbox.pop(0), w2.now, delay=0.0)
    w2.pump()
    assert w2.coordinator.backoff_phase is BackoffPhase.NORMAL
    assert w2.coordinator.total_rdy == 3


# --- direct mode reconnection ------------------------------------------------------------------


def test_direct_mode_reconnects_with_capped_exponential_backoff() -> None:
    config = Config(reconnect_delay=1.0, max_reconnect_delay=8.0, reconnect_jitter=0.0)
    w = World(1, config)
    w.start()
    w.kill(0)
    (lost,) = w.of_type(Disconnected)
    assert isinstance(lost, Disconnected) and lost.reconnect_at == w.now + 1.0
    attempts: list[float] = []
    for _ in range(6):
        before = len(w.of_type(Connect))
        deadline = w.coordinator.next_deadline()
        assert deadline is not None
        w.advance(deadline - w.now)
        assert len(w.of_type(Connect)) == before + 1
        attempts.append(w.now)
    gaps = [b - a for a, b in itertools.pairwise(attempts)]
    assert gaps == [2.0, 4.0, 8.0, 8.0, 8.0]
    w.revive(0)
    w.advance(8.0)
    assert len(w.coordinator.connection_ids()) == 1
    w.publish(0)
    assert len(w.inbox) == 1


def test_connection_that_never_subscribes_times_out_and_is_retried() -> None:
    c = ConsumerCoordinator(
        "t",
        "c",
        Config(connect_timeout=3.0, reconnect_jitter=0.0),
        rng=random.Random(0),
        nsqd=["n:4150"],
    )
    c.start(0.0)
    (connect,) = c.take_actions()
    assert isinstance(connect, Connect)
    c.connection_made(connect.conn_id, 0.1)
    assert c.pending_data()[0][1].startswith(b"  V2IDENTIFY")
    assert c.next_deadline() == 3.0
    c.handle_timer(3.0)
    actions = c.take_actions()
    assert isinstance(actions[0], CloseConnection)
    assert isinstance(actions[1], Disconnected) and actions[1].reconnect_at == 4.0


def test_garbage_from_nsqd_closes_that_connection_only() -> None:
    c = ConsumerCoordinator("t", "c", rng=random.Random(0), nsqd=["n:4150"])
    c.start(0.0)
    (connect,) = c.take_actions()
    assert isinstance(connect, Connect)
    c.connection_made(connect.conn_id, 0.0)
    c.receive_data(connect.conn_id, b"\x00\x00\x00\x08\x00\x00\x00\x07garbage!", 0.1)
    actions = c.take_actions()
    assert any(isinstance(a, CloseConnection) for a in actions)
    lost = [a for a in actions if isinstance(a, Disconnected)]
    assert lost and lost[0].error is not None
    assert c.connection_ids() == []
    c.receive_data(connect.conn_id, b"more", 0.2)  # late bytes for a dropped id: ignored


# --- lookupd mode ------------------------------------------------------------------------------


def answer(w: World, request: SendHTTPRequest, *addresses: NSQDAddress, raw: bool = True) -> None:
    body = lookup_body(*addresses)
    if raw:
        data = (b"HTTP/1.1 200 OK\r\nContent-Length: %d\r\n\r\n" % len(body)) + body
        w.coordinator.http_data(request.request_id, data, w.now)
    else:
        w.coordinator.http_response(request.request_id, 200, body, w.now)
    w.pump()


def test_lookupd_bootstrap_union_and_reconnect_only_when_rediscovered() -> None:
    config = Config(lookupd_poll_interval=60.0, lookupd_poll_jitter=0.3)
    w = World(3, config, direct=False, lookupd=["http://l1:4161", "l2:4161"])
    w.start()
    r1, r2 = sorted(w.http.values(), key=lambda r: r.request_id)
    assert r1.data.startswith(b"GET /lookup?topic=events HTTP/1.1")
    a0, a1, a2 = w.addresses
    answer(w, r1, a0, a1)
    answer(w, r2, a1, a2, raw=False)  # a1 reported twice: one connection
    assert len(w.coordinator.connection_ids()) == 3
    assert w.coordinator.known_nodes() == {a0, a1, a2}
    assert not w.http  # answered requests are closed
    w.kill(2)
    lost = [a for a in w.of_type(Disconnected) if isinstance(a, Disconnected)]
    assert lost[-1].reconnect_at is None  # lookupd mode: wait for a poll
    w.revive(2)
    w.advance(30.0)
    assert len(w.coordinator.connection_ids()) == 2
    w.advance(48.0)  # every lookupd polled again within interval * (1 + jitter)
    assert len(w.http) == 2
    for request in sorted(w.http.values(), key=lambda r: r.request_id):
        answer(w, request, a2)
    assert len(w.coordinator.connection_ids()) == 3


def test_failing_lookupd_is_reported_and_never_removes_nodes() -> None:
    config = Config(lookupd_poll_timeout=5.0, lookupd_poll_jitter=0.0)
    w = World(2, config, direct=False, lookupd=["l1:1", "l2:1"])
    w.start()
    r1, r2 = sorted(w.http.values(), key=lambda r: r.request_id)
    answer(w, r1, *w.addresses)
    w.coordinator.http_data(r2.request_id, b"HTTP/1.1 500 Oops\r\nContent-Length: 0\r\n\r\n", w.now)
    w.pump()
    failed = [a for a in w.of_type(LookupdFailed) if isinstance(a, LookupdFailed)]
    assert len(failed) == 1 and failed[0].error.status == 500
    assert len(w.coordinator.connection_ids()) == 2
    assert w.coordinator.known_nodes() == set(w.addresses)
    w.advance(60.0)  # next round: l1 says nothing at all, l2 answers garbage
    pending = sorted(w.http.values(), key=lambda r: r.request_id)
    assert len(pending) == 2
    w.coordinator.http_data(pending[1].request_id, b"\x00\xffnot http", w.now)
    w.advance(6.0)
    failed = [a for a in w.of_type(LookupdFailed) if isinstance(a, LookupdFailed)]
    assert len(failed) == 3
    assert len(w.coordinator.connection_ids()) == 2
    w.coordinator.http_failed(999, "no such request", w.now)  # unknown ids are ignored


def test_tls_upgrade_is_asked_of_the_transport_then_subscribes() -> None:
    from nsq_sansio.consumer import StartTLS
    from nsq_sansio.frames import encode_frame

    c = ConsumerCoordinator("t", "c", Config(tls_v1=True), rng=random.Random(0), nsqd=["n:4150"])
    c.start(0.0)
    (connect,) = c.take_actions()
    assert isinstance(connect, Connect)
    cid = connect.conn_id
    c.connection_made(cid, 0.0)
    c.pending_data()
    answer = b'{"max_rdy_count": 100, "tls_v1": true}'
    c.receive_data(cid, encode_frame(0, answer) + b"\x16\x03tls-bytes", 0.1)
    (start_tls,) = c.take_actions()
    assert start_tls == StartTLS(cid, b"\x16\x03tls-bytes")
    c.tls_established(cid, 0.2)
    c.receive_data(cid, encode_frame(0, b"OK"), 0.3)  # the OK read through TLS
    assert c.pending_data() == [(cid, b"SUB t c\n")]
    c.receive_data(cid, encode_frame(0, b"OK"), 0.4)
    assert c.pending_data() == [(cid, b"RDY 1\n")]
    c.receive_data(cid, encode_frame(0, b"_heartbeat_"), 5.0)
    assert c.pending_data() == [(cid, b"NOP\n")]

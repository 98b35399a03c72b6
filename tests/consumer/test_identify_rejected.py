"""A refused IDENTIFY fails the consumer once, for good (issue 12.4).

nsqd refuses an IDENTIFY whose values are outside its limits (``E_BAD_BODY IDENTIFY output
buffer timeout (10) is invalid``): the configuration is wrong, reconnecting cannot help. The
coordinator stops (state FAILED, one ConsumerFailed action carrying IdentifyRejected), closes
every connection, reconnects nothing and polls no lookupd any more.
"""

from __future__ import annotations

import json
import random

import pytest

from nsq_sansio.config import Config
from nsq_sansio.consumer import (
    CloseConnection,
    Connect,
    ConsumerFailed,
    ConsumerState,
    DrainComplete,
    FetchEnd,
    SendHTTPRequest,
    TakenBack,
)
from nsq_sansio.errors import ConfigError, IdentifyRejected
from nsq_sansio.server.nsqd import NSQD
from nsq_sansio.server.options import NSQDOptions

from .harness import CHANNEL, TOPIC, World

#: Each is valid for the client (Config) and outside a default nsqd's limits.
REFUSED = [
    ({"output_buffer_timeout": 0.01}, "IDENTIFY output buffer timeout (10) is invalid"),
    ({"heartbeat_interval": 120.0}, "IDENTIFY heartbeat interval (120000) is invalid"),
    ({"msg_timeout": 3600.0}, "IDENTIFY msg timeout (3600000) is invalid"),
    ({"output_buffer_size": 1 << 20}, "IDENTIFY output buffer size (1048576) is invalid"),
]


def failures(w: World) -> list[ConsumerFailed]:
    return [a for a in w.actions if isinstance(a, ConsumerFailed)]


@pytest.mark.parametrize(("setting", "text"), REFUSED)
def test_a_refused_identify_fails_the_consumer_once_and_reconnects_nothing(
    setting: dict[str, float], text: str
) -> None:
    w = World(2, Config(**setting))  # type: ignore[arg-type]
    w.start()
    c = w.coordinator
    (failed,) = failures(w)
    assert isinstance(failed.error, IdentifyRejected) and isinstance(failed.error, ConfigError)
    assert failed.error.code == "E_BAD_BODY" and failed.error.text == text
    assert text in str(failed.error)
    assert c.state is ConsumerState.FAILED and c.failure is failed.error
    assert c.connection_ids() == []
    closed = {a.conn_id for a in w.actions if isinstance(a, CloseConnection)}
    assert closed == {a.conn_id for a in w.actions if isinstance(a, Connect)}
    assert w.actions[-1] is failed  # the last word: nothing follows
    connects = len(w.of_type(Connect))
    assert c.next_deadline() is None  # no retry timer, nothing to wake up for
    w.advance(600.0)
    assert len(w.of_type(Connect)) == connects
    assert len(failures(w)) == 1


def test_lookupd_discovery_stops_too() -> None:
    w = World(2, Config(output_buffer_timeout=0.01), lookupd=["l1:4161"], direct=False)
    w.start()
    c = w.coordinator
    (request,) = w.http.values()
    producers = [{"broadcast_address": a.host, "tcp_port": a.port} for a in w.addresses]
    c.http_response(request.request_id, 200, json.dumps({"producers": producers}).encode(), w.now)
    w.pump()
    assert len(failures(w)) == 1 and c.state is ConsumerState.FAILED
    assert w.http == {}  # every lookupd exchange closed
    polls = len(w.of_type(SendHTTPRequest))
    w.advance(600.0)  # lookupd_poll_interval is 60 s: no poll, no connect
    assert len(w.of_type(SendHTTPRequest)) == polls
    assert c.connection_ids() == [] and c.next_deadline() is None


def test_one_refusing_node_fails_the_whole_consumer_and_requeues_what_was_in_flight() -> None:
    # Different limits per node (node 1 has a lower --max-heartbeat-interval): the first
    # refusal fails the consumer; the messages held from node 0 go back to nsqd at once.
    w = World(2, Config(max_in_flight=10, heartbeat_interval=50.0))
    w.kill(1)
    w.nodes[w.addresses[1]] = strict = NSQD(
        NSQDOptions(max_heartbeat_interval=30.0), random.Random(1), now=0.0
    )
    strict.create_topic(TOPIC, 0.0)
    strict.create_channel(TOPIC, CHANNEL, 0.0)
    w.start()
    w.publish(0, 3)
    held = list(w.inbox)
    assert len(held) == 3 and w.coordinator.state is ConsumerState.RUNNING
    w.revive(1)
    w.advance(5.0)  # node 1 comes back: its IDENTIFY is refused
    c = w.coordinator
    (failed,) = failures(w)
    assert "heartbeat interval (50000) is invalid" in str(failed.error)
    assert c.state is ConsumerState.FAILED and c.connection_ids() == []
    requeued = w.lines(b"REQ ")
    assert sorted(line.split()[1] for line in requeued) == sorted(d.id for d in held)
    assert w.server_depth() == 3 and w.server_in_flight() == 0  # back on node 0 at once
    # The user's late answers are reported, never raised.
    assert not c.finish(held[0], w.now)
    assert isinstance(c.take_actions()[-1], TakenBack)


def test_pull_fetches_are_answered_failed_and_drain_is_a_no_op() -> None:
    w = World(1, Config(output_buffer_timeout=0.01), pull=True)
    c = w.coordinator
    w.start()
    assert c.state is ConsumerState.FAILED
    request = c.fetch(5, w.now, expires=30.0)
    w.pump()
    (result,) = [r for r in w.results if r.request_id == request]
    assert result.reason is FetchEnd.FAILED and result.messages == ()
    c.drain(w.now)
    w.pump()
    assert c.state is ConsumerState.FAILED and not w.of_type(DrainComplete)


def test_a_waiting_fetch_is_answered_failed_when_the_consumer_fails() -> None:
    w = World(1, Config(output_buffer_timeout=0.01), pull=True, direct=False, lookupd=["l1:4161"])
    w.start()
    c = w.coordinator
    request = c.fetch(5, w.now, expires=30.0)  # waits: no nsqd known yet
    w.pump()
    assert not w.results
    (lookup,) = w.http.values()
    body = {"producers": [{"broadcast_address": w.addresses[0].host, "tcp_port": 4150}]}
    c.http_response(lookup.request_id, 200, json.dumps(body).encode(), w.now)
    w.pump()
    (result,) = w.results
    assert result.request_id == request and result.reason is FetchEnd.FAILED
    assert len(failures(w)) == 1

"""Drain (graceful shutdown) and pull mode (fetch)."""

from __future__ import annotations

import random

import pytest

from nsq_sansio.config import Config
from nsq_sansio.consumer import (
    CloseConnection,
    ConsumerCoordinator,
    ConsumerState,
    DrainComplete,
    FetchEnd,
    TakenBack,
)
from nsq_sansio.errors import LocalProtocolError

from .harness import TOPIC, World


def test_drain_requeues_unseen_waits_for_held_then_cls_and_close() -> None:
    w = World(2, Config(max_in_flight=10))
    w.start()
    w.publish(0, 3)
    w.publish(1, 3)
    held = w.inbox[:2]
    unseen = w.inbox[2:]
    w.inbox.clear()
    c = w.coordinator
    # The transport only handed two messages to user code; four still wait in its queue.
    c.drain(w.now, timeout=30.0, unseen=unseen)
    w.pump()
    assert c.state is ConsumerState.DRAINING
    assert c.total_rdy == 0
    req_lines = w.lines(b"REQ ")
    assert sorted(req_lines) == sorted(b"REQ " + d.id + b" 0" for d in unseen)
    assert not w.of_type(DrainComplete)
    for d in held:
        assert c.finish(d, w.now)
        w.pump()
    assert len(w.lines(b"CLS")) == 2
    assert w.of_type(DrainComplete)
    assert c.state is ConsumerState.CLOSED
    assert w.server_in_flight() == 0
    assert w.server_depth() == 4  # 6 published, 2 finished, 4 back for other consumers
    assert not w.wire  # every socket closed


def test_drain_deadline_requeues_what_the_user_still_holds() -> None:
    w = World(1, Config(max_in_flight=5))
    w.start()
    w.publish(0, 2)
    c = w.coordinator
    c.drain(w.now, timeout=10.0)
    w.pump()
    assert not w.lines(b"CLS")
    w.advance(9.9)
    assert not w.of_type(DrainComplete)
    w.advance(0.1)
    assert len(w.lines(b"REQ ")) == 2
    assert w.of_type(DrainComplete)
    assert w.server_in_flight() == 0 and w.server_depth() == 2
    assert not c.finish(w.inbox[0], w.now)  # too late: reported
    w.pump()
    assert w.of_type(TakenBack)


def test_messages_arriving_during_drain_go_back_at_once() -> None:
    w = World(1, Config(max_in_flight=5))
    w.start()
    w.publish(0, 1)
    c = w.coordinator
    c.drain(w.now)
    # Simulate a message that was already on the wire when RDY 0 left.
    link = c._links[1]
    from nsq_sansio.frames import encode_message_frame

    c.receive_data(1, encode_message_frame(b"f" * 16, 0, 1, b"late"), w.now)
    assert link.proto is not None
    assert b"REQ " + b"f" * 16 + b" 0\n" in link.proto.data_to_send()


def test_drain_before_start_and_twice() -> None:
    c = ConsumerCoordinator("t", "c", rng=random.Random(0), nsqd=["n:1"])
    c.drain(0.0)
    assert isinstance(c.take_actions()[0], DrainComplete)
    c.drain(1.0)
    assert c.take_actions() == []


def test_drain_server_that_never_answers_cls_is_cut_after_grace() -> None:
    w = World(1)
    w.start()
    c = w.coordinator
    c.drain(w.now, timeout=1.0)
    # Swallow CLS: disconnect the wire so CLOSE_WAIT never comes back.
    w.wire.clear()
    w.pump()
    w.advance(1.0 + 5.0)
    assert w.of_type(DrainComplete)
    assert w.of_type(CloseConnection)


# --- pull mode ---------------------------------------------------------------------------------


def test_fetch_rdy_follows_the_request_and_nsqd_never_pushes_more() -> None:
    w = World(1, Config(max_in_flight=100), pull=True)
    w.start()
    c = w.coordinator
    assert c.total_rdy == 0  # nothing asked yet
    w.publish(0, 20)
    rid = c.fetch(5, w.now, expires=10.0)
    w.pump()
    (result,) = w.results
    assert result.request_id == rid and result.reason is FetchEnd.FILLED
    assert len(result.messages) == 5
    assert w.server_in_flight() == 5  # exactly what was asked
    assert c.total_rdy == 0
    for d in result.messages:
        c.finish(d, w.now)
    w.pump()
    assert w.server_in_flight() == 0 and w.server_depth() == 15


def test_fetch_spread_over_connections_and_partial_expiry() -> None:
    w = World(2, Config(max_in_flight=100), pull=True)
    w.start()
    c = w.coordinator
    c.fetch(6, w.now, expires=5.0)
    w.pump()
    assert sorted(w.rdy_by_conn().values()) == [3, 3]
    w.publish(0, 2)
    assert not w.results
    w.advance(5.0)
    (result,) = w.results
    assert result.reason is FetchEnd.EXPIRED and len(result.messages) == 2
    assert c.total_rdy == 0


def test_no_wait_answers_at_once_possibly_empty() -> None:
    w = World(1, Config(max_in_flight=10), pull=True)
    w.start()
    c = w.coordinator
    c.fetch(3, w.now, no_wait=True)
    w.pump()
    assert w.results[-1].reason is FetchEnd.NO_MESSAGES and w.results[-1].messages == ()


def test_message_for_no_waiting_request_is_held_briefly_then_requeued() -> None:
    w = World(1, Config(max_in_flight=10, pull_hold_timeout=1.0), pull=True)
    w.start()
    c = w.coordinator
    from nsq_sansio.frames import encode_message_frame

    # A message already on the wire when the fetch ended (RDY lowered too late).
    c.fetch(2, w.now, expires=0.5)  # RDY 2, then RDY 0 when it expires
    w.pump()
    w.advance(0.5)
    c.receive_data(1, encode_message_frame(b"a" * 16, 0, 1, b"x"), w.now)
    c.receive_data(1, encode_message_frame(b"b" * 16, 0, 1, b"y"), w.now)
    c.fetch(1, w.now, no_wait=True)
    w.pump()
    assert w.results[-1].reason is FetchEnd.NO_WAIT
    assert [d.id for d in w.results[-1].messages] == [b"a" * 16]
    w.advance(1.0)
    assert b"REQ " + b"b" * 16 + b" 0" in w.lines(b"REQ ")


def test_waiting_requests_are_bounded() -> None:
    w = World(1, Config(max_in_flight=10, max_waiting_fetches=2), pull=True)
    w.start()
    c = w.coordinator
    c.fetch(1, w.now)
    c.fetch(1, w.now)
    c.fetch(1, w.now)
    w.pump()
    assert [r.reason for r in w.results] == [FetchEnd.TOO_MANY_WAITING]
    w.publish(0, 2)
    assert [r.reason for r in w.results][1:] == [FetchEnd.FILLED, FetchEnd.FILLED]


def test_fetch_misuse_and_drain_answers_waiting_requests() -> None:
    push = World(1)
    with pytest.raises(LocalProtocolError):
        push.coordinator.fetch(1, 0.0)
    w = World(1, Config(max_in_flight=10), pull=True)
    w.start()
    c = w.coordinator
    for bad in (0, -1, True):
        with pytest.raises(LocalProtocolError):
            c.fetch(bad, w.now)
    with pytest.raises(LocalProtocolError):
        c.fetch(1, w.now, expires=-1.0)
    c.fetch(4, w.now)
    w.publish(0, 1)
    c.drain(w.now)
    w.pump()
    assert w.results[-1].reason is FetchEnd.DRAINING
    assert len(w.results[-1].messages) == 1
    c.finish(w.results[-1].messages[0], w.now)
    w.pump()
    assert w.of_type(DrainComplete)
    c.fetch(1, w.now)
    w.pump()
    assert w.results[-1].reason is FetchEnd.DRAINING


def test_mark_delivered_makes_drain_requeue_the_unmarked_at_once() -> None:
    w = World(1, Config(max_in_flight=10))
    w.start()
    w.publish(0, 4)
    c = w.coordinator
    handed, queued = w.inbox[:1], w.inbox[1:]
    c.mark_delivered(handed[0])
    c.drain(w.now)
    w.pump()
    assert sorted(w.lines(b"REQ ")) == sorted(b"REQ " + d.id + b" 0" for d in queued)
    assert c.deadline(handed[0]) is not None  # still awaited
    assert c.finish(handed[0], w.now)
    w.pump()
    assert w.of_type(DrainComplete)
    assert w.server_depth() == 3 and w.server_in_flight() == 0


def test_pull_stuck_handler_does_not_hold_the_budget_forever() -> None:
    w = World(1, Config(max_in_flight=1), pull=True, node_options={"msg_timeout": 20.0})
    w.start()
    w.publish(0, 2)
    c = w.coordinator
    c.fetch(1, w.now)
    w.pump()
    assert len(w.results[-1].messages) == 1  # the user is stuck on it and never answers
    c.fetch(1, w.now)
    w.pump()
    assert len(w.results) == 1  # budget used: nothing more is asked of nsqd
    w.advance(21.0)  # nsqd took the stuck one back: the budget is free again
    assert len(w.results) == 2 and len(w.results[-1].messages) == 1
    assert c.total_rdy <= 1


# --- pull mode with several nsqd: the budget goes where the messages are (F15) -----------------


def _pull_world(seed: int, max_in_flight: int = 100) -> World:
    w = World(3, Config(max_in_flight=max_in_flight), seed=seed, pull=True)
    w.start()
    w.advance(1.0)
    return w


def _never_over(w: World) -> None:
    assert not w.over_budget  # the RDY sum nsqd sees never exceeds max_in_flight
    assert not w.coordinator._fetches.buffer  # nsqd never pushed more than was asked
    assert not w.lines(b"REQ ")  # so nothing had to be held and requeued


@pytest.mark.parametrize("seed", range(6))
def test_fetch_fills_at_once_when_all_messages_are_on_one_of_three_nsqd(seed: int) -> None:
    w = _pull_world(seed)
    c = w.coordinator
    w.publish(2, 50)
    t0 = w.now
    c.fetch(10, w.now)
    w.pump()
    w.advance(0.5)
    (result,) = w.results
    assert result.reason is FetchEnd.FILLED and len(result.messages) == 10
    # the others keep a probe of 1 each, and nothing more than the request asked was sent
    for d in result.messages:
        c.finish(d, w.now)
    w.pump()
    for _ in range(4):  # the other 40 in 4 more fetches of 10, no expiry waited for
        c.fetch(10, w.now, expires=5.0)
        w.pump()
        w.advance(0.01)
        assert w.results[-1].reason is FetchEnd.FILLED and len(w.results[-1].messages) == 10
        for d in w.results[-1].messages:
            c.finish(d, w.now)
        w.pump()
    assert w.now - t0 < 1.0
    assert w.server_depth() == 0 and w.server_in_flight() == 0
    assert sum(len(r.messages) for r in w.results) == 50
    _never_over(w)


def test_budget_moves_to_the_busy_node_and_idle_probes_still_find_new_messages() -> None:
    w = _pull_world(3)
    c = w.coordinator
    w.publish(0, 30)
    for batch in (12, 10):  # held by the user, not finished: they count in flight
        c.fetch(batch, w.now, expires=5.0)
        w.pump()
        assert w.results[-1].reason is FetchEnd.FILLED
    c.fetch(10, w.now, expires=5.0)
    w.pump()
    assert len(w.results) == 2  # node 0 had only 8 left: 2 still asked
    assert c._fetches.outstanding == 2
    live = {1: 30, 2: 0, 3: 0}
    allocs = {i: rdy - live[i] for i, rdy in w.rdy_by_conn().items() if rdy}
    assert sum(allocs.values()) <= 2  # never more than asked
    assert w.server_in_flight() == 30
    # messages that show up on an idle nsqd are found by its probe, then it gets the rest
    w.publish(1, 3)
    assert len(w.results) == 3
    last = w.results[-1]
    assert last.reason is FetchEnd.FILLED and len(last.messages) == 10
    assert w.server_depth() == 1 and w.server_in_flight() == 32  # only what was asked
    _never_over(w)


def test_fetch_one_at_a_time_follows_the_node_that_has_messages() -> None:
    w = _pull_world(5)
    c = w.coordinator
    w.publish(2, 50)
    empty = 0
    for _ in range(20):
        c.fetch(1, w.now, expires=1.0)
        w.pump()
        w.advance(0.01)
        result = w.results[-1]
        if not result.messages:
            empty += 1
        for d in result.messages:
            c.finish(d, w.now)
        w.pump()
        w.advance(1.0)
    assert empty == 0 and len(w.results) == 20
    _never_over(w)


@pytest.mark.parametrize("seed", range(4))
def test_fetch_one_finds_messages_that_show_up_on_an_idle_nsqd_within_a_second(seed: int) -> None:
    """fetch(1) with three nsqd: the single RDY sits on the nsqd that delivered last. When
    that one runs dry and messages show up on another, a waiting fetch used to wait for
    low_rdy_idle_timeout (10 s) plus the redistribution period (up to 5 s more) before the
    RDY moved; now the holder that delivers nothing while a fetch waits passes it on after
    twice its settle time."""
    w = _pull_world(seed)
    c = w.coordinator
    w.publish(0, 5)
    for i in range(5):  # node 0 delivers and stays the recent, active one
        c.fetch(1, w.now, expires=30.0)
        while len(w.results) == i:
            w.advance(0.05)
        (message,) = w.results[-1].messages
        c.finish(message, w.now)
        w.pump()
    for node in (1, 2, 0):
        w.publish(node, 1)
        answered = len(w.results)
        c.fetch(1, w.now, expires=5.0)
        t0 = w.now
        while len(w.results) == answered and w.now - t0 < 6.0:
            w.advance(0.05)
        result = w.results[-1]
        assert result.reason is FetchEnd.FILLED, (node, w.now - t0)
        assert w.now - t0 <= 1.6, (node, w.now - t0)  # at most two moves of 0.75 s
        (message,) = result.messages
        c.finish(message, w.now)
        w.pump()
    assert w.server_depth() == 0 and w.server_in_flight() == 0
    assert not w.over_budget


def test_a_fetch_asked_before_the_second_nsqd_joined_is_filled_within_a_second() -> None:
    """max_in_flight 200, fetch(200): only node 0 is up and takes the whole share, sends its
    100 and has nothing more; node 1 comes up with 100. Node 0 delivered a moment ago, so it
    counted as active and kept half of what was still asked at every rebalance while it had
    nothing to send: the share moved to node 1 by halves, one settle time (0.25 s) each,
    2.25 s in all (5 s per step on the anyio transport, whose timer missed the settle times).
    A connection that leaves RDY unused for a settle time after its last message is dry, not
    active: it keeps a probe and the rest goes to node 1 at once."""
    w = World(2, Config(max_in_flight=200), pull=True)
    w.kill(1)
    w.start()
    c = w.coordinator
    c.fetch(200, w.now, expires=10.0)
    w.publish(0, 100)
    w.nodes[w.addresses[1]].publish(TOPIC, b"x" * 100, w.now)  # queued before it is reachable
    for _ in range(99):
        w.nodes[w.addresses[1]].publish(TOPIC, b"x", w.now)
    w.revive(1)
    while len(c._rdy.subscribed()) < 2:  # reconnected after reconnect_delay
        w.advance(0.01)
    assert not w.results
    t0 = w.now
    while not w.results and w.now - t0 < 10.0:
        w.advance(0.01)
    (result,) = w.results
    assert result.reason is FetchEnd.FILLED and len(result.messages) == 200
    assert w.now - t0 <= 1.0, w.now - t0
    assert not w.over_budget

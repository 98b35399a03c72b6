"""Pull mode: a fetch the caller gives up on never swallows messages; no busy timers."""

from __future__ import annotations

from nsq_sansio.config import Config
from nsq_sansio.consumer import FetchEnd

from .harness import World


def test_cancelled_waiting_fetch_gives_its_messages_to_the_next_fetch() -> None:
    w = World(1, Config(max_in_flight=10, pull_hold_timeout=5.0), pull=True)
    w.start()
    c = w.coordinator
    first = c.fetch(5, w.now, expires=30.0)
    w.pump()
    w.publish(0, 3)  # three arrive for the waiting fetch, which still wants two more
    assert not w.results
    c.cancel_fetch(first, w.now)
    w.pump()
    assert not w.results  # a cancelled fetch is not answered
    c.fetch(5, w.now, no_wait=True)
    w.pump()
    (result,) = w.results
    assert result.reason is FetchEnd.NO_WAIT
    assert len({d.id for d in result.messages}) == 3
    for d in result.messages:
        assert c.finish(d, w.now)
    w.pump()
    assert w.server_in_flight() == 0 and w.server_depth() == 0


def test_cancelling_after_the_answer_was_queued_returns_its_messages() -> None:
    w = World(1, Config(max_in_flight=10, pull_hold_timeout=5.0), pull=True)
    w.start()
    c = w.coordinator
    w.publish(0, 2)  # no fetch yet: RDY 0, nothing pushed
    rid = c.fetch(2, w.now, expires=30.0)
    for _ in range(5):  # move bytes only: the FetchResult stays queued in take_actions()
        for conn_id, data in c.pending_data():
            w._to_server(conn_id, data)
        for address, node in w.nodes.items():
            for server_id in node.connections_with_output():
                conn = w._client_of(address, server_id)
                assert conn is not None
                c.receive_data(conn, node.data_to_send(server_id), w.now)
    assert any(getattr(a, "request_id", None) == rid for a in c._actions)  # queued answer
    c.cancel_fetch(rid, w.now)
    w.pump()
    assert all(r.request_id != rid for r in w.results)
    c.fetch(2, w.now, no_wait=True)
    w.pump()
    assert len({d.id for d in w.results[-1].messages}) == 2


def test_an_answer_the_caller_never_saw_goes_to_the_next_fetch_not_to_nsqd() -> None:
    """A fetch cancelled just as its answer reached the transport (the answer is out of
    take_actions already): give_back puts its messages at the front of the hold buffer, so
    the next fetch gets them as they were (attempt 1), with no REQ; while draining, they are
    requeued at once instead."""
    w = World(1, Config(max_in_flight=10, pull_hold_timeout=5.0), pull=True)
    w.start()
    c = w.coordinator
    c.fetch(2, w.now, expires=30.0)
    w.publish(0, 3)
    (unseen,) = w.results
    assert unseen.reason is FetchEnd.FILLED
    c.give_back(unseen.messages, w.now)
    w.pump()
    c.fetch(3, w.now, expires=30.0)
    w.pump()
    again = w.results[-1]
    assert again.reason is FetchEnd.FILLED
    assert [d.id for d in again.messages[:2]] == [d.id for d in unseen.messages]
    assert all(d.message.attempts == 1 for d in again.messages)
    assert not w.lines(b"REQ ")
    c.drain(w.now)  # the consumer drains; nobody saw those either
    w.pump()
    c.give_back(again.messages, w.now)
    w.pump()
    assert len(w.lines(b"REQ ")) == 3  # back to nsqd at once, not left to time out
    assert w.server_in_flight() == 0 and w.server_depth() == 3


def test_many_cancelled_fetches_do_not_use_up_the_waiting_bound() -> None:
    w = World(1, Config(max_in_flight=10, max_waiting_fetches=4), pull=True)
    w.start()
    c = w.coordinator
    for _ in range(20):
        c.cancel_fetch(c.fetch(1, w.now, expires=30.0), w.now)
    w.pump()
    rid = c.fetch(1, w.now, expires=30.0)
    w.publish(0, 1)
    (result,) = [r for r in w.results if r.request_id == rid]
    assert result.reason is FetchEnd.FILLED


def test_an_absurd_explicit_requeue_delay_is_clamped_not_swallowed() -> None:
    w = World(1, Config(max_in_flight=1))
    w.start()
    w.publish(0, 1)
    (delivery,) = w.inbox
    assert w.coordinator.requeue(delivery, w.now, delay=1e10)  # REQ sent, clamped
    w.pump()
    assert w.server_in_flight() == 0 and w.lines(b"REQ ")


def test_a_held_message_past_its_deadline_is_not_handed_out() -> None:
    # pull_hold_timeout longer than msg_timeout: the held copy times out on nsqd first.
    w = World(
        1,
        Config(max_in_flight=10, pull_hold_timeout=30.0, msg_timeout=2.0),
        pull=True,
        node_options={"msg_timeout": 2.0},
    )
    w.start()
    c = w.coordinator
    first = c.fetch(5, w.now, expires=60.0)
    w.pump()
    w.publish(0, 1)  # arrives for the waiting fetch...
    c.cancel_fetch(first, w.now)  # ...which is abandoned: the copy goes to the hold buffer
    w.pump()
    stale = c.fetch(5, w.now + 3.0, no_wait=True)  # 3 s later: past its 2 s deadline
    w.pump()
    (result,) = [r for r in w.results if r.request_id == stale]
    assert result.messages == ()


def test_no_stale_deadline_once_every_connection_is_gone() -> None:
    # Pull mode wakes up at the next deadline of a held message (the budget grows when it
    # passes). When the last connection goes while a message is held, that deadline must go
    # too: otherwise next_deadline() stays in the past and the transport spins on
    # handle_timer() until a connection comes back.
    w = World(1, Config(max_in_flight=10, msg_timeout=30.0), pull=True)
    w.start()
    c = w.coordinator
    c.fetch(3, w.now)  # waits (no expiry) for 3 messages
    w.publish(0, 1)  # one arrives and is held for it: its deadline is now + 30 s
    c.fetch(1, w.now)  # a second waiting fetch: the budget is recomputed with that message
    first = c.next_deadline()
    assert first is not None and first <= w.now + 30.0
    w.kill(0)  # the only nsqd goes away (and stays away)
    later = w.now + 31.0  # past the held message's deadline; both fetches still wait
    c.handle_timer(later)
    deadline = c.next_deadline()
    assert deadline is None or deadline > later, (deadline, later)

"""The core's decisions about time, to the tick, on the virtual clock of the in-memory world
(real nsqd roles): the backoff window and the RDY nsqd sees around it, a fetch's expiry and
``no_wait``, heartbeats answered while the user holds a message.

The integration tests in tests/clients (test_flow.py) run each of these once, short, on every
runtime to show it is wired; here the timing itself is what is checked, without sleeping.
"""

from __future__ import annotations

import pytest

from nsq_sansio.backoff import BackoffPhase
from nsq_sansio.config import Config
from nsq_sansio.consumer import Disconnected, FetchEnd

from .harness import World, server_ready_counts


class NopCountingWorld(World):
    """The world, counting the NOPs the coordinator writes (its answers to heartbeats)."""

    nops = 0

    def _to_server(self, conn_id: int, data: bytes, *, at_once: bool = False) -> None:
        self.nops += data.count(b"NOP\n")
        super()._to_server(conn_id, data, at_once=at_once)


def _ready(w: World) -> int:
    (count,) = server_ready_counts(w).values()
    return count


@pytest.mark.parametrize("held", [0, 5])
def test_backoff_window_holds_rdy_0_on_nsqd_then_tests_with_one_more_than_held(
    held: int,
) -> None:
    """A failure: RDY 0 on nsqd for the whole window (nothing is delivered though messages
    wait); at the window's end RDY = what the user still holds + 1, so exactly one message
    comes beside those; its success brings full RDY back."""
    w = World(
        1,
        Config(
            max_in_flight=10,
            backoff_multiplier=1.0,  # level 1: a 2 s window
            max_backoff_duration=2.0,
            default_requeue_delay=0.0,
        ),
    )
    c = w.coordinator
    w.start()
    w.publish(0, 1 + held, b"first")
    assert len(w.inbox) == 1 + held
    failing = w.inbox.pop(0)
    kept = list(w.inbox)
    w.inbox.clear()
    assert c.requeue(failing, w.now)  # the failure
    w.pump()
    assert c.backoff_phase is BackoffPhase.WAITING and c.backoff_level == 1
    assert _ready(w) == 0
    # During the window nothing is sent, though 11 messages wait on nsqd (the REQ went out
    # before RDY 0: nsqd may have sent the requeued one straight back, never more).
    w.publish(0, 10, b"later")
    w.advance(1.99)
    assert c.backoff_phase is BackoffPhase.WAITING and _ready(w) == 0
    assert len(w.inbox) <= 1
    assert w.server_in_flight() == held + len(w.inbox)
    assert w.server_in_flight() + w.server_depth() == held + 11
    came_early = len(w.inbox)
    w.advance(0.01)  # the window's end, to the tick
    assert c.backoff_phase is BackoffPhase.TESTING
    assert _ready(w) == held + 1
    assert len(w.inbox) == 1  # the one test message, beside the held ones
    assert w.server_in_flight() == held + 1
    w.advance(5.0)
    assert len(w.inbox) == 1 and w.server_in_flight() == held + 1  # still just that one
    test_message = w.inbox.pop(0)
    assert came_early or test_message.id == failing.id or test_message.body == b"later"
    assert c.finish(test_message, w.now)  # the test succeeds: back to normal, full RDY
    w.pump()
    assert c.backoff_phase is BackoffPhase.NORMAL and c.backoff_level == 0
    assert _ready(w) == 10
    for delivery in kept:
        assert c.finish(delivery, w.now)
    w.pump()
    w.finish_all()
    w.advance(1.0)
    w.finish_all()
    assert w.server_in_flight() == 0 and w.server_depth() == 0


def test_a_fetch_ends_at_its_expiry_with_what_came_and_no_wait_answers_at_once() -> None:
    w = World(1, Config(max_in_flight=100), pull=True)
    c = w.coordinator
    w.start()
    w.publish(0, 25)
    first = c.fetch(10, w.now, expires=5.0)
    w.pump()
    [result] = w.results
    assert result.request_id == first and len(result.messages) == 10
    assert w.server_in_flight() <= 10  # RDY follows the fetches: nsqd holds what was asked
    w.results.clear()
    for delivery in result.messages:
        assert c.finish(delivery, w.now)
    w.pump()
    started = w.now
    second = c.fetch(100, w.now, expires=0.5)  # only 15 left
    w.pump()
    w.advance(0.499)
    assert w.results == []  # not before its expiry, though all 15 are here
    w.advance(0.001)
    [result] = w.results
    assert result.request_id == second and result.reason is FetchEnd.EXPIRED
    assert len(result.messages) == 15 and w.now - started == pytest.approx(0.5)
    w.results.clear()
    for delivery in result.messages:
        assert c.finish(delivery, w.now)
    w.pump()
    third = c.fetch(5, w.now, no_wait=True)  # nothing buffered: answered at once, empty
    w.pump()
    [result] = w.results
    assert result.request_id == third and result.messages == ()
    assert w.server_in_flight() == 0 and w.server_depth() == 0


def test_heartbeats_are_answered_while_the_user_holds_a_message() -> None:
    """nsqd drops a client after two heartbeats without an answer; a message held for ten
    heartbeat intervals must not stop the core answering each one (NOP)."""
    w = NopCountingWorld(1, Config(heartbeat_interval=1.0, msg_timeout=60.0, max_in_flight=1))
    w.start()
    w.publish(0, 2)
    [held] = w.inbox
    nops = w.nops
    w.advance(10.0)
    assert w.nops - nops >= 9  # one per heartbeat
    assert not w.of_type(Disconnected)
    assert w.coordinator.finish(held, w.now)
    w.inbox.clear()
    w.pump()
    [following] = w.inbox
    assert following.attempts == 1  # the held one was never taken back, nor this one
    assert w.coordinator.finish(following, w.now)
    w.pump()
    assert w.server_in_flight() == 0 and w.server_depth() == 0

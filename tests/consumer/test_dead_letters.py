"""Dead letters in the coordinator: a given-up message is handed over (DeadLetter), FIN'd only
after the transport reports it published, requeued when the publish failed; push and pull."""

from __future__ import annotations

import pytest

from nsq_sansio.config import Config
from nsq_sansio.consumer import (
    ConsumerState,
    DeadLetter,
    Deliver,
    DrainComplete,
    GiveUp,
    TakenBack,
)
from nsq_sansio.errors import LocalProtocolError

from .harness import World


def _poison(w: World, max_attempts: int = 2) -> Deliver:
    """Publish one message and requeue it until the coordinator hands it over as a dead
    letter; returns that delivery."""
    w.publish(0, body=b"poison")
    for attempt in range(1, max_attempts + 1):
        if w.coordinator._pull:
            w.coordinator.fetch(1, w.now, expires=1.0)
            w.pump()
            (result,) = w.results
            w.results.clear()
            (d,) = result.messages
        else:
            (d,) = w.inbox
            w.inbox.clear()
        assert d.attempts == attempt
        assert w.coordinator.requeue(d, w.now, delay=0.0)
        w.pump()
    if w.coordinator._pull:
        w.coordinator.fetch(1, w.now, expires=1.0)
        w.pump()
    (dead,) = w.dead_letters
    w.dead_letters.clear()
    return dead


@pytest.mark.parametrize("pull", [False, True])
def test_given_up_message_is_handed_over_and_finished_only_after_the_publish(pull: bool) -> None:
    w = World(1, Config(max_attempts=2, backoff_enabled=False), pull=pull, dead_letter=True)
    w.start()
    dead = _poison(w)
    assert dead.attempts == 3 and dead.body == b"poison"
    assert not w.inbox and all(not r.messages for r in w.results)  # not the user's
    # Held, not answered: nsqd still has it in flight, and no FIN went out.
    assert w.lines(b"FIN ") == []
    assert w.server_in_flight() == 1
    assert not w.of_type(GiveUp)
    assert w.coordinator.dead_letters_pending == 1

    assert w.coordinator.dead_letter_published(dead, w.now, "orders.dead")
    w.pump()
    assert w.lines(b"FIN ") == [b"FIN " + dead.id]
    assert w.server_in_flight() == 0 and w.server_depth() == 0
    (give_up,) = w.of_type(GiveUp)
    assert isinstance(give_up, GiveUp)
    assert give_up.dead_letter_topic == "orders.dead" and give_up.message.attempts == 3
    stats = w.coordinator.stats
    assert (stats["given_up"], stats["dead_lettered"], stats["dead_letter_failures"]) == (1, 1, 0)
    assert w.coordinator.dead_letters_pending == 0


@pytest.mark.parametrize("pull", [False, True])
def test_failed_publish_requeues_and_the_message_comes_back(pull: bool) -> None:
    config = Config(max_attempts=2, backoff_enabled=False, default_requeue_delay=1.0)
    w = World(1, config, pull=pull, dead_letter=True)
    w.start()
    dead = _poison(w)
    assert w.coordinator.dead_letter_failed(dead, w.now)
    w.pump()
    assert w.lines(b"FIN ") == []
    assert w.lines(b"REQ ")[-1].startswith(b"REQ " + dead.id)
    assert w.server_in_flight() == 0 and w.server_depth() == 1  # deferred on nsqd: not lost
    w.advance(10.0)
    if pull:
        w.coordinator.fetch(1, w.now, expires=1.0)
        w.pump()
    (again,) = w.dead_letters
    assert again.id == dead.id and again.attempts == 4
    assert not w.of_type(GiveUp)
    assert w.coordinator.stats["dead_letter_failures"] == 1
    assert w.coordinator.stats["given_up"] == 0


def test_no_destination_gives_up_as_without_dead_letters() -> None:
    w = World(1, Config(max_attempts=1, backoff_enabled=False), dead_letter=True)
    w.start()
    dead = _poison(w, max_attempts=1)
    assert w.coordinator.dead_letter_published(dead, w.now, None)
    w.pump()
    (give_up,) = w.of_type(GiveUp)
    assert isinstance(give_up, GiveUp) and give_up.dead_letter_topic is None
    assert w.lines(b"FIN ") == [b"FIN " + dead.id]
    assert w.coordinator.stats["dead_lettered"] == 0
    assert w.coordinator.stats["given_up"] == 1


def test_without_dead_letters_the_coordinator_finishes_it_itself() -> None:
    w = World(1, Config(max_attempts=1, backoff_enabled=False))
    w.start()
    w.publish(0)
    (d,) = w.inbox
    w.inbox.clear()
    w.coordinator.requeue(d, w.now, delay=0.0)
    w.pump()
    assert not w.of_type(DeadLetter)
    assert len(w.of_type(GiveUp)) == 1 and w.lines(b"FIN ") == [b"FIN " + d.id]


def test_reporting_on_a_message_never_handed_over_or_twice_is_a_local_error() -> None:
    w = World(1, Config(max_attempts=1, backoff_enabled=False), dead_letter=True)
    w.start()
    w.publish(0)
    (d,) = w.inbox
    with pytest.raises(LocalProtocolError):
        w.coordinator.dead_letter_published(d, w.now, "dead")
    with pytest.raises(LocalProtocolError):
        w.coordinator.dead_letter_failed(d, w.now)
    w.inbox.clear()
    w.coordinator.requeue(d, w.now, delay=0.0)
    w.pump()
    (dead,) = w.dead_letters
    assert w.coordinator.dead_letter_published(dead, w.now, "dead")
    with pytest.raises(LocalProtocolError):
        w.coordinator.dead_letter_published(dead, w.now, "dead")
    with pytest.raises(LocalProtocolError):
        w.coordinator.dead_letter_failed(dead, w.now)


def test_connection_lost_during_the_publish_the_message_comes_back() -> None:
    config = Config(max_attempts=1, backoff_enabled=False, reconnect_delay=0.5)
    w = World(1, config, dead_letter=True, node_options={"msg_timeout": 5.0})
    w.start()
    dead = _poison(w, max_attempts=1)
    w.kill(0)
    w.revive(0)
    # The publish succeeded, but the FIN can no longer go: reported, not raised.
    assert not w.coordinator.dead_letter_published(dead, w.now, "dead")
    w.pump()
    assert not w.of_type(GiveUp)
    (taken,) = w.of_type(TakenBack)
    assert isinstance(taken, TakenBack) and taken.message_id == dead.id
    w.advance(30.0)  # reconnect; nsqd times the lost in-flight copy out and sends it again
    # Dead-lettered again (at least once), never lost: nothing reports on the new copies
    # here, so nsqd keeps timing them out and sending them again.
    assert w.dead_letters and {d.id for d in w.dead_letters} == {dead.id}
    assert w.server_in_flight() + w.server_depth() == 1


@pytest.mark.parametrize("explicit", [False, True])
def test_drain_waits_for_a_pending_dead_letter(explicit: bool) -> None:
    w = World(1, Config(max_attempts=1, backoff_enabled=False), dead_letter=True)
    w.start()
    if explicit:  # a transport that marks what it hands over: drain requeues the unmarked
        w.publish(0, body=b"first")
        (first,) = w.inbox
        w.coordinator.mark_delivered(first)
        w.inbox.clear()
        assert w.coordinator.finish(first, w.now)
        w.pump()
    dead = _poison(w, max_attempts=1)
    requeues = len(w.lines(b"REQ "))
    w.coordinator.drain(w.now, timeout=30.0)
    w.pump()
    w.advance(1.0)
    assert w.lines(b"CLS") == [] and len(w.lines(b"REQ ")) == requeues
    assert w.coordinator.state is ConsumerState.DRAINING
    assert w.coordinator.dead_letter_published(dead, w.now, "dead")
    w.pump()
    w.advance(10.0)
    assert w.lines(b"FIN ")[-1] == b"FIN " + dead.id
    assert w.of_type(DrainComplete)


def test_a_late_report_on_a_copy_nsqd_sent_again_is_a_taken_back_not_an_error() -> None:
    w = World(
        1,
        Config(max_attempts=1, backoff_enabled=False),
        dead_letter=True,
        node_options={"msg_timeout": 5.0},
    )
    w.start()
    old = _poison(w, max_attempts=1)
    w.advance(6.0)  # the publish is slow: nsqd times the message out and sends it again
    (new,) = w.dead_letters
    assert new.id == old.id and new is not old
    assert w.coordinator.dead_letters_pending == 2
    assert not w.coordinator.dead_letter_published(old, w.now, "dead")  # stale: reported
    assert w.coordinator.dead_letter_published(new, w.now, "dead")
    w.pump()
    assert w.lines(b"FIN ") == [b"FIN " + new.id]
    assert w.coordinator.dead_letters_pending == 0

"""Message policy: attempts, REQ delays, late answers, deadlines and TOUCH."""

from __future__ import annotations

import pytest

from nsq_sansio.backoff import BackoffPhase
from nsq_sansio.config import Config
from nsq_sansio.consumer import GiveUp, MessageGone, TakenBack
from nsq_sansio.errors import LocalProtocolError, ServerError

from .harness import World


def test_message_over_max_attempts_is_finished_and_given_up() -> None:
    w = World(1, Config(max_attempts=2, backoff_enabled=False))
    w.start()
    w.publish(0)
    for attempt in (1, 2):
        (d,) = w.inbox
        assert d.attempts == attempt
        w.inbox.clear()
        assert w.coordinator.requeue(d, w.now, delay=0.0)
        w.pump()
    assert not w.inbox
    (give_up,) = w.of_type(GiveUp)
    assert isinstance(give_up, GiveUp) and give_up.message.attempts == 3
    assert w.lines(b"FIN ") == [b"FIN " + give_up.message.id]
    assert w.server_in_flight() == 0 and w.server_depth() == 0
    assert w.coordinator.stats["given_up"] == 1


@pytest.mark.parametrize("pull", [False, True], ids=["push", "pull"])
def test_a_failing_message_gets_exactly_max_attempts_deliveries_with_backoff_on(
    pull: bool,
) -> None:
    # The default path when a handler fails: REQ with backoff, so every later read comes in
    # while the consumer backs off, where each delivery is checked one by one (the give-up
    # rule, not the hot path's inlined test; pull mode has its own fast path). max_attempts
    # 3: the user sees attempts 1, 2 and 3, and the 4th is given up without reaching the user.
    config = Config(max_attempts=3, backoff_multiplier=0.1, default_requeue_delay=0.0)
    assert config.backoff_active
    w = World(1, config, pull=pull)
    w.start()
    w.publish(0)
    seen = []
    for _ in range(20):
        if pull:
            w.coordinator.fetch(1, w.now, expires=1.0)
            w.pump()
            w.advance(0.01)
            w.inbox.extend(d for result in w.results for d in result.messages)
            w.results.clear()
        if w.inbox:
            (d,) = w.inbox
            w.inbox.clear()
            seen.append(d.attempts)
            assert w.coordinator.requeue(d, w.now)  # backoff=True: a failure
            w.pump()
            assert w.coordinator.backoff_phase is not BackoffPhase.NORMAL
        if w.of_type(GiveUp):
            break
        w.advance(0.5)  # through the backoff window and its test
    assert seen == [1, 2, 3]
    (give_up,) = w.of_type(GiveUp)
    assert isinstance(give_up, GiveUp) and give_up.message.attempts == 4
    assert w.server_in_flight() == 0 and w.server_depth() == 0


def test_zero_max_attempts_means_unlimited() -> None:
    w = World(1, Config(max_attempts=0, backoff_enabled=False))
    w.start()
    w.publish(0)
    for _ in range(8):
        (d,) = w.inbox
        w.inbox.clear()
        w.coordinator.requeue(d, w.now, delay=0.0)
        w.pump()
    assert w.inbox[0].attempts == 9
    assert not w.of_type(GiveUp)


def test_requeue_delay_grows_with_attempts_and_is_capped() -> None:
    w = World(1, Config(default_requeue_delay=90.0, max_requeue_delay=200.0, backoff_enabled=False))
    c = w.coordinator
    assert [c.requeue_delay(a) for a in (1, 2, 3, 10)] == [90.0, 180.0, 200.0, 200.0]
    w.start()
    w.publish(0)
    (d,) = w.inbox
    c.requeue(d, w.now)
    w.pump()
    assert w.lines(b"REQ ") == [b"REQ " + d.id + b" 90000"]
    assert w.server_depth() == 1  # deferred on the server, nothing lost


def test_server_max_req_timeout_caps_the_delay_when_known() -> None:
    w = World(1, Config(max_requeue_delay=900.0, backoff_enabled=False))
    w.start()
    link = w.coordinator._links[1]
    link.max_req_timeout = 30.0  # as if nsqd announced max_req_timeout in IDENTIFY
    assert w.coordinator.requeue_delay(5, 1) == 30.0
    w.publish(0)
    (d,) = w.inbox
    w.coordinator.requeue(d, w.now, delay=100.0)
    w.pump()
    assert w.lines(b"REQ ") == [b"REQ " + d.id + b" 30000"]


def test_bad_requeue_delay_is_a_local_error_before_anything_is_sent() -> None:
    w = World(1)
    w.start()
    w.publish(0)
    (d,) = w.inbox
    for bad in (-1.0, float("nan"), float("inf")):
        with pytest.raises(LocalProtocolError):
            w.coordinator.requeue(d, w.now, delay=bad)
    assert w.coordinator.finish(d, w.now)  # still answerable


def test_deadline_touch_and_max_deadline() -> None:
    w = World(1, node_options={"msg_timeout": 60.0, "max_msg_timeout": 100.0})
    w.start()
    w.now = 10.0
    w.publish(0)
    (d,) = w.inbox
    c = w.coordinator
    assert d.deadline == 70.0 and c.deadline(d) == 70.0
    assert c.max_deadline(d) == 110.0
    w.now = 40.0
    assert c.touch(d, w.now) == 100.0
    w.now = 90.0
    assert c.touch(d, w.now) == 110.0  # capped by max_msg_timeout
    w.pump()
    assert len(w.lines(b"TOUCH")) == 2
    assert c.finish(d, w.now)
    assert c.deadline(d) is None and c.touch(d, w.now) is None


def test_late_fin_after_server_timeout_is_reported_not_raised() -> None:
    w = World(1, Config(max_in_flight=1), node_options={"msg_timeout": 60.0})
    w.start()
    w.publish(0)
    (d,) = w.inbox
    w.coordinator.set_max_in_flight(0, w.now)  # so nsqd cannot hand it back to us at once
    w.advance(70.0)  # nsqd times the message out and requeues it
    assert w.coordinator.finish(d, w.now)  # we still believed it ours: FIN goes out
    w.pump()
    taken = [a for a in w.of_type(TakenBack) if isinstance(a, TakenBack)]
    assert len(taken) == 1
    assert taken[0].command == "FIN" and isinstance(taken[0].error, ServerError)
    assert taken[0].error.code == "E_FIN_FAILED" and taken[0].message_id == d.id
    assert len(w.coordinator.connection_ids()) == 1  # not fatal
    assert w.server_depth() == 1


def test_redelivery_of_a_held_message_makes_the_old_handle_stale() -> None:
    w = World(1, Config(max_in_flight=2), node_options={"msg_timeout": 60.0})
    w.start()
    w.publish(0)
    (old,) = w.inbox
    w.advance(61.0)  # timed out on nsqd and sent to us again (RDY allows it)
    assert len(w.inbox) == 2 and w.inbox[1].id == old.id
    assert not w.coordinator.finish(old, w.now)  # stale: reported, nothing sent
    w.pump()
    gone = [a for a in w.of_type(TakenBack) if isinstance(a, TakenBack)]
    assert [g.command for g in gone] == ["TIMEOUT", "FIN"]
    assert isinstance(gone[1].error, MessageGone)
    assert w.coordinator.finish(w.inbox[1], w.now)
    w.pump()
    assert w.server_in_flight() == 0 and w.server_depth() == 0


def test_answers_after_the_connection_died_are_reported() -> None:
    w = World(1)
    w.start()
    w.publish(0)
    (d,) = w.inbox
    w.kill(0)
    assert not w.coordinator.finish(d, w.now)
    assert not w.coordinator.requeue(d, w.now)
    assert w.coordinator.touch(d, w.now) is None
    w.pump()
    gone = [a for a in w.of_type(TakenBack) if isinstance(a, TakenBack)]
    assert [g.command for g in gone] == ["FIN", "REQ", "TOUCH"]


def test_next_touch_helps_long_jobs_until_max_msg_timeout() -> None:
    w = World(1, node_options={"msg_timeout": 60.0, "max_msg_timeout": 100.0})
    w.start()
    w.publish(0)
    (d,) = w.inbox
    c = w.coordinator
    assert c.next_touch(d) == 30.0  # half-way to the 60 s deadline
    w.advance(30.0)
    assert c.touch(d, w.now) == 90.0
    assert c.next_touch(d) == 60.0
    w.advance(30.0)
    assert c.touch(d, w.now) == 100.0  # max_msg_timeout reached
    assert c.next_touch(d) is None
    w.advance(30.0)
    assert not w.of_type(TakenBack)  # TOUCHes kept it: nsqd never took it back
    assert c.finish(d, w.now)
    assert c.next_touch(d) is None


def test_consumer_needs_heartbeats() -> None:
    import random

    from nsq_sansio.consumer import ConsumerCoordinator
    from nsq_sansio.errors import ConfigError

    with pytest.raises(ConfigError, match="heartbeat_interval"):
        ConsumerCoordinator(
            "t", "c", Config(heartbeat_interval=None), rng=random.Random(0), nsqd=["a:1"]
        )


def test_taken_back_names_the_copy_it_is_about() -> None:
    # Issue 12.3: nsqd re-sends a timed-out message with the same id; a report must say which
    # copy it is about, or a transport marks the newer copy (still ours) as taken back too.
    w = World(1, Config(max_in_flight=3), node_options={"msg_timeout": 60.0})
    w.start()
    w.publish(0)
    (first,) = w.inbox
    w.advance(61.0)
    w.advance(61.0)
    first_, second, latest = w.inbox
    assert first_ is first and first.id == second.id == latest.id and latest.attempts == 3
    assert not w.coordinator.finish(first, w.now)
    assert not w.coordinator.requeue(second, w.now)
    w.pump()
    gone = [a for a in w.of_type(TakenBack) if isinstance(a, TakenBack)]
    assert [(g.command, g.delivery) for g in gone] == [
        ("TIMEOUT", first),
        ("TIMEOUT", second),
        ("FIN", first),
        ("REQ", second),
    ]
    assert w.coordinator.finish(latest, w.now)
    w.pump()
    assert w.server_in_flight() == 0 and w.server_depth() == 0


def test_refused_touch_names_the_held_copy_refused_fin_names_none() -> None:
    # Bytes take 0.5 s each way: nsqd's deadline (from its send) comes 0.5 s before ours (from
    # our read), and a TOUCH sent in between is refused by nsqd.
    w = World(1, Config(max_in_flight=1), node_options={"msg_timeout": 60.0}, latency=0.5)
    w.start()
    w.advance(5.0)  # the handshake and RDY, 0.5 s each way
    w.publish(0)
    w.advance(0.5)
    (d,) = w.inbox
    w.coordinator.set_max_in_flight(0, w.now)  # so nsqd cannot hand it back to us at once
    w.advance(d.deadline - 0.3 - w.now)  # nsqd timed it out; our deadline is still ahead
    assert d.deadline > w.now
    assert w.coordinator.touch(d, w.now) is not None
    w.pump()
    w.advance(1.5)  # E_TOUCH_FAILED comes back: no longer counted as held
    assert w.coordinator.deadline(d) is not None and w.coordinator.deadline(d) <= w.now
    assert w.coordinator.finish(d, w.now)
    w.pump()
    w.advance(1.5)
    taken = [a for a in w.of_type(TakenBack) if isinstance(a, TakenBack)]
    assert [(t.command, t.delivery) for t in taken] == [("TOUCH", d), ("FIN", None)]
    assert all(isinstance(t.error, ServerError) for t in taken)


def test_touch_after_the_deadline_sends_nothing_and_reports_the_message_gone() -> None:
    # nsqd's deadline (from its send) is never after ours (from our read): past ours, nsqd has
    # taken the message back, and a TOUCH could only fail. Believing it touched would count a
    # message nsqd no longer holds against max_in_flight.
    w = World(1, Config(max_in_flight=1), node_options={"msg_timeout": 60.0})
    w.start()
    w.publish(0)
    (d,) = w.inbox
    w.coordinator.set_max_in_flight(0, w.now)
    w.advance(70.0)
    assert w.coordinator.touch(d, w.now) is None
    w.pump()
    assert not w.lines(b"TOUCH")
    (taken,) = w.of_type(TakenBack)
    assert isinstance(taken, TakenBack) and taken.command == "TOUCH" and taken.delivery is d
    assert isinstance(taken.error, MessageGone)


def test_a_message_sent_into_a_slot_nsqd_freed_by_its_timeout_is_taken_not_handed_back() -> None:
    # Bytes take up to 0.5 s each way, and may come sooner. nsqd times the held m0 out 0.5 s
    # before our deadline (its clock runs from its send) and fills the slot with m1, which may
    # arrive before our deadline for m0: nsqd was allowed to send it, so it is taken. Counting
    # m0 as still in flight handed m1 back (REQ 0), nsqd sent it again at once, and so on,
    # for as long as the bytes came back before our deadline.
    w = World(1, Config(max_in_flight=1), node_options={"msg_timeout": 60.0}, latency=0.5)
    w.start()
    w.advance(5.0)  # the handshake and RDY, 0.5 s each way
    w.publish(0)
    w.advance(0.5)
    (m0,) = w.inbox
    w.publish(0)  # m1 waits on nsqd: its one RDY is taken by m0
    w.advance(m0.deadline - 0.5 - w.now + 0.01)  # nsqd timed m0 out and sent m1
    conn_id = m0.conn_id
    for _ in range(10):  # the bytes come early, both ways, as fast as they can
        for direction in (1, 0):
            w.deliver((conn_id, direction))
    assert w.now < m0.deadline
    assert not w.lines(b"REQ")
    assert len(w.inbox) == 2 and w.inbox[1].id != m0.id

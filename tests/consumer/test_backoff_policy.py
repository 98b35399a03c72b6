"""Backoff as the coordinator applies it: poison messages, give-ups, the test phase, reports.

Against the in-memory world (real nsqd roles, a virtual clock), so what nsqd does with RDY
(it sends while a connection holds fewer messages than its RDY) is part of what is checked.
"""

from __future__ import annotations

from nsq_sansio.backoff import BackoffPhase
from nsq_sansio.config import Config
from nsq_sansio.consumer import BackoffChanged, Deliver, GiveUp

from .harness import World


def _changes(w: World) -> list[tuple[str, int, float, int]]:
    return [
        (a.phase.value, a.level, a.window, a.failures)
        for a in w.actions
        if isinstance(a, BackoffChanged)
    ]


def _drain_poison(w: World, total: int, limit: float) -> tuple[int, int]:
    """Answer like a handler (bodies starting with ``poison`` fail, REQ with backoff; the
    others are FIN'd), moving the clock to the next deadline whenever nothing is to be
    answered, until ``total`` messages were finished or given up (or ``limit`` seconds of
    virtual time passed). Returns (finished, given up)."""
    c = w.coordinator
    finished = 0
    while w.now < limit:
        while w.inbox:
            d = w.inbox.pop(0)
            if d.body.startswith(b"poison"):
                assert c.requeue(d, w.now)
            else:
                assert c.finish(d, w.now)
                finished += 1
            w.pump()
        given_up = len(w.of_type(GiveUp))
        if finished + given_up == total:
            return finished, given_up
        deadline = c.next_deadline()
        step = 1.0 if deadline is None else max(deadline - w.now, 0.001)
        w.advance(min(step, 1.0))
    return finished, len(w.of_type(GiveUp))


def test_a_trickle_of_poison_messages_never_holds_the_consumer_in_long_windows() -> None:
    # 100 messages, every 20th always fails; max_in_flight 1 and max_attempts 5 (the
    # defaults), REQ without delay. Each poison message raises the level once (its first
    # failure); its retries keep the consumer at level 1 (2 s windows), its give-up is a
    # success. Before: retries raised the level to 7 (120 s windows) and give-ups opened
    # more windows at that level: over 300 s of virtual time.
    w = World(1, Config(default_requeue_delay=0.0))
    w.start()
    for i in range(100):
        w.publish(0, 1, b"poison-%d" % i if i % 20 == 0 else b"ok-%d" % i)
    finished, given_up = _drain_poison(w, 100, limit=1000.0)
    assert (finished, given_up) == (95, 5)
    windows = [window for phase, _, window, _ in _changes(w) if phase == "waiting"]
    assert windows and max(windows) == 2.0
    assert w.now < 60.0, w.now
    assert w.coordinator.backoff_phase is BackoffPhase.NORMAL
    assert w.server_in_flight() == 0 and w.server_depth() == 0


def test_a_give_up_is_a_success_for_backoff() -> None:
    w = World(1, Config(max_attempts=2, default_requeue_delay=0.0))
    w.start()
    w.publish(0, 1, b"poison")
    c = w.coordinator
    (first,) = w.inbox
    w.inbox.clear()
    c.requeue(first, w.now)  # attempt 1 fails: level 1, a 2 s window
    w.pump()
    w.advance(2.0)
    (second,) = w.inbox
    w.inbox.clear()
    assert second.attempts == 2 and c.backoff_phase is BackoffPhase.TESTING
    c.requeue(second, w.now)  # fails again: another window, the level stays 1
    w.pump()
    assert c.backoff_phase is BackoffPhase.WAITING and c.backoff_level == 1
    w.advance(2.0)  # the third delivery is over max_attempts: given up (FIN'd), a success
    assert len(w.of_type(GiveUp)) == 1 and not w.inbox
    assert c.backoff_phase is BackoffPhase.NORMAL and c.backoff_level == 0
    assert c.total_rdy == 1
    assert _changes(w) == [
        ("waiting", 1, 2.0, 1),
        ("testing", 1, 0.0, 1),
        ("waiting", 1, 2.0, 2),
        ("testing", 1, 0.0, 2),
        ("normal", 0, 0.0, 0),
    ]
    assert c.backoff_windows == 2


def test_the_test_message_comes_while_other_handlers_still_run() -> None:
    # max_in_flight 4, three long jobs running when the fourth fails. nsqd sends on a
    # connection while it holds fewer messages than its RDY: RDY 1 would let no test message
    # in until all three jobs ended. The test lets one message in beside them.
    w = World(1, Config(max_in_flight=4, default_requeue_delay=0.0))
    w.start()
    w.publish(0, 10)
    w.advance(0.5)
    c = w.coordinator
    assert len(w.inbox) == 4
    failed, *running = w.inbox
    w.inbox = list(running)
    c.requeue(failed, w.now)
    w.pump()
    assert c.backoff_phase is BackoffPhase.WAITING and w.rdy_by_conn() == {1: 0}
    w.advance(2.0)
    assert c.backoff_phase is BackoffPhase.TESTING
    assert w.rdy_by_conn() == {1: 4}
    assert len(w.inbox) == 4 and w.inbox[:3] == running  # the three, and one test message
    assert w.server_in_flight() == 4


def test_successes_while_testing_let_more_in_without_another_window() -> None:
    w = World(1, Config(max_in_flight=8, default_requeue_delay=0.0))
    w.start()
    w.publish(0, 30)
    w.advance(0.5)
    c = w.coordinator
    for wait in (2.0, 4.0):  # two first failures: level 2
        c.requeue(w.inbox.pop(0), w.now)
        w.pump()
        for d in w.inbox:  # failures during the window: never raise the level
            c.requeue(d, w.now)
        w.inbox.clear()
        w.pump()
        w.advance(wait)
    assert c.backoff_phase is BackoffPhase.TESTING and c.backoff_level == 2
    assert len(w.inbox) == 1
    c.finish(w.inbox.pop(), w.now)  # level 1: no window, two more messages at once
    w.pump()
    assert c.backoff_phase is BackoffPhase.TESTING and c.backoff_level == 1
    assert len(w.inbox) == 2
    c.finish(w.inbox.pop(), w.now)  # level 0: normal, full RDY
    w.pump()
    assert c.backoff_phase is BackoffPhase.NORMAL and c.total_rdy == 8
    assert [phase for phase, *_ in _changes(w)][-4:] == ["waiting", "testing", "testing", "normal"]


def test_a_requeue_without_backoff_while_testing_waits_again_at_the_same_level() -> None:
    w = World(1, Config(max_in_flight=2, default_requeue_delay=0.0))
    w.start()
    w.publish(0, 5)
    c = w.coordinator
    c.requeue(w.inbox.pop(0), w.now)
    w.pump()
    for d in w.inbox:
        c.finish(d, w.now)
    w.inbox.clear()
    w.advance(2.0)
    (test,) = w.inbox
    w.inbox.clear()
    c.requeue(test, w.now, backoff=False)  # nothing learned: another window, same level
    w.pump()
    assert c.backoff_phase is BackoffPhase.WAITING and c.backoff_level == 1
    assert _changes(w)[-1] == ("waiting", 1, 2.0, 1)


def test_successes_during_a_window_that_outnumber_its_failures_end_it() -> None:
    # One poison message among handlers that succeed: the window the failure opened ends as
    # soon as successes outnumber it (the level back at 0), RDY comes back at once.
    w = World(1, Config(max_in_flight=4, default_requeue_delay=0.0))
    w.start()
    w.publish(0, 10)
    w.advance(0.5)
    c = w.coordinator
    failed, *others = w.inbox
    w.inbox.clear()
    c.requeue(failed, w.now)
    w.pump()
    assert c.backoff_phase is BackoffPhase.WAITING and w.rdy_by_conn() == {1: 0}
    c.finish(others[0], w.now)  # one each: not outnumbered yet
    w.pump()
    assert c.backoff_phase is BackoffPhase.WAITING
    c.finish(others[1], w.now)
    w.pump()
    assert c.backoff_phase is BackoffPhase.NORMAL and w.rdy_by_conn() == {1: 4}
    assert _changes(w) == [("waiting", 1, 2.0, 1), ("normal", 0, 0.0, 0)]


def test_a_window_holds_while_its_failures_outnumber_its_successes() -> None:
    w = World(1, Config(max_in_flight=4, default_requeue_delay=0.0))
    w.start()
    w.publish(0, 10)
    w.advance(0.5)
    c = w.coordinator
    first, second, third, fourth = w.inbox
    w.inbox.clear()
    c.requeue(first, w.now)  # opens the window
    c.requeue(second, w.now)  # in flight, failed too: never raises the level
    c.finish(third, w.now)  # 2 failures, 1 success: the window holds
    w.pump()
    assert c.backoff_phase is BackoffPhase.WAITING and c.backoff_level == 1
    c.finish(fourth, w.now)  # 2 and 2: still not outnumbered
    w.pump()
    assert c.backoff_phase is BackoffPhase.WAITING and w.rdy_by_conn() == {1: 0}
    w.advance(2.0)
    assert c.backoff_phase is BackoffPhase.TESTING


def test_the_worked_timeline_of_the_docs() -> None:
    # docs/transports.md, "Backoff": default settings, max_in_flight 4, jobs of 12 s.
    w = World(1, Config(max_in_flight=4))
    w.start()
    for i in range(1, 21):
        w.publish(0, 1, b"m%d" % i)
    c = w.coordinator

    def take(body: bytes) -> Deliver:
        (d,) = [d for d in w.inbox if d.body == body]
        w.inbox.remove(d)
        return d

    def started() -> list[bytes]:
        return [d.body for d in w.inbox]

    def answer(d: Deliver, ok: bool) -> None:
        assert c.finish(d, w.now) if ok else c.requeue(d, w.now)
        w.pump()

    assert started() == [b"m1", b"m2", b"m3", b"m4"]
    m1 = take(b"m1")
    answer(m1, ok=False)  # t=0: a first failure
    assert (c.backoff_phase, c.backoff_level, w.rdy_by_conn()) == (BackoffPhase.WAITING, 1, {1: 0})
    w.advance(2.0)  # t=2: the test, beside m2-m4
    assert (c.backoff_phase, w.rdy_by_conn(), started()[-1]) == (
        BackoffPhase.TESTING,
        {1: 4},
        b"m5",
    )
    w.advance(1.0)
    answer(take(b"m5"), ok=False)  # t=3: another first failure, level 2
    assert (c.backoff_phase, c.backoff_level, w.rdy_by_conn()) == (BackoffPhase.WAITING, 2, {1: 0})
    w.advance(3.9)
    assert c.backoff_phase is BackoffPhase.WAITING
    w.advance(0.1)  # t=7: the 4 s window is over
    assert (c.backoff_phase, w.rdy_by_conn(), started()[-1]) == (
        BackoffPhase.TESTING,
        {1: 4},
        b"m6",
    )
    w.advance(5.0)
    answer(take(b"m2"), ok=True)  # t=12: level 1, m7 starts in the freed slot
    assert (c.backoff_phase, c.backoff_level, started()[-1]) == (BackoffPhase.TESTING, 1, b"m7")
    answer(take(b"m3"), ok=True)  # level 0
    assert (c.backoff_phase, c.backoff_level, c.total_rdy) == (BackoffPhase.NORMAL, 0, 4)
    assert _changes(w) == [
        ("waiting", 1, 2.0, 1),
        ("testing", 1, 0.0, 1),
        ("waiting", 2, 4.0, 2),
        ("testing", 2, 0.0, 2),
        ("testing", 1, 0.0, 2),
        ("normal", 0, 0.0, 0),
    ]
    for body in started():  # m4, m6... succeed and the queue runs on until m1 is back
        answer(take(body), ok=True)
    while b"m1" not in started():
        for body in started():
            answer(take(body), ok=True)
        w.advance(1.0)
    assert w.now == 90.0  # its automatic delay: 90 s x 1 attempt
    again = take(b"m1")
    assert again.attempts == 2
    answer(again, ok=False)  # a repeated failure: level 1 again, not 3
    assert _changes(w)[-1] == ("waiting", 1, 2.0, 1)


def test_a_hung_handler_never_keeps_the_test_message_out() -> None:
    # max_in_flight 1: m0's handler hangs (never answers), nsqd takes m0 back after its
    # msg_timeout and sends m1, which fails. When the window ends the user still holds m0:
    # a test that counted it against max_in_flight 1 had room for no message, so no result
    # could ever come and the consumer stayed in the test with RDY 0 for good, messages
    # waiting. nsqd counts m0 no more: the test lets one message in beside it.
    w = World(
        1,
        Config(max_in_flight=1, default_requeue_delay=0.0),
        node_options={"msg_timeout": 10.0},
    )
    w.start()
    for i in range(3):
        w.publish(0, 1, b"m%d" % i)
    c = w.coordinator
    hung = w.inbox.pop(0)
    assert hung.body == b"m0"
    w.advance(10.5)  # m0 timed out on nsqd: RDY 1 lets m1 in
    failed = w.inbox.pop(0)
    assert failed.body == b"m1" and c.in_flight_count() == 2
    c.requeue(failed, w.now)
    w.pump()
    assert c.backoff_phase is BackoffPhase.WAITING
    w.advance(2.0)
    assert c.backoff_phase is BackoffPhase.TESTING
    assert w.rdy_by_conn() == {1: 1}  # one test message beside the hung handler
    (test,) = w.inbox
    w.inbox.clear()
    # The test message's handler hangs too: once nsqd took it back, another one comes (at
    # the next RDY redistribution, every 5 s by default).
    w.advance(15.0)
    assert c.backoff_phase is BackoffPhase.TESTING and len(w.inbox) == 1
    c.finish(w.inbox.pop(), w.now)  # a success: level 0, running normally again
    w.pump()
    assert c.backoff_phase is BackoffPhase.NORMAL and test.id != hung.id
    for _ in range(10):
        w.finish_all()
        w.advance(1.0)
    assert w.server_depth() == 0 and w.server_in_flight() == 0


def test_the_test_message_rdy_moves_off_an_nsqd_with_nothing_to_send() -> None:
    # Two nsqd, only the second has messages; max_in_flight 4. One message fails while two
    # handlers hang: the test lets one message in (allowance 3, budget 3, not fewer RDY than
    # connections), and with this seed its RDY goes to the empty nsqd. Redistribution judged
    # scarcity on the budget (3 >= 2 connections), so that RDY was never moved: the consumer
    # waited on the empty nsqd for good (even once nsqd took the hung messages back). Scarcity while
    # testing is what the test lets in (1 < 2): the idle holder passes it on.
    w = World(
        2,
        Config(max_in_flight=4, default_requeue_delay=0.0, low_rdy_idle_timeout=10.0),
        seed=1,
    )
    w.start()
    w.advance(1.0)
    w.publish(1, 10)
    w.advance(0.5)
    c = w.coordinator
    failed = w.inbox.pop(0)
    c.requeue(failed, w.now)
    w.pump()
    w.inbox.clear()  # the two others hang
    w.advance(2.0)
    assert c.backoff_phase is BackoffPhase.TESTING
    assert w.rdy_by_conn() == {1: 1, 2: 0}  # the test's RDY on the empty nsqd
    while w.now < 200.0 and not w.inbox:
        w.advance(0.5)
    (test,) = w.inbox  # from the second nsqd, once the idle holder passed the RDY on
    assert test.address == w.addresses[1]
    assert w.now <= 15.0, w.now  # the idle timeout, long before nsqd takes the two back (60 s)
    assert c.finish(w.inbox.pop(), w.now)
    w.pump()
    assert c.backoff_phase is BackoffPhase.NORMAL
    for _ in range(80):  # the rest (nsqd takes the two hung ones back at 60 s)
        w.finish_all()
        w.advance(1.0)
    assert w.server_depth() == 0 and w.server_in_flight() == 0

"""max_in_flight bounds the messages the user holds, not only the sum of RDY (issue 12.2).

nsqd sends on a connection while its in-flight count is below that connection's RDY, so a
lowered RDY does not take back what is already in flight there: a joining connection may only
be given budget that is not in flight elsewhere. "Held" is read from nsqd (its in-flight count
on the consumer's open connections) after every step of the in-memory world.
"""

from __future__ import annotations

from nsq_sansio.config import Config
from nsq_sansio.consumer import RDY_SETTLE_MIN, Deliver

from .harness import World, held_by_connected_clients


class CheckedWorld(World):
    """A world that checks, whenever bytes stop moving, that the user holds no more than
    max_in_flight messages (and remembers the most it ever held)."""

    most_held = 0

    def pump(self) -> None:
        super().pump()
        held = held_by_connected_clients(self)
        self.most_held = max(self.most_held, held)
        assert held <= self.coordinator.max_in_flight, (self.now, held, self.rdy_by_conn())
        # The library's own count agrees with nsqd's (nothing timed out in these tests).
        assert self.coordinator.in_flight_count() == held


def rdy_lines(w: World, conn_id: int) -> list[int]:
    return [count for cid, count in w.rdy_sent if cid == conn_id]


def answer_from(w: World, conn_id: int, count: int) -> list[Deliver]:
    """The user finishes ``count`` of the messages it holds from ``conn_id``."""
    done = [d for d in w.inbox if d.conn_id == conn_id][:count]
    for d in done:
        w.inbox.remove(d)
        assert w.coordinator.finish(d, w.now)
        w.pump()
    return done


def test_a_joining_nsqd_gets_no_rdy_while_the_user_holds_max_in_flight() -> None:
    # The scenario: max_in_flight 10, the user holds all 10 from nsqd A; nsqd B comes
    # up with messages. Before: RDY on A was lowered to 5, B got 5, the user held 15.
    w = CheckedWorld(2, Config(max_in_flight=10))
    w.kill(1)
    w.start()
    w.publish(0, 30)
    assert len(w.inbox) == 10 and w.rdy_by_conn() == {1: 10}
    w.revive(1)
    w.publish(1, 30)  # nothing reads it yet: B is down for the consumer
    w.advance(5.0)  # B reconnects and subscribes; nothing is answered meanwhile
    c = w.coordinator
    assert len(c.connection_ids()) == 2
    b = next(conn_id for conn_id in c.connection_ids() if conn_id != 1)
    assert held_by_connected_clients(w) == 10
    assert w.rdy_by_conn()[b] == 0, "B may only get budget that is not in flight on A"
    assert all(d.conn_id == 1 for d in w.inbox)

    # One answer on A frees one slot for good: B gets its first RDY at once.
    answer_from(w, 1, 1)
    assert w.rdy_by_conn()[b] >= 1
    assert any(d.conn_id == b for d in w.inbox)
    assert held_by_connected_clients(w) == 10

    # As the user answers A's messages, B's share (5) comes back in a few steps, not one RDY
    # per answer; A is refilled only up to its own share.
    answer_from(w, 1, 9)
    assert sorted(w.rdy_by_conn().values()) == [5, 5]
    assert len(rdy_lines(w, b)) <= 4, rdy_lines(w, b)

    # Everything is delivered and finished, never more than 10 held at once.
    while w.inbox:
        w.finish_all()
        w.advance(1.0)
    assert w.server_depth() == 0 and w.server_in_flight() == 0
    assert w.most_held == 10
    assert c.finished == 60


def test_two_nsqd_with_messages_at_start_never_hand_out_more_than_max_in_flight() -> None:
    w = CheckedWorld(2, Config(max_in_flight=10))
    for node in (0, 1):
        for _ in range(20):
            w.nodes[w.addresses[node]].publish("events", b"x", 0.0)
    w.start()  # both subscribe with RDY 1, then warm up one after the other
    w.advance(30.0)  # the user answers nothing
    assert held_by_connected_clients(w) == 10
    assert w.most_held == 10
    while w.inbox:
        w.finish_all()
        w.advance(1.0)
    assert w.coordinator.finished == 40


def test_a_joining_nsqd_is_not_starved_by_a_connection_that_holds_nothing() -> None:
    # A holds RDY 10 but no message (its nsqd is empty): the share it gives up may still be in
    # use by messages nsqd sent before reading the lowered RDY, so B waits until that settles,
    # not longer.
    w = CheckedWorld(2, Config(max_in_flight=10))
    w.kill(1)
    w.start()
    w.publish(0, 1)
    w.finish_all()
    assert w.rdy_by_conn() == {1: 10}
    w.revive(1)
    w.publish(1, 8)
    c = w.coordinator
    while len(c.connection_ids()) < 2 or w.rdy_by_conn().get(1) != 9:
        w.advance(0.01)  # until B has subscribed (A gave up RDY 1 for B's first)
    assert w.now < 3.0
    subscribed_at = w.now
    while len(w.inbox) < 5 and w.now < subscribed_at + 10:
        w.advance(0.01)
    # B's first RDY once A's RDY 9 settled, its share (5) once A's RDY 5 settled
    assert w.now - subscribed_at <= 2 * RDY_SETTLE_MIN + 0.02, w.now - subscribed_at
    b = next(conn_id for conn_id in c.connection_ids() if conn_id != 1)
    assert len(w.inbox) == 5 and all(d.conn_id == b for d in w.inbox)
    assert sorted(w.rdy_by_conn().values()) == [5, 5]


def test_a_message_delayed_past_the_settle_time_is_handed_back_when_it_does_not_fit() -> None:
    # max_in_flight 1 over two nsqd. The RDY holder A is cut off (a partition): the RDY moves
    # to B once A's RDY 0 "settled", but A never read that RDY 0 and sends a message under its
    # old RDY 1, which waits in the network while the user holds one message from B.
    config = Config(max_in_flight=1, low_rdy_idle_timeout=1.0, rdy_redistribute_interval=0.5)
    w = World(2, config, seed=1)
    w.start()
    a = next(conn_id for conn_id, count in w.rdy_by_conn().items() if count)
    b = next(conn_id for conn_id in w.coordinator.connection_ids() if conn_id != a)
    node_a = w.addresses.index(w.coordinator._links[a].address)
    w.stall(node_a)
    while w.rdy_by_conn()[b] == 0:  # A idle: its RDY 0 is written (held), then B gets RDY 1
        w.advance(0.1)
        assert w.now < 20.0
    w.publish(node_a, 1)  # nsqd A still counts RDY 1: it sends, the partition holds it
    w.publish(1 - node_a, 1)
    assert [d.conn_id for d in w.inbox] == [b]
    w.heal(node_a)
    assert [d.conn_id for d in w.inbox] == [b], "the late message must not reach the user"
    requeued = [(conn_id, line) for conn_id, line in w.sent if line.startswith(b"REQ ")]
    assert len(requeued) == 1 and requeued[0][0] == a and requeued[0][1].endswith(b" 0")
    assert held_by_connected_clients(w) == 1
    assert w.coordinator.in_flight_count() == 1
    w.finish_all()
    w.advance(30.0)  # the requeued message comes back (from A or B) and is delivered
    assert len(w.inbox) == 1 and w.inbox[0].attempts == 2
    w.finish_all()
    assert w.server_depth() == 0 and w.server_in_flight() == 0


def test_a_message_delayed_past_the_settle_time_is_kept_when_budget_is_free() -> None:
    # Pull mode: a fetch gets RDY 1, the node is cut off, the fetch expires (RDY 0, held by
    # the partition) and nsqd sends a message under its old RDY 1. Nothing else is claimed when
    # it arrives: it is kept (for the next fetch), not handed back.
    w = World(1, Config(max_in_flight=1), pull=True)
    w.start()
    c = w.coordinator
    c.fetch(1, w.now, expires=1.0)
    w.pump()
    assert w.rdy_by_conn() == {1: 1}
    w.stall(0)
    w.advance(2.0)  # expired: RDY 0 written, and released once "settled"
    assert w.rdy_by_conn() == {1: 0} and w.results[-1].messages == ()
    w.publish(0, 1)
    w.heal(0)
    assert not w.lines(b"REQ ")
    assert held_by_connected_clients(w) == 1
    c.fetch(1, w.now, no_wait=True)
    w.pump()
    assert len(w.results[-1].messages) == 1
    assert c.finish(w.results[-1].messages[0], w.now)
    w.pump()
    assert held_by_connected_clients(w) == 0


def test_a_late_message_beyond_the_rdy_written_does_not_take_a_slot_near_its_deadline() -> None:
    # Pull mode, max_in_flight 2 over two nsqd. The user holds m0 from A (never answered) when
    # A is cut off with RDY 2; the RDY 0 written since waits in the network, and the RDY moves
    # to B, whose m2 the user takes. Just before m0's deadline A's nsqd, still counting RDY 2,
    # sends m1. It arrives beyond the RDY 0 written: nsqd never read it, so nsqd did not send m1
    # into a slot its timeout freed (m0 is still in flight there, for 0.1 s): taking m1 would
    # make 3 held; it is handed back.
    w = World(2, Config(max_in_flight=2), pull=True, node_options={"msg_timeout": 10.0})
    w.kill(1)
    w.start()
    c = w.coordinator
    c.fetch(2, w.now, expires=1.0)
    w.pump()
    w.publish(0, 1)
    a = next(iter(w.rdy_by_conn()))
    w.stall(0)
    w.revive(1)
    w.advance(2.0)  # the fetch expired with m0: A's RDY 0 is written, held by the partition
    (m0,) = w.results[0].messages
    assert w.rdy_by_conn()[a] == 0 and len(c.connection_ids()) == 2
    w.advance(m0.deadline - 1.0 - w.now)
    c.fetch(1, w.now, expires=5.0)
    w.pump()
    b = next(conn_id for conn_id in c.connection_ids() if conn_id != a)
    while not w.rdy_by_conn()[b]:  # A delivers nothing: its RDY passes to B
        w.advance(0.05)
        assert w.now < m0.deadline - 0.2
    w.publish(1, 1)
    assert [d.conn_id for d in w.results[-1].messages] == [b]
    w.advance(m0.deadline - 0.1 - w.now)
    w.publish(0, 1)  # nsqd A still counts RDY 2 and one in flight: it sends m1
    w.heal(0)
    assert w.now < m0.deadline
    requeued = [(conn_id, line) for conn_id, line in w.sent if line.startswith(b"REQ ")]
    assert len(requeued) == 1 and requeued[0][0] == a and requeued[0][1].endswith(b" 0")
    assert held_by_connected_clients(w) == 2
    assert c.in_flight_count() == 2

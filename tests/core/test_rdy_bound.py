"""The RDY bound: an nsqd that keeps to RDY is never refused; one that sends more always is.

The legitimate peer is modelled on nsqd's own rule (``clientV2.IsReadyForMessages``): it sends a
message only while the messages in flight to this client are fewer than the RDY it has read.
Commands reach it late (RDY, FIN and REQ are read in order, whenever the model says), its
decision to send can be taken before a new RDY is read and the message written after (nsqd's
message pump), it times messages out after ``msg_timeout`` and forgets the client's messages in
flight when the channel is emptied (the bound tolerates one RDY's worth of those: the model
keeps every later RDY at least as large as the forgotten messages still held).
"""

from __future__ import annotations

import tracemalloc
from collections import deque

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, invariant, precondition, rule

from nsq_sansio import ClientConnection, ConnectionClosed, ConnectionState, Message
from nsq_sansio.errors import ReadyCountExceeded

from ._helpers import CLOSE_WAIT, HEARTBEAT, OK, error, identify_answer, message, subscribed_conn
from ._servers import ServerStream

MSG_TIMEOUT = 60.0


def subscribed(rdy: int = 0) -> ClientConnection:
    """Subscribed after a negotiated IDENTIFY (msg_timeout 60 s), with the clock at 0."""
    conn = ClientConnection({"heartbeat_interval": -1})
    conn.receive_data(identify_answer(msg_timeout=int(MSG_TIMEOUT * 1000)), now=0.0)
    conn.subscribe("t", "c")
    conn.receive_data(OK, now=0.0)
    if rdy:
        conn.send_ready(rdy)
    conn.data_to_send()
    return conn


def ids(start: int, count: int) -> list[bytes]:
    return [b"%016x" % i for i in range(start, start + count)]


def push(conn: ClientConnection, message_ids: list[bytes], now: float = 0.0) -> list[object]:
    return list(conn.receive_data(b"".join(message(m) for m in message_ids), now=now))


def refused(events: list[object]) -> ReadyCountExceeded:
    closed = events[-1]
    assert isinstance(closed, ConnectionClosed), events
    assert isinstance(closed.error, ReadyCountExceeded), closed.error
    return closed.error


# --- examples ---------------------------------------------------------------------------------


def test_no_rdy_no_message() -> None:
    conn = subscribed(rdy=0)
    events = push(conn, ids(0, 1))
    error = refused(events)
    assert [e for e in events if isinstance(e, Message)] == []
    assert (error.held, error.rdy, error.allowed) == (1, 0, 0)
    assert "RDY 0" in str(error) and "1 would be held" in str(error)
    assert conn.state is ConnectionState.CLOSED


def test_over_the_bound_only_the_messages_beyond_are_left_out() -> None:
    conn = subscribed(rdy=3)  # the bound is 6: twice the RDY
    events = push(conn, ids(0, 10))
    error = refused(events)
    delivered = [e.id for e in events if isinstance(e, Message)]
    assert delivered == ids(0, 6)
    assert (error.held, error.rdy, error.allowed) == (10, 3, 6)
    closed = events[-1]
    assert isinstance(closed, ConnectionClosed)
    assert sorted(closed.in_flight) == ids(0, 6)  # the 4 beyond were never anyone's to answer


def test_a_channel_emptied_on_nsqd_is_not_a_violation() -> None:
    # /channel/empty makes nsqd forget the messages in flight: it may send a whole RDY again
    # while this client still holds the first ones.
    conn = subscribed(rdy=5)
    assert len(push(conn, ids(0, 5))) == 5
    events = push(conn, ids(5, 5), now=1.0)
    assert [type(e) for e in events] == [Message] * 5
    assert conn.in_flight_count == 10


def test_answers_make_room_again() -> None:
    conn = subscribed(rdy=1)
    for index in range(100):
        (event,) = push(conn, ids(index, 1))
        assert isinstance(event, Message)
        conn.finish(event.id)


def test_messages_sent_under_a_higher_rdy_before_nsqd_read_the_lower_one() -> None:
    conn = subscribed(rdy=10)
    conn.send_ready(1)  # nsqd may have sent 10 before reading it
    assert [type(e) for e in push(conn, ids(0, 10))] == [Message] * 10
    for message_id in ids(0, 10):
        conn.finish(message_id)
    # Those 10 used up what the old RDY allowed: the bound is now RDY 1's.
    assert conn.rdy_bound == 2
    assert len(push(conn, ids(10, 2))) == 2
    error = refused(push(conn, ids(12, 1)))
    assert error.allowed == 2


def test_after_close_wait_one_message_decided_before_it_may_still_come() -> None:
    conn = subscribed(rdy=5)
    assert conn.close() is None  # CLS
    conn.receive_data(CLOSE_WAIT, now=0.0)
    (event,) = push(conn, ids(0, 1))  # nsqd's pump had decided on it before CLS
    assert isinstance(event, Message)
    conn.finish(event.id)
    error = refused(push(conn, ids(1, 1)))  # nsqd's RDY is 0 now: nothing more may come
    assert error.allowed == 0


def test_messages_nsqd_may_have_timed_out_do_not_count() -> None:
    conn = subscribed(rdy=1)
    push(conn, ids(0, 2), now=0.0)  # held, never answered
    # nsqd times them out after 60 s and sends others: half a timeout later they no longer
    # count (their delivery may have been late).
    assert [type(e) for e in push(conn, ids(2, 2), now=31.0)] == [Message] * 2
    assert conn.in_flight_count == 4
    error = refused(push(conn, ids(4, 1), now=32.0))  # the two from 31 s still count
    assert error.held == 3 and error.allowed == 2


def test_a_deflate_bomb_at_rdy_1_decodes_no_further_than_the_bound() -> None:
    # 60 messages of 1 MiB compress to about 60 KB: one read used to hand them all over.
    conn = ClientConnection({"deflate": True})
    server = ServerStream("deflate")
    conn.receive_data(identify_answer(deflate=True) + server.compress(OK), now=0.0)
    conn.subscribe("t", "c")
    conn.receive_data(server.compress(OK), now=0.0)
    conn.send_ready(1)
    wire = server.compress(b"".join(message(m, b"\0" * (1 << 20)) for m in ids(0, 60)))
    assert len(wire) < 100_000
    tracemalloc.start()
    try:
        events = conn.receive_data(wire, now=0.0)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    refused(events)
    assert sum(isinstance(e, Message) for e in events) == 2  # the bound, then no more
    assert peak < 8 * (1 << 20), peak  # was above 60 MiB: every message decoded


def test_a_refused_peer_leaves_nothing_alive_behind_its_error() -> None:
    # The error is reported as a value, not raised: with its traceback it held the decoder's
    # frame, whose events held the error (a cycle), and so every message of that read, until
    # a full garbage collection: a peer refused and reconnected again and again piled them up.
    conn = subscribed(rdy=1)
    error = refused(push(conn, ids(0, 3)))
    assert error.__traceback__ is None


def test_a_flood_of_heartbeats_in_one_read_is_refused_early() -> None:
    # 200k heartbeats compress to a few KB; each would be an event and a NOP queued.
    conn = ClientConnection({"deflate": True})
    server = ServerStream("deflate")
    conn.receive_data(identify_answer(deflate=True) + server.compress(OK), now=0.0)
    wire = server.compress(HEARTBEAT * 200_000)
    assert len(wire) < 100_000
    events = conn.receive_data(wire, now=0.0)
    closed = events[-1]
    assert isinstance(closed, ConnectionClosed) and "heartbeats" in str(closed.error)
    assert len(events) < 64 + 2 * conn.max_rdy_count + 2


def test_heartbeats_and_late_answers_nsqd_may_send_at_once_are_fine() -> None:
    conn = subscribed(rdy=100)
    push(conn, ids(0, 100))
    taken_back = b"".join(
        error(b"E_FIN_FAILED FIN %016x failed ID not in flight" % i) for i in range(100)
    )
    events = conn.receive_data(HEARTBEAT * 3 + taken_back, now=1.0)
    assert len(events) == 103 and conn.state is ConnectionState.SUBSCRIBED


# --- the legitimate peer, modelled on nsqd -------------------------------------------------------


class LegitimateNSQD(RuleBasedStateMachine):
    """Random interleavings of RDY changes, answers, deliveries, timeouts and channel empties,
    with an nsqd that keeps to its rule: the connection never refuses it."""

    def __init__(self) -> None:
        super().__init__()
        self.conn = subscribed()
        self.now = 0.0
        self.next_id = 0
        self.commands: deque[tuple[str, object]] = deque()  # sent by the client, unread
        self.server_rdy = 0
        self.server_in_flight: dict[bytes, float] = {}  # id -> when nsqd sent it
        self.decided = False  # nsqd's pump chose to send, under the state it saw then
        self.wire: deque[tuple[bytes, float]] = deque()  # written, not yet read by the client
        self.forgotten: set[bytes] = set()  # emptied on nsqd, still held by the client

    def _receive(self, data: bytes) -> None:
        if not data:  # b"" would be the end of the stream
            return
        for event in self.conn.receive_data(data, now=self.now):
            assert not isinstance(event, ConnectionClosed), event

    # client
    @rule(count=st.integers(0, 20))
    def send_ready(self, count: int) -> None:
        count = max(count, len(self.forgotten))
        self.conn.send_ready(count)
        self.commands.append(("RDY", count))

    @rule(data=st.data(), how=st.sampled_from(["FIN", "REQ"]))
    @precondition(lambda self: self.conn.in_flight_count > 0)
    def answer(self, data: st.DataObject, how: str) -> None:
        message_id = data.draw(st.sampled_from(sorted(self.conn.in_flight)))
        if how == "FIN":
            self.conn.finish(message_id)
        else:
            self.conn.requeue(message_id, 0.0)
        self.forgotten.discard(message_id)
        self.commands.append((how, message_id))

    # nsqd
    @rule(count=st.integers(1, 5))
    def nsqd_reads_commands(self, count: int) -> None:
        for _ in range(min(count, len(self.commands))):
            verb, argument = self.commands.popleft()
            if verb == "RDY":
                assert isinstance(argument, int)
                self.server_rdy = argument
            else:
                self.server_in_flight.pop(argument, None)  # type: ignore[call-overload]

    @rule()
    def nsqd_decides_to_send(self) -> None:
        if len(self.server_in_flight) < self.server_rdy:
            self.decided = True

    @rule(body=st.binary(max_size=8))
    @precondition(lambda self: self.decided)
    def nsqd_sends(self, body: bytes) -> None:
        self.decided = False  # the next message needs a new decision
        message_id = b"%016x" % self.next_id
        self.next_id += 1
        self.server_in_flight[message_id] = self.now
        self.wire.append((message(message_id, body), self.now))

    @rule()
    @precondition(lambda self: not self.forgotten)
    def channel_emptied(self) -> None:
        forgotten = set(self.server_in_flight) & self.conn.in_flight
        if len(forgotten) <= self.conn.rdy:
            self.forgotten = forgotten
            self.server_in_flight.clear()

    # the network and the clock
    @rule(data=st.data())
    def client_reads(self, data: st.DataObject) -> None:
        count = data.draw(st.integers(0, len(self.wire)))
        chunk = b"".join(self.wire.popleft()[0] for _ in range(count))
        if chunk:
            cut = data.draw(st.integers(0, len(chunk)))
            self._receive(chunk[:cut])
            self._receive(chunk[cut:])

    @rule(seconds=st.floats(0.0, MSG_TIMEOUT / 4))
    def time_passes(self, seconds: float) -> None:
        # What is on the wire arrives within the step: latency under a quarter of a timeout.
        if self.wire:
            self._receive(b"".join(frame for frame, _ in self.wire))
            self.wire.clear()
        self.now += seconds
        for message_id, sent in list(self.server_in_flight.items()):
            if self.now >= sent + MSG_TIMEOUT:  # nsqd's timeout: requeued, no longer in flight
                del self.server_in_flight[message_id]

    @invariant()
    def still_subscribed(self) -> None:
        assert self.conn.state is ConnectionState.SUBSCRIBED


LegitimateNSQD.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=60,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestLegitimateNSQD = LegitimateNSQD.TestCase


# --- a peer over the bound ----------------------------------------------------------------------


def legitimate_history(conn: ClientConnection, history: list[tuple[str, int]]) -> int:
    """RDY changes, deliveries within the bound and answers; returns the next message number."""
    next_id = 0
    for what, count in history:
        if what == "rdy":
            conn.send_ready(count)
        elif what == "push":
            room = min(count, conn.rdy_bound - conn.in_flight_count)
            if room > 0:
                events = push(conn, ids(next_id, room))
                assert [type(e) for e in events] == [Message] * room
                next_id += room
        else:
            for message_id in sorted(conn.in_flight)[:count]:
                conn.finish(message_id)
    return next_id


HISTORIES = st.lists(
    st.tuples(st.sampled_from(["rdy", "push", "fin"]), st.integers(0, 12)), max_size=30
)


@settings(max_examples=200, deadline=None)
@given(history=HISTORIES, extra=st.integers(1, 20))
def test_a_peer_over_the_bound_is_always_refused(
    history: list[tuple[str, int]], extra: int
) -> None:
    conn = subscribed()
    next_id = legitimate_history(conn, history)
    # Then, in one read, more messages than the bound leaves room for (no time passes: none
    # of the held ones can have timed out).
    bound = conn.rdy_bound
    held = conn.in_flight_count
    room = max(0, bound - held)
    events = push(conn, ids(next_id, room + extra))
    error = refused(events)
    assert [e.id for e in events if isinstance(e, Message)] == ids(next_id, room)
    assert (error.allowed, error.held) == (bound, held + room + extra)


@settings(max_examples=200, deadline=None)
@given(history=HISTORIES, extra=st.integers(1, 20), cuts=st.lists(st.integers(1, 2000)))
def test_however_the_excess_is_cut_into_reads_it_is_refused(
    history: list[tuple[str, int]], extra: int, cuts: list[int]
) -> None:
    conn = subscribed()
    next_id = legitimate_history(conn, history)
    room = max(0, conn.rdy_bound - conn.in_flight_count)
    wire = b"".join(message(m) for m in ids(next_id, room + extra))
    events: list[object] = []
    for cut in cuts:
        if wire and conn.state is not ConnectionState.CLOSED:
            events += conn.receive_data(wire[:cut], now=0.0)
            wire = wire[cut:]
    if wire and conn.state is not ConnectionState.CLOSED:
        events += conn.receive_data(wire, now=0.0)
    refused(events)
    assert sum(isinstance(e, Message) for e in events) <= room


def test_the_plain_helper_connection_keeps_the_bound_too() -> None:
    conn = subscribed_conn(rdy=2)
    refused(push(conn, ids(0, 5)))

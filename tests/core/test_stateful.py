"""Model-based test: a subscribed connection driven by random server frames and client commands.

The model is what nsqd would believe: messages in flight, the RDY count, the commands received
(decoded from the client's bytes, in order). The connection must agree with it at every step.
Each run is plain, snappy or deflate: nsqd's writes are compressed as they are made (by an
encoder written independently of the client's) and arrive cut anywhere, and what the client
wrote is decompressed before it is compared.
"""

from __future__ import annotations

from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from nsq_sansio import (
    ClientConnection,
    ConnectionClosed,
    ConnectionState,
    Heartbeat,
    Message,
    MessageTakenBack,
)
from nsq_sansio.events import Event

from ._helpers import HEARTBEAT, OK, error, identify_answer, message, subscribed_conn
from ._servers import ServerStream


class ConsumerConnection(RuleBasedStateMachine):
    def __init__(self) -> None:
        super().__init__()
        self.conn = subscribed_conn(rdy=0)
        self.server = ServerStream("none")
        self.in_flight: set[bytes] = set()
        self.rdy = 0
        self.remaining = 0
        self.next_id = 0
        self.expected_out: list[bytes] = []
        self.stream = b""  # server bytes not yet delivered (delivered in random pieces)
        self.pending_messages: list[bytes] = []
        self.heartbeats_pending = 0

    @initialize(kind=st.sampled_from(["none", "snappy", "deflate"]))
    def negotiate(self, kind: str) -> None:
        """IDENTIFY with ``kind`` of compression, then SUB, as nsqd answers them."""
        if kind == "none":
            return
        server = ServerStream(kind)
        conn = ClientConnection({kind: True})
        conn.data_to_send()
        conn.receive_data(identify_answer(**{kind: True}) + server.compress(OK))
        assert conn.state is ConnectionState.READY
        conn.subscribe("topic", "channel")
        assert server.decompress(conn.data_to_send()) == b"SUB topic channel\n"
        conn.receive_data(server.compress(OK))
        assert conn.state is ConnectionState.SUBSCRIBED
        self.conn, self.server = conn, server

    # --- server side ------------------------------------------------------------------------

    @rule(count=st.integers(1, 5), body=st.binary(max_size=40))
    def server_pushes_messages(self, count: int, body: bytes) -> None:
        frames = []
        room = self.rdy - len(self.in_flight) - len(self.pending_messages)  # nsqd keeps to RDY
        for _ in range(min(count, room)):
            mid = b"%016x" % self.next_id
            self.next_id += 1
            frames.append(message(mid, body))
            self.pending_messages.append(mid)
        if frames:
            self.stream += self.server.compress(b"".join(frames))  # one write of nsqd's

    @rule()
    def server_heartbeat(self) -> None:
        self.stream += self.server.compress(HEARTBEAT)
        self.heartbeats_pending += 1

    @rule(data=st.data())
    def deliver_some_bytes(self, data: st.DataObject) -> None:
        if not self.stream:
            return
        cut = data.draw(st.integers(1, len(self.stream)))
        piece, self.stream = self.stream[:cut], self.stream[cut:]
        events = self.conn.receive_data(piece)
        self._check(events)

    @rule(data=st.data())
    @precondition(lambda self: self.next_id > 0)
    def late_error(self, data: st.DataObject) -> None:
        if self.stream:
            self._check(self.conn.receive_data(self.stream))
            self.stream = b""
        mid = b"%016x" % data.draw(st.integers(0, self.next_id - 1))
        late = self.server.compress(error(b"E_FIN_FAILED FIN " + mid + b" failed"))
        [event] = self.conn.receive_data(late)
        assert isinstance(event, MessageTakenBack) and event.message_id == mid
        assert not event.error.fatal

    def _check(self, events: list[Event]) -> None:
        for event in events:
            assert not isinstance(event, ConnectionClosed), event
            if isinstance(event, Message):
                assert event.id == self.pending_messages.pop(0)
                self.in_flight.add(event.id)
                self.remaining = max(0, self.remaining - 1)
            else:
                assert isinstance(event, Heartbeat)
                self.heartbeats_pending -= 1
                self.expected_out.append(b"NOP\n")

    # --- client side ------------------------------------------------------------------------

    @rule(count=st.integers(0, 2500))
    def ready(self, count: int) -> None:
        self.conn.send_ready(count)
        self.rdy = self.remaining = count
        self.expected_out.append(b"RDY %d\n" % count)

    @rule(data=st.data(), how=st.sampled_from(["fin", "req", "touch"]))
    @precondition(lambda self: self.in_flight)
    def answer(self, data: st.DataObject, how: str) -> None:
        mid = data.draw(st.sampled_from(sorted(self.in_flight)))
        if how == "fin":
            self.conn.finish(mid)
            self.in_flight.discard(mid)
            self.expected_out.append(b"FIN " + mid + b"\n")
        elif how == "req":
            delay = data.draw(st.integers(0, 3_600_000))
            self.conn.requeue(mid, delay / 1000)
            self.in_flight.discard(mid)
            self.expected_out.append(b"REQ " + mid + b" %d\n" % delay)
        else:
            self.conn.touch(mid)
            self.expected_out.append(b"TOUCH " + mid + b"\n")

    @rule()
    def flush(self) -> None:
        assert self.server.decompress(self.conn.data_to_send()) == b"".join(self.expected_out)
        self.expected_out.clear()

    # --- agreement --------------------------------------------------------------------------

    @invariant()
    def every_byte_delivered_gave_its_events(self) -> None:
        if not self.stream:  # nothing may wait in the decoder (or the decompressor)
            assert not self.pending_messages and not self.heartbeats_pending

    @invariant()
    def agrees_with_the_model(self) -> None:
        assert self.conn.in_flight == self.in_flight
        assert self.conn.in_flight_count == len(self.in_flight)
        assert self.conn.rdy == self.rdy
        assert self.conn.rdy_remaining == self.remaining


ConsumerConnection.TestCase.settings = settings(
    max_examples=150,
    stateful_step_count=40,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)
TestConsumerConnection = ConsumerConnection.TestCase

"""Properties of the nsqd role: any chunking gives the same bytes, garbage never breaks the node,
and under random consumers, timeouts and disconnects no message is lost and RDY is never
exceeded."""

from __future__ import annotations

import random

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    precondition,
    rule,
)

from nsq_sansio import frames
from nsq_sansio.server import NSQD, ClientState, NSQDOptions

SCRIPT = (
    frames.MAGIC_V2
    + frames.encode_identify({"feature_negotiation": True, "client_id": "x"})
    + frames.encode_pub("t", b"one")
    + frames.encode_mpub("t", [b"two", b"three"])
    + frames.encode_dpub("t", 10, b"four")
    + frames.encode_sub("t", "c")
    + frames.encode_rdy(3)
    + b"FIN 0123456789abcdef\n"
    + frames.encode_nop()
    + b"TOUCH 0123456789abcdef\n"
    + b"RDY 99999\n"
    + frames.encode_pub("t", b"never")
)


def _run_script(cuts: list[int]) -> tuple[bytes, list[str]]:
    node = NSQD(NSQDOptions(), random.Random(1))
    conn = node.connect(0.0, "h:1")
    events: list[object] = []
    out = b""
    start = 0
    for cut in [*sorted(cuts), len(SCRIPT)]:
        if cut > start:  # an empty read would be EOF
            events += node.receive_data(conn, SCRIPT[start:cut], 0.0)
        out += node.data_to_send(conn)
        start = cut
    return out, [repr(event) for event in events]


_REFERENCE = _run_script([])


@given(st.lists(st.integers(0, len(SCRIPT)), max_size=40))
def test_any_chunking_gives_the_same_answers(cuts: list[int]) -> None:
    assert _run_script(cuts) == _REFERENCE


_TOKENS = st.sampled_from(
    [
        b"  V2",
        b"PUB t\n",
        b"MPUB t\n",
        b"DPUB t 5\n",
        b"SUB t c\n",
        b"RDY 5\n",
        b"FIN 0123456789abcdef\n",
        b"IDENTIFY\n",
        b"AUTH\n",
        b"CLS\n",
        b"NOP\n",
        b"\x00\x00\x00\x05hello",
        b"\x7f\xff\xff\xff",
        b"\xff\xff\xff\xff",
        b"\x00\x00\x00\x02{}",
        b"\n",
        b"\r\n",
        b" ",
    ]
)


@settings(max_examples=300, suppress_health_check=[HealthCheck.too_slow])
@given(st.lists(st.one_of(_TOKENS, st.binary(max_size=40)), max_size=30))
def test_garbage_never_raises_hangs_or_piles_up(chunks: list[bytes]) -> None:
    node = NSQD(NSQDOptions(max_body_size=1 << 16, max_msg_size=1 << 16), random.Random(1))
    bystander = node.connect(0.0, "h:2")
    node.receive_data(bystander, b"  V2" + frames.encode_sub("t", "c") + b"RDY 100\n", 0.0)
    conn = node.connect(0.0, "h:1")
    for index, chunk in enumerate(chunks):
        if not chunk:
            continue
        node.receive_data(conn, chunk, float(index))
        node.data_to_send(conn)
        if node.connection_state(conn) is ClientState.CLOSED:
            break
        buffered = node._conns[conn].inbuf
        assert len(buffered) <= 16 * 1024 + (1 << 16) + 8
    node.receive_data(bystander, frames.encode_nop(), 50.0)
    node.handle_timer(60.0)
    # the bystander is still served
    assert node.connection_state(bystander) is ClientState.SUBSCRIBED
    node.data_to_send(bystander)
    node.publish("t", b"after", 60.0)
    received = frames.FrameDecoder().feed(node.data_to_send(bystander))
    assert any(kind == 2 and data.endswith(b"after") for kind, data in received)


class ChannelMachine(RuleBasedStateMachine):
    """Producers and consumers on one channel with random RDY, FIN, REQ, TOUCH, time, drops."""

    @initialize()
    def setup(self) -> None:
        self.node = NSQD(NSQDOptions(msg_timeout=5.0, max_rdy_count=10), random.Random(5))
        self.now = 0.0
        self.producer = self.node.connect(0.0, "p:1")
        self.node.receive_data(self.producer, b"  V2", 0.0)
        self.published = 0
        self.finished: set[bytes] = set()
        self.fin_sent = 0
        self.fin_failed = 0
        self.dropped = 0
        self.clients: dict[int, dict[str, object]] = {}
        self.decoders: dict[int, frames.FrameDecoder] = {}
        for _ in range(3):
            self._new_consumer()

    def _new_consumer(self) -> None:
        conn = self.node.connect(self.now, "c:1")
        self.node.receive_data(conn, b"  V2" + frames.encode_sub("t", "c"), self.now)
        self.clients[conn] = {"rdy": 0, "ceiling": 0, "held": []}
        self.decoders[conn] = frames.FrameDecoder()
        self._drain()

    def _server_in_flight(self) -> dict[int, int]:
        stats = self.node.stats(self.now)
        counts: dict[int, int] = {}
        for topic in stats["topics"]:
            for channel in topic["channels"]:
                for client in channel["clients"]:
                    port = client["remote_address"]
                    counts[port] = client["in_flight_count"]
        return counts

    def _drain(self) -> None:
        self.node.data_to_send(self.producer)
        for conn in list(self.clients):
            for kind, data in self.decoders[conn].feed(self.node.data_to_send(conn)):
                if kind == 2:
                    held = self.clients[conn]["held"]
                    assert isinstance(held, list)
                    held.append(frames.decode_message(data).id)
                elif kind == 1:
                    assert data.split(b" ")[0] in (
                        b"E_FIN_FAILED",
                        b"E_REQ_FAILED",
                        b"E_TOUCH_FAILED",
                    )
                    if data.startswith(b"E_FIN_FAILED"):
                        self.fin_failed += 1
                elif data == frames.HEARTBEAT:
                    self.node.receive_data(conn, frames.encode_nop(), self.now)

    def _in_flight_of(self, conn: int) -> int:
        chan = self.node._topics.by_name["t"].channels["c"]
        return chan.clients[conn].in_flight if conn in chan.clients else 0

    @rule(count=st.integers(1, 5))
    def publish(self, count: int) -> None:
        bodies = [b"m%d" % (self.published + i) for i in range(count)]
        self.node.receive_data(self.producer, frames.encode_mpub("t", bodies), self.now)
        self.published += count
        self._drain()

    @precondition(lambda self: self.clients)
    @rule(data=st.data(), rdy=st.integers(0, 10))
    def ready(self, data: st.DataObject, rdy: int) -> None:
        conn = data.draw(st.sampled_from(sorted(self.clients)))
        state = self.clients[conn]
        state["rdy"] = rdy
        state["ceiling"] = max(rdy, self._in_flight_of(conn))
        self.node.receive_data(conn, frames.encode_rdy(rdy), self.now)
        self._drain()

    @precondition(lambda self: any(c["held"] for c in self.clients.values()))
    @rule(
        data=st.data(), action=st.sampled_from(["fin", "req", "touch"]), delay=st.integers(0, 3000)
    )
    def answer(self, data: st.DataObject, action: str, delay: int) -> None:
        conn = data.draw(st.sampled_from(sorted(c for c, s in self.clients.items() if s["held"])))
        held = self.clients[conn]["held"]
        assert isinstance(held, list)
        message_id = data.draw(st.sampled_from(held))
        if action == "fin":
            held.remove(message_id)
            self.fin_sent += 1
            before = self.fin_failed
            self.node.receive_data(conn, frames.encode_fin(message_id), self.now)
            self._drain()
            if self.fin_failed == before:
                self.finished.add(message_id)
        elif action == "req":
            held.remove(message_id)
            self.node.receive_data(conn, frames.encode_req(message_id, delay), self.now)
            self._drain()
        else:
            self.node.receive_data(conn, frames.encode_touch(message_id), self.now)
            self._drain()

    @rule(seconds=st.floats(0.0, 4.0))
    def advance(self, seconds: float) -> None:
        self.now += seconds
        self.node.handle_timer(self.now)
        self._drain()

    @rule(target_topic=st.booleans(), pause=st.booleans())
    def pause(self, target_topic: bool, pause: bool) -> None:
        if target_topic:
            (self.node.pause_topic if pause else self.node.unpause_topic)("t", self.now)
        else:
            (self.node.pause_channel if pause else self.node.unpause_channel)("t", "c", self.now)
        self._drain()

    @rule()
    def empty_channel(self) -> None:
        (channel,) = self.node.stats(self.now)["topics"][0]["channels"]
        self.dropped += channel["depth"] + channel["in_flight_count"] + channel["deferred_count"]
        self.node.empty_channel("t", "c", self.now)
        self._drain()

    @precondition(lambda self: len(self.clients) > 1)
    @rule(data=st.data())
    def disconnect(self, data: st.DataObject) -> None:
        conn = data.draw(st.sampled_from(sorted(self.clients)))
        self.node.receive_data(conn, b"", self.now)
        self.node.connection_lost(conn, self.now)
        del self.clients[conn]
        del self.decoders[conn]
        self._new_consumer()

    @invariant()
    def rdy_is_never_exceeded(self) -> None:
        if not hasattr(self, "node"):
            return
        for conn, state in self.clients.items():
            in_flight = self._in_flight_of(conn)
            ceiling = state["ceiling"]
            assert isinstance(ceiling, int)
            assert in_flight <= ceiling, (conn, in_flight, state)
            rdy = state["rdy"]
            assert isinstance(rdy, int)
            state["ceiling"] = max(rdy, min(ceiling, in_flight))

    @invariant()
    def no_message_is_lost(self) -> None:
        if not hasattr(self, "node") or "t" not in self.node._topics.by_name:
            return
        (topic,) = self.node.stats(self.now)["topics"]
        (channel,) = topic["channels"]
        accounted = (
            channel["depth"]
            + channel["in_flight_count"]
            + channel["deferred_count"]
            + (self.fin_sent - self.fin_failed)
            + self.dropped
        )
        assert channel["message_count"] + topic["depth"] == self.published
        assert accounted == channel["message_count"]

    def teardown(self) -> None:
        if not hasattr(self, "node"):
            return
        # Drain: everything published is finished by someone eventually.
        conn = sorted(self.clients)[0]
        self.node.unpause_topic("t", self.now)
        self.node.unpause_channel("t", "c", self.now)
        self.node.receive_data(conn, frames.encode_rdy(10), self.now)
        for _ in range(400):
            self.now += 6.0
            self.node.handle_timer(self.now)
            self._drain()
            for client, state in self.clients.items():
                held = state["held"]
                assert isinstance(held, list)
                for message_id in held:
                    self.fin_sent += 1
                    before = self.fin_failed
                    self.node.receive_data(client, frames.encode_fin(message_id), self.now)
                    self._drain()
                    if self.fin_failed == before:
                        self.finished.add(message_id)
                held.clear()
            if len(self.finished) + self.dropped >= self.published:
                break
        assert len(self.finished) + self.dropped >= self.published
        (channel,) = self.node.stats(self.now)["topics"][0]["channels"]
        assert channel["depth"] == channel["in_flight_count"] == channel["deferred_count"] == 0


TestChannelMachine = ChannelMachine.TestCase
TestChannelMachine.settings = settings(
    max_examples=60, stateful_step_count=30, deadline=None, suppress_health_check=list(HealthCheck)
)


@settings(max_examples=150, suppress_health_check=[HealthCheck.too_slow])
@given(
    st.sampled_from([{"snappy": True}, {"deflate": True}]),
    st.lists(st.binary(max_size=64), min_size=1, max_size=8),
)
def test_garbage_on_a_compressed_connection_closes_it_cleanly(
    feature: dict[str, bool], chunks: list[bytes]
) -> None:
    node = NSQD(NSQDOptions(), random.Random(1))
    conn = node.connect(0.0, "h:1")
    node.receive_data(
        conn, b"  V2" + frames.encode_identify({"feature_negotiation": True, **feature}), 0.0
    )
    assert node.data_to_send(conn)
    for chunk in chunks:
        if chunk:
            node.receive_data(conn, chunk, 0.0)
            node.data_to_send(conn)
    state = node.connection_state(conn)
    assert state in (ClientState.INIT, ClientState.SUBSCRIBED, ClientState.CLOSED)


def test_a_publish_reports_the_consumers_it_fed() -> None:
    node = NSQD(NSQDOptions(), random.Random(1))
    consumers = []
    for _ in range(3):
        conn = node.connect(0.0, "h:1")
        node.receive_data(conn, b"  V2" + frames.encode_sub("t", "c") + b"RDY 1\n", 0.0)
        node.data_to_send(conn)
        consumers.append(conn)
    producer = node.connect(0.0, "h:2")
    node.connections_with_output()
    node.receive_data(producer, b"  V2" + frames.encode_mpub("t", [b"a", b"b"]), 0.0)
    fed = node.connections_with_output()
    assert producer in fed
    assert len(set(fed) & set(consumers)) == 2


def _scenario(seed: int) -> list[bytes]:
    node = NSQD(NSQDOptions(msg_timeout=2.0), random.Random(seed))
    outputs: list[bytes] = []
    consumers = [node.connect(0.0, f"h:{i}") for i in range(3)]
    for index, conn in enumerate(consumers):
        sample = {"sample_rate": 50} if index == 0 else {}
        node.receive_data(
            conn,
            b"  V2"
            + frames.encode_identify({"feature_negotiation": True, **sample})
            + frames.encode_sub("t", "c")
            + frames.encode_rdy(3),
            0.0,
        )
    producer = node.connect(0.0, "p:1")
    node.receive_data(
        producer, b"  V2" + frames.encode_mpub("t", [b"%d" % i for i in range(30)]), 0.1
    )
    for step in range(10):
        node.handle_timer(step * 1.0)
        for conn in node.connections_with_output():
            outputs.append(b"%d:" % conn + node.data_to_send(conn))
    return outputs


def test_runs_replay_exactly_from_the_seed() -> None:
    assert _scenario(11) == _scenario(11)
    assert _scenario(11) != _scenario(12)  # the seed matters (sampling, id counter)

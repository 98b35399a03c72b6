"""The pure lookupd role and nsqd's side of lookup V1, wired together without sockets."""

from __future__ import annotations

import json
import struct

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from nsq_sansio.server.lookupd import (
    ClientClosed,
    ClientError,
    ClientIdentified,
    LookupConnState,
    Lookupd,
    LookupdAPIError,
    LookupdOptions,
    ProducerRegistered,
)
from nsq_sansio.server.lookupd_client import (
    LookupPeer,
    LookupPeerClosed,
    LookupPeerIdentified,
    LookupPeerState,
    NodeIdentity,
    encode_identify,
    sync_registrations,
)

IDENTITY = NodeIdentity("10.0.0.1", 4150, 4151, "host-a", "1.3.0")


def responses(data: bytes) -> list[bytes]:
    out = []
    while data:
        (size,) = struct.unpack(">i", data[:4])
        out.append(data[4 : 4 + size])
        data = data[4 + size :]
    return out


def identified(lookupd: Lookupd, addr: str = "10.0.0.1:5000", now: float = 0.0) -> int:
    h = lookupd.connect(addr, now)
    lookupd.receive_data(h, b"  V1" + encode_identify(IDENTITY), now)
    lookupd.data_to_send(h)
    return h


def test_identify_register_lookup_and_disconnect() -> None:
    lookupd = Lookupd(LookupdOptions(tcp_port=4160, http_port=4161))
    h = lookupd.connect("10.0.0.1:5000", 0.0)
    events = lookupd.receive_data(
        h, b"  V1" + encode_identify(IDENTITY) + b"REGISTER t c\nREGISTER t2\nPING\n", 1.0
    )
    assert isinstance(events[0], ClientIdentified)
    assert events[0].peer.remote_address == "10.0.0.1:5000"
    assert ProducerRegistered(h, "t", "c") in events
    answers = responses(lookupd.data_to_send(h))
    assert json.loads(answers[0])["http_port"] == 4161
    assert answers[1:] == [b"OK", b"OK", b"OK"]
    found = lookupd.lookup("t", 2.0)
    assert found["channels"] == ["c"]
    assert found["producers"] == [
        {
            "remote_address": "10.0.0.1:5000",
            "hostname": "host-a",
            "broadcast_address": "10.0.0.1",
            "tcp_port": 4150,
            "http_port": 4151,
            "version": "1.3.0",
        }
    ]
    assert lookupd.topics() == {"topics": ["t", "t2"]}
    assert lookupd.nodes(2.0)["producers"][0]["topics"] == ["t", "t2"]
    lookupd.connection_lost(h, 3.0)
    assert lookupd.lookup("t", 3.0)["producers"] == []  # key stays, producer gone
    assert lookupd.nodes(3.0) == {"producers": []}


@pytest.mark.parametrize(
    ("stream", "code"),
    [
        (b"  V2", "E_BAD_PROTOCOL"),
        (b"  V1FOO\n", "E_INVALID"),
        (b"  V1REGISTER t\n", "E_INVALID"),  # before IDENTIFY
        (b"  V1IDENTIFY\n\x00\x00\x00\x02{}", "E_BAD_BODY"),  # missing fields
        (b"  V1IDENTIFY\n\xff\xff\xff\xff", "E_BAD_BODY"),  # negative size
        (b"  V1IDENTIFY\n\x7f\xff\xff\xff", "E_BAD_BODY"),  # huge size, nothing buffered
        (b"  V1IDENTIFY\n\x00\x00\x00\x03{x}", "E_BAD_BODY"),
        (b"  V1" + b"x" * 5000, "E_INVALID"),  # endless line
    ],
)
def test_bad_input_is_a_fatal_error_answer(stream: bytes, code: str) -> None:
    lookupd = Lookupd()
    h = lookupd.connect("1.2.3.4:1", 0.0)
    events = lookupd.receive_data(h, stream, 0.0)
    errors = [e for e in events if isinstance(e, ClientError)]
    assert [e.code for e in errors] == [code]
    assert isinstance(events[-1], ClientClosed)
    assert lookupd.connection_state(h) is LookupConnState.CLOSED
    assert responses(lookupd.data_to_send(h))[-1].startswith(code.encode())


def test_bad_names_and_double_identify() -> None:
    lookupd = Lookupd()
    h = identified(lookupd)
    events = lookupd.receive_data(h, b"REGISTER bad/topic\n", 0.0)
    assert [e.code for e in events if isinstance(e, ClientError)] == ["E_BAD_TOPIC"]
    h = identified(lookupd, "1.1.1.1:2")
    events = lookupd.receive_data(h, b"REGISTER t bad/chan\n", 0.0)
    assert [e.code for e in events if isinstance(e, ClientError)] == ["E_BAD_CHANNEL"]
    h = identified(lookupd, "1.1.1.1:3")
    events = lookupd.receive_data(h, encode_identify(IDENTITY), 0.0)
    assert [e.text for e in events if isinstance(e, ClientError)] == ["cannot IDENTIFY again"]


def test_tombstone_hides_producer_until_lifetime_then_unregister_removes() -> None:
    lookupd = Lookupd(LookupdOptions(tombstone_lifetime=45.0))
    h = identified(lookupd)
    lookupd.receive_data(h, b"REGISTER t\n", 0.0)
    lookupd.tombstone_topic_producer("t", "10.0.0.1:4151", 10.0)
    assert lookupd.lookup("t", 11.0)["producers"] == []
    assert lookupd.nodes(11.0)["producers"][0]["tombstones"] == [True]
    assert len(lookupd.lookup("t", 56.0)["producers"]) == 1  # lifetime over
    lookupd.receive_data(h, b"UNREGISTER t\n", 57.0)
    assert lookupd.lookup("t", 57.0)["producers"] == []


def test_inactive_producers_are_filtered_and_ping_refreshes() -> None:
    lookupd = Lookupd(LookupdOptions(inactive_producer_timeout=10.0))
    h = identified(lookupd, now=0.0)
    lookupd.receive_data(h, b"REGISTER t\n", 0.0)
    lookupd.receive_data(h, b"PING\n", 8.0)
    assert len(lookupd.lookup("t", 15.0)["producers"]) == 1
    assert lookupd.lookup("t", 18.5)["producers"] == []
    assert lookupd.nodes(18.5) == {"producers": []}


def test_ephemeral_channel_and_topic_vanish_with_last_producer() -> None:
    lookupd = Lookupd()
    h = identified(lookupd)
    lookupd.receive_data(h, b"REGISTER t c#ephemeral\nREGISTER e#ephemeral\n", 0.0)
    lookupd.receive_data(h, b"UNREGISTER t c#ephemeral\nUNREGISTER e#ephemeral\n", 0.0)
    assert lookupd.channels("t") == {"channels": []}
    assert lookupd.topics() == {"topics": ["t"]}


def test_http_admin_actions_and_errors() -> None:
    lookupd = Lookupd()
    with pytest.raises(LookupdAPIError) as err:
        lookupd.lookup("nope", 0.0)
    assert (err.value.status, err.value.message) == (404, "TOPIC_NOT_FOUND")
    with pytest.raises(LookupdAPIError, match="MISSING_ARG_TOPIC"):
        lookupd.lookup(None, 0.0)
    with pytest.raises(LookupdAPIError, match="INVALID_ARG_CHANNEL"):
        lookupd.create_channel("t", "a b")
    lookupd.create_channel("t", "c")
    assert lookupd.lookup("t", 0.0) == {"channels": ["c"], "producers": []}
    lookupd.delete_channel("t", "c")
    with pytest.raises(LookupdAPIError, match="CHANNEL_NOT_FOUND"):
        lookupd.delete_channel("t", "c")
    lookupd.create_topic("x")
    lookupd.delete_topic("t")
    assert lookupd.topics() == {"topics": ["x"]}


STREAM = (
    b"  V1"
    + encode_identify(IDENTITY)
    + b"REGISTER a\nREGISTER a b\nPING\nUNREGISTER a b\n  PING  \nREGISTER zz\n"
)


@settings(max_examples=200)
@given(st.lists(st.integers(min_value=0, max_value=len(STREAM)), max_size=12))
def test_any_chunking_gives_same_answers(cuts: list[int]) -> None:
    points = sorted(set(cuts))
    chunks = [STREAM[a:b] for a, b in zip([0, *points], [*points, len(STREAM)], strict=True)]
    lookupd = Lookupd()
    h = lookupd.connect("9.9.9.9:9", 0.0)
    out = b""
    for chunk in chunks:
        if chunk:
            lookupd.receive_data(h, chunk, 0.0)
        out += lookupd.data_to_send(h)
    assert responses(out)[1:] == [b"OK"] * 6
    assert lookupd.topics() == {"topics": ["a", "zz"]}


@settings(max_examples=300)
@given(st.binary(max_size=300))
def test_garbage_never_raises_and_never_grows(data: bytes) -> None:
    lookupd = Lookupd(LookupdOptions(max_line_length=128))
    h = lookupd.connect("9.9.9.9:9", 0.0)
    lookupd.receive_data(h, b"  V1" + data, 0.0)
    assert lookupd.connection_state(h) in (
        LookupConnState.CONNECTED,
        LookupConnState.IDENTIFIED,
        LookupConnState.CLOSED,
    )
    assert len(lookupd._conns[h].buffer) <= 128 + 4 + 64 * 1024


def pump(peer: LookupPeer, lookupd: Lookupd, h: int, now: float) -> list[object]:
    events: list[object] = []
    for _ in range(10):
        out = peer.data_to_send()
        if not out:
            break
        lookupd.receive_data(h, out, now)
        events.extend(peer.receive_data(lookupd.data_to_send(h), now))
    return events


def test_peer_against_role_registers_resyncs_and_pings() -> None:
    lookupd = Lookupd(LookupdOptions(http_port=7777, broadcast_address="lk"))
    peer = LookupPeer("lk:4160", IDENTITY, ping_interval=15.0)
    assert peer.wants_connect(0.0)
    h = lookupd.connect("10.0.0.1:1", 0.0)
    peer.connection_made(0.0, sync_registrations([("t", ["c1", "c2"]), ("u", [])]))
    events = pump(peer, lookupd, h, 0.0)
    assert isinstance(events[0], LookupPeerIdentified)
    assert peer.info is not None and peer.info.http_address == "lk:7777"
    assert lookupd.lookup("t", 0.0)["channels"] == ["c1", "c2"]
    assert lookupd.topics() == {"topics": ["t", "u"]}
    assert peer.register(1.0, "v", "w")
    assert peer.unregister(1.0, "u")
    pump(peer, lookupd, h, 1.0)
    assert lookupd.channels("v") == {"channels": ["w"]}
    assert lookupd.lookup("u", 1.0)["producers"] == []
    assert peer.next_deadline() == 15.0
    peer.handle_timer(15.0)
    assert peer.data_to_send() == b"PING\n"


def test_peer_closes_on_silence_and_errors_and_backs_off() -> None:
    peer = LookupPeer("x:1", IDENTITY, response_timeout=2.0, reconnect_min=1.0, reconnect_max=4.0)
    peer.connection_made(0.0)
    assert peer.next_deadline() == 2.0
    events = peer.handle_timer(2.0)
    assert isinstance(events[0], LookupPeerClosed)
    assert peer.state is LookupPeerState.DISCONNECTED
    assert not peer.wants_connect(2.5) and peer.wants_connect(3.0)
    assert peer.register(3.0, "t") is False  # dropped while down, resynced on connect
    peer.connection_made(3.0)
    peer.data_to_send()
    events = peer.receive_data(struct.pack(">i", 9) + b"E_INVALID", 3.0)
    assert isinstance(events[0], LookupPeerClosed) and events[0].reconnect_at == 5.0
    peer.connection_made(5.0)
    events = peer.receive_data(b"\x7f\xff\xff\xff", 5.0)
    assert isinstance(events[0], LookupPeerClosed)
    assert events[0].reconnect_at == 9.0  # capped at reconnect_max


from hypothesis.stateful import RuleBasedStateMachine, invariant, rule  # noqa: E402

TOPICS = st.sampled_from(["a", "b", "c#ephemeral"])
CHANNELS = st.sampled_from([None, "x", "y#ephemeral"])


class LookupdMachine(RuleBasedStateMachine):
    """Random nsqds connect, identify, register, unregister and vanish; the registry must
    always list exactly the live peers' registrations (a model kept alongside)."""

    def __init__(self) -> None:
        super().__init__()
        self.lookupd = Lookupd(LookupdOptions(inactive_producer_timeout=1e9))
        self.model: dict[int, set[tuple[str, str | None]]] = {}
        self.identified: set[int] = set()
        self.port = 1000

    @rule()
    def connect(self) -> None:
        self.port += 1
        h = self.lookupd.connect(f"10.0.0.1:{self.port}", 0.0)
        ident = NodeIdentity("10.0.0.1", self.port, self.port + 1, "h", "1")
        self.lookupd.receive_data(h, b"  V1" + encode_identify(ident), 0.0)
        self.model[h] = set()
        self.identified.add(h)

    @rule(data=st.data(), topic=TOPICS, channel=CHANNELS)
    def register(self, data: st.DataObject, topic: str, channel: str | None) -> None:
        if not self.model:
            return
        h = data.draw(st.sampled_from(sorted(self.model)))
        line = f"REGISTER {topic} {channel}\n" if channel else f"REGISTER {topic}\n"
        self.lookupd.receive_data(h, line.encode(), 0.0)
        self.model[h] |= {(topic, channel), (topic, None)}

    @rule(data=st.data(), topic=TOPICS, channel=CHANNELS)
    def unregister(self, data: st.DataObject, topic: str, channel: str | None) -> None:
        if not self.model:
            return
        h = data.draw(st.sampled_from(sorted(self.model)))
        line = f"UNREGISTER {topic} {channel}\n" if channel else f"UNREGISTER {topic}\n"
        self.lookupd.receive_data(h, line.encode(), 0.0)
        if channel:
            self.model[h].discard((topic, channel))
        else:
            self.model[h] = {(t, c) for t, c in self.model[h] if t != topic}

    @rule(data=st.data(), garbage=st.binary(min_size=1, max_size=20))
    def misbehave_or_vanish(self, data: st.DataObject, garbage: bytes) -> None:
        if not self.model:
            return
        h = data.draw(st.sampled_from(sorted(self.model)))
        if data.draw(st.booleans()):
            # a NUL first byte makes it an invalid command: always fatal
            self.lookupd.receive_data(h, b"\x00" + garbage + b"\n", 0.0)
            assert self.lookupd.connection_state(h) is LookupConnState.CLOSED
        else:
            self.lookupd.connection_lost(h, 0.0)
        if self.lookupd.connection_state(h) is LookupConnState.CLOSED:
            del self.model[h]
            self.lookupd.release(h)

    @invariant()
    def registry_matches_live_peers(self) -> None:
        for topic in ("a", "b", "c#ephemeral"):
            expected_topic = {h for h, regs in self.model.items() if (topic, None) in regs}
            try:
                producers = self.lookupd.lookup(topic, 0.0)["producers"]
            except LookupdAPIError:
                producers = []
            assert len(producers) == len(expected_topic)
        nodes = self.lookupd.nodes(0.0)["producers"]
        assert len(nodes) == len(self.model)
        for h in self.model:
            self.lookupd.data_to_send(h)  # drain answers, as a transport would


TestLookupdMachine = LookupdMachine.TestCase
TestLookupdMachine.settings = settings(max_examples=60, stateful_step_count=30, deadline=None)


def test_peer_overloaded_with_unanswered_commands_reconnects_instead_of_dropping() -> None:
    peer = LookupPeer("x:1", IDENTITY, max_pending=3)
    peer.connection_made(0.0)  # IDENTIFY is pending
    assert peer.register(0.0, "a") and peer.register(0.0, "b")
    assert peer.register(0.0, "c") is False
    assert peer.state is LookupPeerState.DISCONNECTED  # resync on the next connection
    lookupd = Lookupd()
    h = lookupd.connect("1.1.1.1:1", 1.0)
    peer.connection_made(1.0, [("a", None), ("b", None), ("c", None)])
    lookupd.receive_data(h, peer.data_to_send(), 1.0)
    assert lookupd.topics() == {"topics": ["a", "b", "c"]}

"""Bad input and vanishing clients: nsqd's error (or close), others unaffected, nothing lost."""

from __future__ import annotations

import socket
import struct

import pytest

from .conftest import Target
from .wire import Closed, RawConn, unique

MAX_RDY = 2500  # nsqd's default --max-rdy-count


@pytest.fixture
def bystander(target: Target):  # type: ignore[no-untyped-def]
    """A healthy consumer that must keep working while others misbehave."""
    topic, channel = unique("bystander"), unique("c")
    conn = RawConn(target.tcp)
    conn.identify()
    conn.sub(topic, channel)
    conn.command("RDY 100")
    yield conn, topic
    conn.close()


def publish(target: Target, topic: str, body: bytes) -> None:
    """Publish on a separate connection (its OK never races a delivery)."""
    with RawConn(target.tcp) as p:
        p.pub(topic, body)
        p.expect_ok()


def still_served(target: Target, bystander: tuple[RawConn, str]) -> None:
    conn, topic = bystander
    with RawConn(target.tcp) as p:
        p.pub(topic, b"ping")
        p.expect_ok()
    assert conn.read_message().body == b"ping"


FATAL_CASES = [
    ("bad magic", b"  V9", None, "E_BAD_PROTOCOL"),
    ("unknown command", b"", b"WAT\n", "E_INVALID"),
    ("empty command line", b"", b"\n", "E_INVALID"),
    ("bad topic name", b"", b"PUB bad/topic\n\x00\x00\x00\x01x", "E_BAD_TOPIC"),
    ("topic name too long", b"", b"PUB " + b"t" * 65 + b"\n\x00\x00\x00\x01x", "E_BAD_TOPIC"),
    ("empty pub body", b"", b"PUB t\n\x00\x00\x00\x00", "E_BAD_MESSAGE"),
    ("negative pub size", b"", b"PUB t\n\xff\xff\xff\xff", "E_BAD_MESSAGE"),
    ("pub above max-msg-size", b"", b"PUB t\n" + struct.pack(">i", 1_048_577), "E_BAD_MESSAGE"),
    ("mpub zero messages", b"", b"MPUB t\n\x00\x00\x00\x04\x00\x00\x00\x00", "E_BAD_BODY"),
    ("mpub above max-body-size", b"", b"MPUB t\n" + struct.pack(">i", 5_242_881), "E_BAD_BODY"),
    ("dpub bad timeout", b"", b"DPUB t notanumber\n\x00\x00\x00\x01x", "E_INVALID"),
    ("pub missing topic", b"", b"PUB\n\x00\x00\x00\x01x", "E_INVALID"),
    ("rdy before sub", b"", b"RDY 1\n", "E_INVALID"),
    ("fin before sub", b"", b"FIN 0123456789abcdef\n", "E_INVALID"),
    ("sub bad channel", b"", b"SUB t bad/chan\n", "E_BAD_CHANNEL"),
    ("sub missing channel", b"", b"SUB t\n", "E_INVALID"),
    ("identify bad json", b"", b"IDENTIFY\n\x00\x00\x00\x03{x}", "E_BAD_BODY"),
    ("identify huge size", b"", b"IDENTIFY\n\x7f\xff\xff\xff", "E_BAD_BODY"),
]


@pytest.mark.parametrize(
    ("magic", "data", "code"), [c[1:] for c in FATAL_CASES], ids=[c[0] for c in FATAL_CASES]
)
def test_fatal_errors_close_only_that_client(
    target: Target, bystander: tuple[RawConn, str], magic: bytes, data: bytes | None, code: str
) -> None:
    with RawConn(target.tcp, magic=magic or b"  V2") as bad:
        if data:
            bad.send(data)
        bad.expect_error(code)
        bad.expect_closed()
    still_served(target, bystander)


def subscribed(target: Target) -> RawConn:
    conn = RawConn(target.tcp)
    conn.sub(unique(), unique("c"))
    return conn


@pytest.mark.parametrize(
    ("line", "code"),
    [
        (f"RDY {MAX_RDY + 1}", "E_INVALID"),
        ("RDY -1", "E_INVALID"),
        ("RDY lots", "E_INVALID"),
        ("FIN tooshort", "E_INVALID invalid message ID"),
        ("REQ tooshort 0", "E_INVALID invalid message ID"),
        ("TOUCH tooshort", "E_INVALID invalid message ID"),
        ("SUB again c", "E_INVALID"),
    ],
)
def test_fatal_errors_when_subscribed(
    target: Target, bystander: tuple[RawConn, str], line: str, code: str
) -> None:
    with subscribed(target) as conn:
        conn.command(line)
        data = conn.expect_error(code.split(" ", 1)[0])
        assert data.startswith(code.encode()), data
        conn.expect_closed()
    still_served(target, bystander)


@pytest.mark.parametrize(
    ("line", "code"),
    [
        ("FIN 0123456789abcdef", "E_FIN_FAILED"),
        ("REQ 0123456789abcdef 0", "E_REQ_FAILED"),
        ("TOUCH 0123456789abcdef", "E_TOUCH_FAILED"),
    ],
)
def test_unknown_message_ids_are_not_fatal(target: Target, line: str, code: str) -> None:
    topic = unique()
    with RawConn(target.tcp) as conn:
        conn.sub(topic, unique("c"))
        conn.command(line)
        conn.expect_error(code)
        # the connection is still usable
        conn.command("RDY 1")
        publish(target, topic, b"after")
        assert conn.read_message().body == b"after"


def test_rdy_at_max_is_accepted(target: Target) -> None:
    topic = unique()
    with RawConn(target.tcp) as conn:
        conn.sub(topic, unique("c"))
        conn.command(f"RDY {MAX_RDY}")
        publish(target, topic, b"ok")
        assert conn.read_message().body == b"ok"


def test_req_timeout_above_max_is_clamped_not_fatal(target: Target) -> None:
    topic = unique()
    with RawConn(target.tcp) as conn:
        conn.pub(topic, b"x")
        conn.expect_ok()
        conn.sub(topic, unique("c"))
        conn.command("RDY 1")
        msg = conn.read_message()
        conn.command(f"REQ {msg.id.decode()} {3_600_001}")  # nsqd >= 1.1 clamps to max
        assert conn.nothing_within(0.3)
        publish(target, topic, b"y")
        assert conn.read_message().body == b"y"


@pytest.mark.parametrize(
    "partial",
    [b"PU", b"PUB t", b"PUB t\n\x00\x00", b"PUB t\n\x00\x00\x00\x10abc", b"IDENTIFY\n\x00\x00\x00"],
)
def test_client_vanishing_mid_frame_publishes_nothing(
    target: Target, bystander: tuple[RawConn, str], partial: bytes
) -> None:
    topic, channel = unique(), unique("c")
    with RawConn(target.tcp) as watcher:
        watcher.sub(topic, channel)
        watcher.command("RDY 10")
        vanisher = RawConn(target.tcp)
        vanisher.send(partial.replace(b" t", f" {topic}".encode()))
        vanisher.sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, struct.pack("ii", 1, 0))
        vanisher.close()  # RST
        assert watcher.nothing_within(0.3)
        still_served(target, bystander)


def test_in_flight_messages_of_a_vanished_consumer_are_redelivered(target: Target) -> None:
    topic, channel = unique(), unique("c")
    with RawConn(target.tcp) as p:
        p.mpub(topic, [b"a", b"b", b"c"])
        p.expect_ok()
    first = RawConn(target.tcp)
    first.identify(msg_timeout=1000)
    first.sub(topic, channel)
    first.command("RDY 3")
    taken = {first.read_message().body for _ in range(3)}
    assert taken == {b"a", b"b", b"c"}
    first.close()  # vanishes with all three in flight, none FIN'd
    with RawConn(target.tcp) as second:
        second.sub(topic, channel)
        second.command("RDY 3")
        again = [second.read_message() for _ in range(3)]
        assert {m.body for m in again} == taken
        assert all(m.attempts == 2 for m in again)


def test_in_flight_message_times_out_and_comes_back(target: Target) -> None:
    topic, channel = unique(), unique("c")
    with RawConn(target.tcp) as c:
        c.identify(msg_timeout=1000)
        c.pub(topic, b"slow")
        c.expect_ok()
        c.sub(topic, channel)
        c.command("RDY 2")
        first = c.read_message()
        second = c.read_message()  # redelivered after the 1 s timeout, nobody FIN'd
        assert second.id == first.id and second.attempts == 2
        c.command(f"FIN {second.id.decode()}")
        c.command(f"FIN {second.id.decode()}")
        c.expect_error("E_FIN_FAILED")  # finished already: no longer in flight
        assert c.nothing_within(0.3)


def test_many_misbehaving_clients_at_once(target: Target, bystander: tuple[RawConn, str]) -> None:
    conns = [RawConn(target.tcp) for _ in range(20)]
    for i, conn in enumerate(conns):
        conn.send([b"WAT\n", b"PUB x/y\n", b"RDY 1\n", b"\x00" * 100 + b"\n"][i % 4])
    for conn in conns:
        conn.expect_closed()
        conn.close()
    still_served(target, bystander)


def test_client_ignoring_heartbeats_is_disconnected(
    target: Target, bystander: tuple[RawConn, str]
) -> None:
    topic, channel = unique(), unique("c")
    with RawConn(target.tcp) as p:
        p.pub(topic, b"held")
        p.expect_ok()
    with RawConn(target.tcp) as zombie:
        zombie.identify(heartbeat_interval=1000, msg_timeout=1000)
        zombie.sub(topic, channel)
        zombie.command("RDY 1")
        # never answer a heartbeat: nsqd closes after two unanswered ones
        frames = []
        with pytest.raises(Closed, match="closed"):
            while True:
                frames.append(zombie.read_frame(skip_heartbeats=False))
        assert (0, b"_heartbeat_") in frames
    # the message it held goes back to the channel
    with RawConn(target.tcp) as c:
        c.sub(topic, channel)
        c.command("RDY 1")
        msg = c.read_message()
        assert msg.body == b"held" and msg.attempts >= 2  # may have timed out on the zombie too
    still_served(target, bystander)

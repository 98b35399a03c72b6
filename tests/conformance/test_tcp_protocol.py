"""Protocol V2 as the TCP spec describes it, checked byte by byte over loopback."""

from __future__ import annotations

import struct

from .conftest import Target
from .wire import FRAME_ERROR, FRAME_RESPONSE, RawConn, unique


def test_identify_negotiates_features(target: Target) -> None:
    with RawConn(target.tcp) as c:
        info = c.identify(client_id="conformance", heartbeat_interval=5000)
        assert isinstance(info, dict)
        for key in (
            "max_rdy_count",
            "version",
            "max_msg_timeout",
            "msg_timeout",
            "tls_v1",
            "deflate",
            "snappy",
            "sample_rate",
            "auth_required",
            "output_buffer_size",
            "output_buffer_timeout",
            "max_deflate_level",
        ):
            assert key in info, key
        assert info["max_rdy_count"] >= 1 and info["tls_v1"] is False


def test_identify_without_feature_negotiation_answers_ok(target: Target) -> None:
    with RawConn(target.tcp) as c:
        assert c.identify(feature_negotiation=False) == b"OK"


def test_pub_sub_rdy_fin(target: Target) -> None:
    topic, channel = unique(), unique("c")
    with RawConn(target.tcp) as consumer, RawConn(target.tcp) as producer:
        consumer.identify()
        consumer.sub(topic, channel)
        consumer.command("RDY 10")
        producer.pub(topic, b"hello")
        producer.expect_ok()
        msg = consumer.read_message()
        assert (msg.body, msg.attempts, len(msg.id)) == (b"hello", 1, 16)
        assert msg.timestamp > 0
        consumer.command(f"FIN {msg.id.decode()}")
        assert consumer.nothing_within(0.3)  # FIN has no answer and nothing is redelivered


def test_mpub_delivers_every_body_in_order(target: Target) -> None:
    topic, channel = unique(), unique("c")
    bodies = [f"m{i}".encode() * 10 for i in range(50)]
    with RawConn(target.tcp) as consumer, RawConn(target.tcp) as producer:
        producer.mpub(topic, bodies)
        producer.expect_ok()
        consumer.sub(topic, channel)
        consumer.command("RDY 100")
        got = [consumer.read_message() for _ in bodies]
        assert [m.body for m in got] == bodies
        assert len({m.id for m in got}) == len(bodies)


def test_req_redelivers_with_more_attempts_and_touch_is_silent(target: Target) -> None:
    topic, channel = unique(), unique("c")
    with RawConn(target.tcp) as c:
        c.pub(topic, b"again")
        c.expect_ok()
        c.sub(topic, channel)
        c.command("RDY 1")
        first = c.read_message()
        c.command(f"TOUCH {first.id.decode()}")
        c.command(f"REQ {first.id.decode()} 0")
        second = c.read_message()
        assert second.id == first.id and second.body == b"again"
        assert second.attempts == first.attempts + 1
        c.command(f"FIN {second.id.decode()}")


def test_dpub_is_held_back_until_its_delay(target: Target) -> None:
    topic, channel = unique(), unique("c")
    with RawConn(target.tcp) as c:
        c.sub(topic, channel)
        c.command("RDY 1")
        with RawConn(target.tcp) as p:
            p.command(f"DPUB {topic} 1500", b"later")
            p.expect_ok()
        assert c.nothing_within(0.5)
        msg = c.read_message()
        assert msg.body == b"later"


def test_messages_are_spread_not_duplicated_across_consumers_of_a_channel(target: Target) -> None:
    topic, channel = unique(), unique("c")
    with RawConn(target.tcp) as a, RawConn(target.tcp) as b, RawConn(target.tcp) as p:
        for conn in (a, b):
            conn.sub(topic, channel)
            conn.command("RDY 1")
        p.pub(topic, b"one")
        p.expect_ok()
        p.pub(topic, b"two")
        p.expect_ok()
        got = {a.read_message().body, b.read_message().body}
        assert got == {b"one", b"two"}


def test_every_channel_gets_a_copy(target: Target) -> None:
    topic = unique()
    with RawConn(target.tcp) as a, RawConn(target.tcp) as b, RawConn(target.tcp) as p:
        a.sub(topic, "first")
        b.sub(topic, "second")
        for conn in (a, b):
            conn.command("RDY 1")
        p.pub(topic, b"copy")
        p.expect_ok()
        assert a.read_message().body == b.read_message().body == b"copy"


def test_rdy_zero_pauses_delivery(target: Target) -> None:
    topic, channel = unique(), unique("c")
    with RawConn(target.tcp) as c:
        c.sub(topic, channel)
        c.command("RDY 0")
        c.pub(topic, b"x")
        c.expect_ok()
        assert c.nothing_within(0.3)
        c.command("RDY 1")
        assert c.read_message().body == b"x"


def test_heartbeats_arrive_and_nop_keeps_connection(target: Target) -> None:
    with RawConn(target.tcp) as c:
        c.identify(heartbeat_interval=1000)
        kind, data = c.read_frame(skip_heartbeats=False)
        assert (kind, data) == (FRAME_RESPONSE, b"_heartbeat_")
        c.command("NOP")
        c.pub(unique(), b"still alive")
        c.expect_ok()


def test_cls_answers_close_wait(target: Target) -> None:
    with RawConn(target.tcp) as c:
        c.sub(unique(), unique("c"))
        c.command("CLS")
        assert c.read_frame() == (FRAME_RESPONSE, b"CLOSE_WAIT")


def test_pub_without_identify_and_ephemeral_names(target: Target) -> None:
    with RawConn(target.tcp) as c:
        c.pub(unique() + "#ephemeral", b"gone")
        c.expect_ok()
        c.sub(unique() + "#ephemeral", "ch#ephemeral")


def test_large_message_round_trips(target: Target) -> None:
    topic, channel = unique(), unique("c")
    body = bytes(range(256)) * 4000  # ~1 MB, under nsqd's default 1 MiB max
    with RawConn(target.tcp) as c:
        c.pub(topic, body)
        c.expect_ok()
        c.sub(topic, channel)
        c.command("RDY 1")
        assert c.read_message().body == body


def test_error_frame_layout(target: Target) -> None:
    with RawConn(target.tcp) as c:
        c.send(b"BOGUS\n")
        raw = b""
        c._fill(8)
        raw = c.buf
        size, kind = struct.unpack(">ii", raw[:8])
        assert kind == FRAME_ERROR and size >= 4

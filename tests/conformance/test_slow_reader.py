"""A subscriber that never reads holds only what the socket buffers take, not its whole RDY.

nsqd's messagePump blocks in its write to a client whose socket is full, so messages beyond
that stay in the channel (``depth``), and the broker keeps serving every other client.
"""

from __future__ import annotations

import socket
import time

from .conftest import Target
from .wire import RawConn, http_json, unique, wait_for

SIZE = 256 * 1024
COUNT = 100  # 25 MiB: far more than loopback socket buffers hold


def _channel(target: Target, topic: str, channel: str) -> dict[str, int]:
    stats = http_json(target.http, "GET", f"/stats?format=json&topic={topic}")
    for ch in stats["topics"][0]["channels"]:
        if ch["channel_name"] == channel:
            return ch  # type: ignore[no-any-return]
    raise AssertionError(f"no channel {channel}")


def _read_and_fin(conn: RawConn, count: int) -> list[bytes]:
    bodies = []
    for _ in range(count):
        msg = conn.read_message()
        bodies.append(msg.body)
        conn.command("FIN " + msg.id.decode())
    return bodies


def test_a_subscriber_that_never_reads_holds_a_few_messages_the_rest_stays_in_depth(
    target: Target,
) -> None:
    topic = unique()
    stuck = RawConn(target.tcp)
    try:
        stuck.sock.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 64 * 1024)
        stuck.identify()
        stuck.sub(topic, "c")
        stuck.command("RDY 2500")
        with RawConn(target.tcp) as other:
            other.identify()
            other.sub(topic, "other")
            other.command("RDY 200")
            bodies = [b"%06d" % i + b"x" * (SIZE - 6) for i in range(COUNT)]
            with RawConn(target.tcp) as producer:
                producer.identify()
                for body in bodies:
                    producer.pub(topic, body)
                    producer.expect_ok()
                # meanwhile the broker kept serving another channel's reader
                assert _read_and_fin(other, COUNT) == bodies

            seen: list[int] = []

            def settled() -> dict[str, int] | None:
                # every message stored, and the stuck client's share unchanged for 0.5 s: its
                # socket buffers are full and its delivery loop is blocked (on a loaded machine
                # it is still taking messages when the counts first add up)
                ch = _channel(target, topic, "c")
                if ch["depth"] + ch["in_flight_count"] != COUNT:
                    return None
                stable = seen[-1:] == [ch["in_flight_count"]]
                seen.append(ch["in_flight_count"])
                if stable:
                    return ch
                time.sleep(0.5)
                return None

            ch = wait_for(settled)
            # what the stuck client holds is bounded by socket buffers (a few MiB), not RDY
            assert ch["in_flight_count"] <= 40, ch
            assert ch["depth"] >= COUNT - 40
            held = ch["in_flight_count"]
            # a reading client of the same channel gets all the rest, in order
            with RawConn(target.tcp) as reader:
                reader.identify()
                reader.sub(topic, "c")
                reader.command("RDY 200")
                got = _read_and_fin(reader, COUNT - held)
                assert got == bodies[held:]

                def only_the_stuck_share_left() -> dict[str, int] | None:
                    # the reader's last FINs are sent, not yet applied: read until they are
                    # (a stuck share that grew never matches, and fails after the timeout)
                    ch = _channel(target, topic, "c")
                    return ch if ch["depth"] == 0 and ch["in_flight_count"] == held else None

                ch = wait_for(only_the_stuck_share_left)
                assert ch["depth"] == 0
                assert ch["in_flight_count"] == held
    finally:
        stuck.close()

"""Whatever nsqd or a lookupd sends, the coordinator never raises, never hangs, and keeps its
RDY budget; a broken connection is dropped and retried."""

from __future__ import annotations

import os
import random

from hypothesis import given, settings
from hypothesis import strategies as st

from nsq_sansio.config import Config
from nsq_sansio.consumer import Connect, ConsumerCoordinator, Deliver, SendHTTPRequest
from nsq_sansio.frames import encode_frame, encode_message_frame

MESSAGES = st.builds(
    lambda i, attempts, body: encode_message_frame(b"%016x" % i, 0, attempts, body),
    st.integers(0, 5),
    st.integers(0, 9),
    st.binary(max_size=8),
)
FRAMES = st.one_of(
    MESSAGES,
    MESSAGES,
    MESSAGES,
    st.just(encode_frame(0, b"_heartbeat_")),
    st.just(encode_frame(1, b"E_FIN_FAILED FIN 0123456789abcdef failed")),
    st.sampled_from(
        [
            encode_frame(0, b'{"max_rdy_count": 3, "msg_timeout": 5000}'),
            encode_frame(0, b"OK"),
            encode_frame(0, b"CLOSE_WAIT"),
            encode_frame(1, b"E_INVALID nope"),
        ]
    ),
    st.binary(max_size=24),
)


@settings(max_examples=int(os.environ.get("CONSUMER_EXAMPLES", "150")), deadline=None)
@given(
    frames=st.lists(FRAMES, max_size=25),
    cuts=st.lists(st.integers(1, 40), max_size=10),
    answers=st.lists(
        st.sampled_from(["fin", "req", "touch", "timer", "mif", "drain"]), max_size=12
    ),
    lookup=st.binary(max_size=120),
    seed=st.integers(0, 100),
    handshake=st.booleans(),
)
def test_garbage_never_raises(
    frames: list[bytes],
    cuts: list[int],
    answers: list[str],
    lookup: bytes,
    seed: int,
    handshake: bool,
) -> None:
    config = Config(max_in_flight=5, max_attempts=3, heartbeat_interval=1.0)
    c = ConsumerCoordinator(
        "t", "c", config, rng=random.Random(seed), nsqd=["a:1", "b:1"], lookupd=["l:1"]
    )
    now = 0.0
    c.start(now)
    actions = c.take_actions()
    conns = [a.conn_id for a in actions if isinstance(a, Connect)]
    http = [a.request_id for a in actions if isinstance(a, SendHTTPRequest)]
    for conn_id in conns:
        c.connection_made(conn_id, now)
    if handshake:  # a proper IDENTIFY answer and SUB OK first, so messages can flow
        for conn_id in conns:
            c.receive_data(conn_id, encode_frame(0, b'{"max_rdy_count": 3}'), now)
            c.receive_data(conn_id, encode_frame(0, b"OK"), now)
    c.http_data(http[0], lookup, now)
    c.http_data(http[0], b"", now)
    stream = b"".join(frames)
    held: list[Deliver] = []
    pos = 0
    # The first connection gets the stream cut anywhere, the second gets it whole.
    pieces = [(conns[0], cut) for cut in [*cuts, len(stream)]] + [(conns[1], len(stream))]
    for conn_id, cut in pieces:
        if conn_id == conns[1]:
            pos = 0
        now += 0.3
        piece, pos = stream[pos : pos + cut], pos + cut
        c.receive_data(conn_id, piece, now)
        held.extend(a for a in c.take_actions() if isinstance(a, Deliver))
        c.pending_data()
        assert c.total_rdy <= c.max_in_flight
    for answer in answers:
        now += 0.7
        if answer == "fin" and held:
            c.finish(held.pop(), now)
        elif answer == "req" and held:
            c.requeue(held.pop(0), now)
        elif answer == "touch" and held:
            c.touch(held[0], now)
        elif answer == "timer":
            c.handle_timer(now)
        elif answer == "mif":
            c.set_max_in_flight(int(now) % 4, now)
        elif answer == "drain":
            c.drain(now, timeout=1.0)
        c.take_actions()
        c.pending_data()
        assert c.total_rdy <= c.max_in_flight
    # Timers always make progress: a bounded number of wake-ups drains everything.
    c.drain(now, timeout=1.0)
    for _ in range(50):
        deadline = c.next_deadline()
        if deadline is None:
            break
        now = max(now, deadline)
        c.handle_timer(now)
        c.take_actions()
        c.pending_data()
    assert c.next_deadline() is None
    assert c.connection_ids() == []

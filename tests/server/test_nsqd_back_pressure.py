"""Output back-pressure: a subscriber that does not take its output holds only a few messages.

nsqd's messagePump blocks in its socket write once bufio and the kernel buffer are full, so a
client that reads nothing never gets its whole RDY pushed into memory. The pure node does the
same with ``data_to_send``: deliveries to a connection pause while its untaken output is at the
high-water mark and resume when the transport takes it. Virtual time, no sockets.
"""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from nsq_sansio import frames
from nsq_sansio.server import NSQD

from ._wire import MESSAGE, Client, make_node

BIG = 100_000  # one message alone is past the 64 KiB high-water mark
HIGH_WATER = 64 * 1024


def _channel(node: NSQD, channel: str = "c", topic: str = "t") -> dict[str, int]:
    (found,) = node.stats(0.0, topic=topic, channel=channel)["topics"][0]["channels"]
    return found  # type: ignore[no-any-return]


def _publish(node: NSQD, count: int, size: int, now: float = 0.0) -> list[bytes]:
    producer = Client(node, now)
    bodies = [b"%06d" % i + b"x" * (size - 6) for i in range(count)]
    for body in bodies:
        assert producer.pub("t", body, now) == b"OK"
    return bodies


def test_a_subscriber_that_takes_nothing_holds_one_big_message_and_the_rest_stays_queued() -> None:
    node = make_node()
    stuck = Client(node)
    stuck.sub("t", "c", rdy=2500)
    stuck.raw()  # the SUB answer was written; from here on nothing is taken
    bodies = _publish(node, 50, BIG)
    assert node.output_pending(stuck.id) == 34 + BIG  # one message, not 50
    ch = _channel(node)
    assert (ch["in_flight_count"], ch["depth"]) == (1, 49)
    # the node keeps serving others: another channel gets every message, and a reading
    # client of the same channel gets what the stuck one does not hold
    reader = Client(node)
    reader.sub("t", "c", rdy=100)
    got: list[bytes] = []
    while len(got) < 49:
        batch = reader.messages()
        assert batch
        got += [m.body for m in batch]
        for m in batch:
            reader.send(frames.encode_fin(m.id))
    assert got == bodies[1:]
    assert (_channel(node)["depth"], _channel(node)["in_flight_count"]) == (0, 1)
    assert node.output_pending(stuck.id) == 34 + BIG  # still just the one


def test_taking_the_output_resumes_deliveries_in_order_up_to_rdy() -> None:
    node = make_node(msg_timeout=30.0)
    consumer = Client(node)
    consumer.sub("t", "c", rdy=20)
    consumer.raw()
    bodies = _publish(node, 30, BIG)
    node.connections_with_output()
    got: list[bytes] = []
    now = 0.0
    while True:
        now += 1.0
        data = node.data_to_send(consumer.id, now)  # the previous write finished at `now`
        if not data:
            break
        got += [
            frames.decode_message(payload).body
            for kind, payload in consumer.decoder.feed(data)
            if kind == MESSAGE
        ]
        # the resumed delivery is announced like any other output
        assert node.output_pending(consumer.id) == 0 or consumer.id in (
            node.connections_with_output()
        )
        assert node.output_pending(consumer.id) <= 34 + BIG
    assert got == bodies[:20]  # RDY 20 respected, FIFO kept
    assert (_channel(node)["in_flight_count"], _channel(node)["depth"]) == (20, 10)
    # deliveries resumed by data_to_send are timed from its `now`: the one taken at now=20
    # (delivered when message 19 was taken) times out at 19 + 30, not at 0 + 30
    node.handle_timer(30.5)
    assert _channel(node)["timeout_count"] == 1  # only the first, delivered at 0
    node.handle_timer(48.5)
    assert _channel(node)["timeout_count"] == 19
    node.handle_timer(49.5)
    assert _channel(node)["timeout_count"] == 20


def test_small_messages_fill_up_to_the_high_water_mark_then_wait() -> None:
    node = make_node()
    consumer = Client(node)
    consumer.sub("t", "c", rdy=2500)
    consumer.raw()
    producer = Client(node)
    producer.send(frames.encode_mpub("t", [b"y" * 100] * 2000))
    frame = 34 + 100
    held = -(-HIGH_WATER // frame)  # stops at the first frame that reaches the mark
    assert node.output_pending(consumer.id) == held * frame
    assert _channel(node)["in_flight_count"] == held
    assert _channel(node)["depth"] == 2000 - held
    total = len(consumer.messages())  # take it: the next batch is queued at once
    assert total == held
    assert node.output_pending(consumer.id) == held * frame
    while node.output_pending(consumer.id):
        total += len(consumer.messages())
    assert total == 2000


def test_identify_output_buffer_size_above_the_minimum_raises_the_mark() -> None:
    node = make_node(max_output_buffer_size=256 * 1024)
    consumer = Client(node)
    consumer.identify(output_buffer_size=200_000)
    consumer.sub("t", "c", rdy=2500)
    consumer.raw()
    _publish(node, 10, BIG)
    assert _channel(node)["in_flight_count"] == 2  # 100 KB < 200 000, 200 KB is past it


def test_mem_queue_size_zero_keeps_the_held_back_messages_in_the_backend() -> None:
    node = make_node(mem_queue_size=0)
    consumer = Client(node)
    consumer.sub("t", "c", rdy=2500)
    consumer.raw()
    _publish(node, 20, BIG)
    ch = _channel(node)
    assert (ch["in_flight_count"], ch["backend_depth"], ch["depth"]) == (1, 19, 19)


def test_back_pressure_poll_brings_the_driver_back_then_stops() -> None:
    """While a client is held back its timer comes due (1 ms, doubling to 250 ms while
    nothing is taken), so a transport that only looks at connections_with_output after
    its calls still sends what data_to_send queued; when nothing is held back it stops."""
    node = make_node(client_timeout=60.0)
    consumer = Client(node)
    consumer.sub("t", "c", rdy=5)
    consumer.raw()
    _publish(node, 5, BIG, now=1.0)
    assert node.next_deadline() == 1.001
    now = 1.001
    steps = []
    for _ in range(12):  # nothing taken: backing off
        node.handle_timer(now)
        deadline = node.next_deadline()
        assert deadline is not None
        steps.append(round(deadline - now, 6))
        now = deadline
    assert steps[:3] == [0.002, 0.004, 0.008]
    assert steps[-1] == 0.25
    node.data_to_send(consumer.id, now)  # taken: the next message is queued
    node.handle_timer(now + 0.25)
    assert node.next_deadline() == now + 0.25 + 0.001  # progress: come back soon
    while node.output_pending(consumer.id):
        node.data_to_send(consumer.id, now)
    node.handle_timer(now + 1)
    node.handle_timer(now + 2)  # nothing held back any more: only the heartbeat is left
    assert node.next_deadline() == 30.0


def test_rdy_change_and_fin_while_held_back_deliver_nothing_until_taken() -> None:
    node = make_node()
    consumer = Client(node)
    consumer.sub("t", "c", rdy=1)
    consumer.raw()
    _publish(node, 5, BIG)
    (first,) = consumer.messages()
    consumer.send(frames.encode_rdy(10))
    assert node.output_pending(consumer.id) == 34 + BIG  # RDY 10: one more, then wait
    consumer.send(frames.encode_fin(first.id))
    assert node.output_pending(consumer.id) == 34 + BIG  # FIN frees a slot, output does not
    assert len(consumer.messages()) == 1
    assert node.output_pending(consumer.id) == 34 + BIG  # taken: the next one is queued


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.one_of(
            st.tuples(st.just("pub"), st.integers(1, 3), st.integers(1, 90_000)),
            st.tuples(st.just("take"), st.integers(0, 2), st.booleans()),
            st.tuples(st.just("rdy"), st.integers(0, 2), st.integers(0, 50)),
        ),
        max_size=60,
    )
)
def test_random_takes_keep_output_bounded_and_lose_nothing(
    ops: list[tuple[str, int, int]],
) -> None:
    """Whatever the order of publishes, takes (with or without FINs) and RDY changes: untaken
    output never passes the mark by more than one message, and once every client takes and
    FINs, every message was delivered exactly once."""
    node = make_node(max_msg_size=100_000)
    clients = [Client(node) for _ in range(3)]
    for client in clients:
        client.sub("t", "c", rdy=20)
        client.raw()
    producer = Client(node)
    published: list[bytes] = []
    finished: list[bytes] = []
    held: list[list[tuple[bytes, bytes]]] = [[], [], []]  # received, not FIN'd, per client
    serial = 0

    def take(i: int, fin: bool) -> None:
        client = clients[i]
        for kind, payload in client.decoder.feed(node.data_to_send(client.id)):
            if kind == MESSAGE:
                msg = frames.decode_message(payload)
                held[i].append((msg.id, msg.body))
        if fin:
            for message_id, body in held[i]:
                client.send(frames.encode_fin(message_id))
                finished.append(body)
            held[i].clear()

    for op, a, b in ops:
        if op == "pub":
            for _ in range(a):
                body = b"%08d" % serial + b"z" * max(0, b - 8)
                serial += 1
                published.append(body)
                assert producer.pub("t", body) == b"OK"
        elif op == "take":
            take(a, bool(b))
        else:
            clients[a].send(frames.encode_rdy(b))
        for client in clients:
            assert node.output_pending(client.id) < HIGH_WATER + 34 + 90_000
        assert _channel(node)["in_flight_count"] <= 3 * 50  # never past the RDY given
    # everyone reads, FINs and asks for more until nothing is left
    for client in clients:
        client.send(frames.encode_rdy(20))
    for _ in range(10_000):
        if not any(node.output_pending(c.id) for c in clients) and not any(held):
            break
        for i in range(3):
            take(i, True)
    assert sorted(finished) == sorted(published)
    assert (_channel(node)["depth"], _channel(node)["in_flight_count"]) == (0, 0)

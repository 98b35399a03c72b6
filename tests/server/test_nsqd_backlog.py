"""A topic's backlog moves into its channels in bounded steps.

What waited in a topic (no channel yet, paused, or reloaded after a restart) used to move into
its channels inside the one call that released it: SUB on a topic holding 1M messages froze the
whole node. Now the releasing call moves one step, ``next_deadline()`` says more is due at once,
and every ``handle_timer`` call moves one more step, so a transport serves its other clients
between steps. Order, counts and durability are as before.
"""

from __future__ import annotations

import random

from nsq_sansio import frames
from nsq_sansio.server import NSQD, MemoryBackend, NSQDOptions
from nsq_sansio.server.channel import TIMER_STEP as _TIMER_STEP
from nsq_sansio.server.topic import BACKLOG_STEP_MESSAGES as _BACKLOG_STEP_MESSAGES

from ._wire import Client, make_node

BACKLOG = 5 * _BACKLOG_STEP_MESSAGES + 17


def _depths(node: NSQD, topic: str = "t", channel: str = "c") -> tuple[int, int]:
    (found,) = node.stats(0.0, topic=topic)["topics"]
    chan = {c["channel_name"]: c for c in found["channels"]}.get(channel)
    return found["depth"], (0 if chan is None else chan["depth"] + chan["in_flight_count"])


def _publish(node: NSQD, count: int, topic: str = "t", start: int = 0) -> None:
    node.multi_publish(topic, [b"%d" % i for i in range(start, start + count)], 0.0)


def _nothing_due(node: NSQD, now: float) -> bool:
    deadline = node.next_deadline()
    return deadline is None or deadline > now


def _drain_steps(node: NSQD, now: float = 0.0, limit: int = 10_000) -> int:
    """Call handle_timer while work is due at ``now``; returns how many calls it took."""
    calls = 0
    while (deadline := node.next_deadline()) is not None and deadline <= now:
        node.handle_timer(now)
        calls += 1
        assert calls < limit, "handle_timer never finished the work due now"
    return calls


def test_sub_moves_one_step_and_handle_timer_the_rest_in_order() -> None:
    node = make_node(mem_queue_size=100)  # most of the backlog sits in the topic's backend
    _publish(node, BACKLOG)
    consumer = Client(node)
    consumer.sub("t", "c")
    assert _depths(node) == (BACKLOG - _BACKLOG_STEP_MESSAGES, _BACKLOG_STEP_MESSAGES)
    assert node.backlog_pending() and node.next_deadline() == 0.0  # more is due at once
    node.handle_timer(0.0)
    assert _depths(node) == (BACKLOG - 2 * _BACKLOG_STEP_MESSAGES, 2 * _BACKLOG_STEP_MESSAGES)
    calls = _drain_steps(node)
    assert calls == BACKLOG // _BACKLOG_STEP_MESSAGES - 1
    assert _depths(node) == (0, BACKLOG)
    assert not node.backlog_pending() and _nothing_due(node, 0.0)
    # FIFO across the topic's memory and backend, then the channel's
    assert _consume(consumer, BACKLOG) == [b"%d" % i for i in range(BACKLOG)]


def _consume(consumer: Client, count: int) -> list[bytes]:
    """Read and FIN ``count`` messages, RDY 2500 at a time."""
    bodies: list[bytes] = []
    while len(bodies) < count:
        consumer.send(frames.encode_rdy(2500))
        batch = consumer.messages()
        assert batch, f"stalled after {len(bodies)} messages"
        for message in batch:
            bodies.append(message.body)
            consumer.send(frames.encode_fin(message.id))
    return bodies


def test_publishes_during_the_move_wait_behind_the_backlog() -> None:
    node = make_node(mem_queue_size=100)
    _publish(node, BACKLOG)
    consumer = Client(node)
    consumer.sub("t", "c")
    assert node.backlog_pending()
    _publish(node, 10, start=BACKLOG)  # over HTTP, while the backlog still moves
    assert Client(node).pub("t", b"tcp") == b"OK"
    _drain_steps(node)
    assert _depths(node) == (0, BACKLOG + 11)
    expected = [b"%d" % i for i in range(BACKLOG + 10)] + [b"tcp"]
    assert _consume(consumer, BACKLOG + 11) == expected


def test_a_deferred_publish_during_the_move_is_held_back_not_queued() -> None:
    node = make_node()
    _publish(node, BACKLOG)
    Client(node).sub("t", "c")
    assert node.backlog_pending()
    node.publish("t", b"later", 0.0, defer_ms=5000)
    (found,) = node.stats(0.0, topic="t")["topics"][0]["channels"]
    assert found["deferred_count"] == 1  # straight to the channel's deferred queue
    _drain_steps(node)
    assert _depths(node) == (0, BACKLOG)


def test_pausing_or_deleting_the_topic_stops_the_move() -> None:
    node = make_node()
    _publish(node, BACKLOG)
    Client(node).sub("t", "c")
    node.pause_topic("t", 0.0)
    node.handle_timer(0.0)
    assert not node.backlog_pending() and _nothing_due(node, 0.0)
    held = _depths(node)[0]
    assert held == BACKLOG - _BACKLOG_STEP_MESSAGES
    node.unpause_topic("t", 0.0)
    assert _depths(node)[0] == held - _BACKLOG_STEP_MESSAGES and node.backlog_pending()
    node.delete_topic("t", 0.0)
    assert not node.backlog_pending() and _nothing_due(node, 0.0)


def test_topics_take_turns() -> None:
    node = make_node()
    for topic in ("a", "b"):
        _publish(node, BACKLOG, topic=topic)
        Client(node).sub(topic, "c")
    node.handle_timer(0.0)
    node.handle_timer(0.0)
    moved = [BACKLOG - _depths(node, topic)[0] for topic in ("a", "b")]
    assert moved == [2 * _BACKLOG_STEP_MESSAGES, 2 * _BACKLOG_STEP_MESSAGES]


def test_a_restart_mid_move_keeps_the_rest_and_load_metadata_resumes_it() -> None:
    backends: dict[str, MemoryBackend] = {}

    def factory(name: str) -> MemoryBackend:
        return backends.setdefault(name, MemoryBackend())

    options = NSQDOptions(mem_queue_size=100)
    node = NSQD(options, random.Random(1), backend_factory=factory)
    _publish(node, BACKLOG)
    node.create_channel("t", "c", 0.0)
    metadata = node.metadata()
    node.close(1.0)
    assert backends["t"].depth + backends["t:c"].depth == BACKLOG
    assert backends["t"].depth > 0  # still in the topic: the move had not finished
    again = NSQD(options, random.Random(2), backend_factory=factory)
    again.load_metadata(metadata, 2.0)
    assert again.backlog_pending()  # one step at load, the rest in handle_timer steps
    _drain_steps(again, 2.0)
    assert _depths(again) == (0, BACKLOG)
    consumer = Client(again, 2.0)
    consumer.sub("t", "c", now=2.0)
    # every message once (what was in the channel's memory at close went to its backend
    # after what had spilled already, as nsqd's flush does: order is not kept across it)
    assert sorted(_consume(consumer, BACKLOG)) == sorted(b"%d" % i for i in range(BACKLOG))


def test_a_burst_of_deferred_messages_comes_due_in_bounded_steps() -> None:
    node = make_node()
    consumer = Client(node)
    consumer.sub("t", "c")
    count = 2 * _TIMER_STEP + 5
    node.multi_publish("t", [b"d"] * count, 0.0, defer_ms=1000)
    assert node.next_deadline() == 1.0
    node.handle_timer(1.0)
    (found,) = node.stats(1.0, topic="t")["topics"][0]["channels"]
    assert (found["depth"], found["deferred_count"]) == (_TIMER_STEP, count - _TIMER_STEP)
    assert node.next_deadline() == 1.0  # the rest is due at once, in the next calls
    assert _drain_steps(node, 1.0) == 2
    (found,) = node.stats(1.0, topic="t")["topics"][0]["channels"]
    assert (found["depth"], found["deferred_count"]) == (count, 0)


def test_records_from_the_topic_backend_reach_spilled_channels_as_they_are() -> None:
    """A big backlog sits in the topic's backend as records; a channel whose queue has spilled
    to its own backend takes each record as it is (the same bytes, not decoded and encoded
    again), which is what lets the move outpace a draining consumer. Another channel with
    room in memory gets messages; both deliver every message once, in order."""
    backends: dict[str, MemoryBackend] = {}

    def factory(name: str) -> MemoryBackend:
        backends[name] = MemoryBackend()
        return backends[name]

    node = NSQD(NSQDOptions(mem_queue_size=50), random.Random(3), backend_factory=factory)
    node.create_topic("t", 0.0)
    _publish(node, 400)
    node.pause_topic("t", 0.0)
    node.create_channel("t", "spilled", 0.0)
    node.create_channel("t", "roomy", 0.0)
    waiting = list(backends["t"]._records)  # the topic's overflow, as records
    assert len(waiting) == 350
    # the "roomy" channel's consumer takes messages as they come: its queue keeps room
    roomy = Client(node)
    roomy.sub("t", "roomy", rdy=1000)
    node.unpause_topic("t", 0.0)
    _drain_steps(node)
    spilled = backends["t:spilled"]._records
    assert len(spilled) == 350
    assert all(a is b for a, b in zip(waiting, spilled, strict=True))  # the same bytes objects
    later = Client(node)
    later.sub("t", "spilled", rdy=1000)
    _drain_steps(node)
    for client in (roomy, later):
        bodies = [m.body for m in client.messages()]
        assert bodies == [b"%d" % i for i in range(400)]
    stats = {c["channel_name"]: c for c in node.stats(0.0)["topics"][0]["channels"]}
    assert stats["spilled"]["message_count"] == stats["roomy"]["message_count"] == 400

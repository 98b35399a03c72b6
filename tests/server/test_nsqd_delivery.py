"""Topics, channels, RDY, in-flight timeouts, deferral, heartbeats, lifecycle: driven by ``now``."""

from __future__ import annotations

from nsq_sansio import frames
from nsq_sansio.server import (
    NSQD,
    ChannelCreated,
    ChannelDeleted,
    ClientState,
    MemoryBackend,
    NSQDOptions,
    TopicCreated,
    TopicDeleted,
)

from ._wire import RESPONSE, Client, make_node


def _channel_stats(node: NSQD, topic: str = "t", channel: str = "c") -> dict[str, object]:
    (found,) = node.stats(0.0, topic=topic, channel=channel)["topics"][0]["channels"]
    return found  # type: ignore[no-any-return]


def test_every_channel_gets_a_copy_and_clients_of_a_channel_share() -> None:
    node = make_node()
    a1, a2, b = Client(node), Client(node), Client(node)
    a1.sub("t", "a", rdy=100)
    a2.sub("t", "a", rdy=100)
    b.sub("t", "b", rdy=100)
    producer = Client(node)
    bodies = [b"m%d" % i for i in range(10)]
    producer.send(frames.encode_mpub("t", bodies))
    got_a1 = [m.body for m in a1.messages()]
    got_a2 = [m.body for m in a2.messages()]
    got_b = [m.body for m in b.messages()]
    assert sorted(got_a1 + got_a2) == sorted(bodies)
    assert got_a1 and got_a2  # shared between the channel's clients
    assert got_b == bodies  # a full copy, in order


def test_messages_published_before_any_channel_wait_in_the_topic() -> None:
    node = make_node()
    producer = Client(node)
    for i in range(3):
        producer.pub("t", b"%d" % i)
    assert node.stats(0.0)["topics"][0]["depth"] == 3
    consumer = Client(node)
    consumer.sub("t", "c", rdy=10)
    assert [m.body for m in consumer.messages()] == [b"0", b"1", b"2"]
    assert node.stats(0.0)["topics"][0]["depth"] == 0


def test_rdy_is_respected_exactly() -> None:
    node = make_node()
    consumer = Client(node)
    consumer.sub("t", "c", rdy=3)
    producer = Client(node)
    producer.send(frames.encode_mpub("t", [b"%d" % i for i in range(10)]))
    first = consumer.messages()
    assert len(first) == 3
    assert _channel_stats(node)["depth"] == 7
    consumer.send(frames.encode_fin(first[0].id))
    assert [m.body for m in consumer.messages()] == [b"3"]
    consumer.send(frames.encode_rdy(0))
    for msg in first[1:]:
        consumer.send(frames.encode_fin(msg.id))
    assert consumer.messages() == []
    consumer.send(frames.encode_rdy(100))
    assert len(consumer.messages()) == 6


def test_lowering_rdy_below_in_flight_stops_delivery_until_under() -> None:
    node = make_node()
    consumer = Client(node)
    consumer.sub("t", "c", rdy=5)
    Client(node).send(frames.encode_mpub("t", [b"%d" % i for i in range(20)]))
    got = consumer.messages()
    assert len(got) == 5
    consumer.send(frames.encode_rdy(2))
    for msg in got[:3]:
        consumer.send(frames.encode_fin(msg.id))
    assert consumer.messages() == []  # 2 in flight, RDY 2
    consumer.send(frames.encode_fin(got[3].id))
    assert len(consumer.messages()) == 1


def test_in_flight_timeout_requeues_with_attempts_plus_one() -> None:
    node = make_node(msg_timeout=10.0)
    consumer = Client(node)
    consumer.sub("t", "c", rdy=1)
    Client(node).pub("t", b"m")
    (msg,) = consumer.messages()
    assert node.next_deadline() is not None
    node.handle_timer(9.99)
    assert consumer.messages() == []
    node.handle_timer(10.0)
    (again,) = consumer.messages()
    assert (again.id, again.attempts) == (msg.id, 2)
    stats = _channel_stats(node)
    assert stats["timeout_count"] == 1 and stats["requeue_count"] == 0  # as nsqd 1.2+ counts
    consumer.send(frames.encode_fin(msg.id), 11.0)
    assert consumer.frames() == []


def test_client_msg_timeout_from_identify() -> None:
    node = make_node()
    consumer = Client(node)
    consumer.identify(msg_timeout=2000)
    consumer.sub("t", "c", rdy=1)
    Client(node).pub("t", b"m")
    consumer.messages()
    node.handle_timer(2.0)
    assert len(consumer.messages()) == 1


def test_touch_extends_but_never_past_max_msg_timeout() -> None:
    node = make_node(msg_timeout=10.0, max_msg_timeout=25.0)
    consumer = Client(node)
    consumer.sub("t", "c", rdy=1)
    Client(node).pub("t", b"m")
    (msg,) = consumer.messages()
    consumer.send(frames.encode_touch(msg.id), 8.0)  # now due at 18
    node.handle_timer(17.9)
    assert consumer.frames() == []
    consumer.send(frames.encode_touch(msg.id), 17.0)  # would be 27, capped at 25
    node.handle_timer(24.9)
    assert consumer.frames() == []
    node.handle_timer(25.0)
    (again,) = consumer.messages()
    assert again.attempts == 2


def test_req_with_delay_defers_and_zero_requeues_now() -> None:
    node = make_node()
    consumer = Client(node)
    consumer.sub("t", "c", rdy=1)
    Client(node).pub("t", b"m")
    (msg,) = consumer.messages()
    consumer.send(frames.encode_req(msg.id, 0))
    (again,) = consumer.messages()
    assert again.attempts == 2
    consumer.send(frames.encode_req(msg.id, 1500), 1.0)
    assert consumer.messages() == []
    assert _channel_stats(node)["deferred_count"] == 1
    assert node.next_deadline() == 2.5
    node.handle_timer(2.5)
    (third,) = consumer.messages()
    assert third.attempts == 3


def test_deferred_publish_comes_out_in_time_order() -> None:
    node = make_node()
    consumer = Client(node)
    consumer.sub("t", "c", rdy=10)
    producer = Client(node)
    producer.send(frames.encode_dpub("t", 3000, b"late"))
    producer.send(frames.encode_dpub("t", 1000, b"early"))
    assert producer.responses() == [b"OK", b"OK"]
    producer.pub("t", b"now")
    assert [m.body for m in consumer.messages()] == [b"now"]
    node.handle_timer(1.0)
    assert [m.body for m in consumer.messages()] == [b"early"]
    node.handle_timer(2.0)
    assert consumer.messages() == []
    node.handle_timer(3.0)
    assert [m.body for m in consumer.messages()] == [b"late"]


def test_deferred_publish_is_held_back_on_every_channel() -> None:
    node = make_node()
    channels = {name: Client(node) for name in ("a", "b", "c")}
    for name, consumer in channels.items():
        consumer.sub("t", name, rdy=10)
    producer = Client(node)
    producer.send(frames.encode_dpub("t", 2000, b"later"))
    assert producer.responses() == [b"OK"]
    for name, consumer in channels.items():
        assert consumer.messages() == []
        assert _channel_stats(node, channel=name)["deferred_count"] == 1
    node.handle_timer(2.0)
    for consumer in channels.values():
        assert [m.body for m in consumer.messages()] == [b"later"]
    # also when it waited in a paused topic before reaching its channels
    node.pause_topic("t", 3.0)
    producer.send(frames.encode_dpub("t", 1000, b"paused"), 3.0)
    node.unpause_topic("t", 4.0)
    for name, consumer in channels.items():
        assert consumer.messages() == []
        assert _channel_stats(node, channel=name)["deferred_count"] == 1
    node.handle_timer(5.0)
    for consumer in channels.values():
        assert [m.body for m in consumer.messages()] == [b"paused"]


def test_heartbeats_and_two_missed_close_the_client() -> None:
    node = make_node(msg_timeout=20.0)
    consumer = Client(node)
    consumer.identify(heartbeat_interval=1000)
    consumer.sub("t", "c", rdy=1)
    Client(node).pub("t", b"m")
    (msg,) = consumer.messages()
    node.handle_timer(1.0)
    assert consumer.frames() == [(RESPONSE, b"_heartbeat_")]
    consumer.send(frames.encode_nop(), 1.1)
    node.handle_timer(2.0)
    node.handle_timer(3.0)
    assert not consumer.closed
    node.handle_timer(3.1)
    assert consumer.closed
    # its in-flight message waits for its own timeout, then goes to the next consumer
    other = Client(node, now=3.2)
    other.identify(now=3.2)
    other.sub("t", "c", rdy=1, now=3.2)
    assert other.messages() == []
    node.handle_timer(19.9)
    assert other.messages() == []
    node.handle_timer(20.0)
    (again,) = other.messages()
    assert (again.id, again.attempts) == (msg.id, 2)


def test_requeue_in_flight_on_close_option() -> None:
    node = make_node(requeue_in_flight_on_close=True)
    first, second = Client(node), Client(node)
    first.sub("t", "c", rdy=5)
    second.sub("t", "c", rdy=0)
    Client(node).send(frames.encode_mpub("t", [b"a", b"b"]))
    assert len(first.messages()) == 2
    first.send(b"")
    second.send(frames.encode_rdy(5))
    assert sorted(m.body for m in second.messages()) == [b"a", b"b"]


def test_heartbeats_disabled_means_no_timeout() -> None:
    node = make_node()
    client = Client(node)
    client.identify(heartbeat_interval=-1)
    node.handle_timer(10_000.0)
    assert client.frames() == [] and not client.closed


def test_connection_without_magic_times_out() -> None:
    node = make_node(client_timeout=5.0)
    client = Client(node, magic=False)
    assert node.next_deadline() == 5.0
    node.handle_timer(5.0)
    assert client.closed


def test_ephemeral_channel_and_topic_vanish_with_last_client() -> None:
    node = make_node()
    node.take_registry_events()
    consumer = Client(node)
    consumer.sub("t#ephemeral", "c#ephemeral", rdy=1)
    assert node.take_registry_events() == [
        TopicCreated("t#ephemeral"),
        ChannelCreated("t#ephemeral", "c#ephemeral"),
    ]
    consumer.send(b"")
    assert node.take_registry_events() == [
        ChannelDeleted("t#ephemeral", "c#ephemeral"),
        TopicDeleted("t#ephemeral"),
    ]
    assert node.topic_names() == []


def test_ephemeral_channel_drops_overflow_beyond_mem_queue_size() -> None:
    node = make_node(mem_queue_size=2)
    consumer = Client(node)
    consumer.sub("t", "c#ephemeral", rdy=0)
    Client(node).send(frames.encode_mpub("t", [b"1", b"2", b"3", b"4"]))
    consumer.send(frames.encode_rdy(10))
    assert [m.body for m in consumer.messages()] == [b"1", b"2"]


def test_overflow_goes_to_backend_and_order_is_kept() -> None:
    backends: dict[str, MemoryBackend] = {}

    def factory(name: str) -> MemoryBackend:
        backends[name] = MemoryBackend()
        return backends[name]

    import random

    node = NSQD(NSQDOptions(mem_queue_size=3), random.Random(1), backend_factory=factory)
    consumer = Client(node)
    consumer.sub("t", "c", rdy=0)
    bodies = [b"%d" % i for i in range(10)]
    Client(node).send(frames.encode_mpub("t", bodies))
    stats = _channel_stats(node)
    assert stats["depth"] == 10 and stats["backend_depth"] == 7
    assert backends["t:c"].depth == 7
    consumer.send(frames.encode_rdy(4))
    got = consumer.messages()
    for msg in got:
        consumer.send(frames.encode_fin(msg.id))
    consumer.send(frames.encode_rdy(100))
    got += consumer.messages()
    assert [m.body for m in got] == bodies


def test_topic_and_channel_pause() -> None:
    node = make_node()
    consumer = Client(node)
    consumer.sub("t", "c", rdy=10)
    node.pause_topic("t", 0.0)
    Client(node).pub("t", b"1")
    assert consumer.messages() == []
    assert node.stats(0.0)["topics"][0]["paused"] is True
    node.unpause_topic("t", 0.0)
    assert [m.body for m in consumer.messages()] == [b"1"]
    node.pause_channel("t", "c", 0.0)
    Client(node).pub("t", b"2")
    assert consumer.messages() == []
    assert _channel_stats(node)["depth"] == 1
    node.unpause_channel("t", "c", 0.0)
    assert [m.body for m in consumer.messages()] == [b"2"]


def test_empty_channel_drops_everything_and_resets_client_in_flight() -> None:
    node = make_node()
    consumer = Client(node)
    consumer.sub("t", "c", rdy=1)
    Client(node).send(frames.encode_mpub("t", [b"1", b"2"]))
    (msg,) = consumer.messages()
    node.empty_channel("t", "c", 0.0)
    stats = _channel_stats(node)
    assert stats["depth"] == 0 and stats["in_flight_count"] == 0
    consumer.send(frames.encode_fin(msg.id))
    assert b"E_FIN_FAILED" in consumer.responses()[0]
    Client(node).pub("t", b"3")
    assert [m.body for m in consumer.messages()] == [b"3"]


def test_delete_channel_disconnects_its_clients() -> None:
    node = make_node()
    consumer = Client(node)
    consumer.sub("t", "c", rdy=1)
    events = node.delete_channel("t", "c", 0.0)
    assert [e.conn_id for e in events] == [consumer.id]
    assert node.channel_names("t") == []
    assert node.connection_state(consumer.id) is ClientState.CLOSED


def test_delete_topic_deletes_channels_and_reports_lifecycle() -> None:
    node = make_node()
    Client(node).sub("t", "c")
    node.take_registry_events()
    node.delete_topic("t", 0.0)
    assert node.take_registry_events() == [ChannelDeleted("t", "c"), TopicDeleted("t")]
    assert node.topic_names() == []


def test_sample_rate_delivers_a_share() -> None:
    node = make_node()
    consumer = Client(node)
    consumer.identify(sample_rate=10)
    consumer.sub("t", "c", rdy=2500)
    Client(node).send(frames.encode_mpub("t", [b"x"] * 1000))
    got = len(consumer.messages())
    assert 50 < got < 200  # about 11%


def test_stats_count_messages_requeues_and_clients() -> None:
    node = make_node()
    consumer = Client(node)
    consumer.identify(client_id="me", hostname="box", user_agent="test/1")
    consumer.sub("t", "c", rdy=2)
    producer = Client(node)
    producer.send(frames.encode_mpub("t", [b"a", b"bb", b"ccc"]))
    m1, m2 = consumer.messages()
    consumer.send(frames.encode_fin(m1.id))
    consumer.send(frames.encode_req(m2.id, 0))
    stats = node.stats(0.0)
    (topic,) = stats["topics"]
    assert topic["message_count"] == 3 and topic["message_bytes"] == 6
    (channel,) = topic["channels"]
    assert channel["message_count"] == 3 and channel["requeue_count"] == 1
    assert channel["in_flight_count"] == 2 and channel["client_count"] == 1
    (client,) = channel["clients"]
    assert client["client_id"] == "me" and client["hostname"] == "box"
    assert client["user_agent"] == "test/1" and client["state"] == 3
    assert client["ready_count"] == 2 and client["in_flight_count"] == 2
    assert client["finish_count"] == 1 and client["requeue_count"] == 1
    assert client["message_count"] == 4
    (prod,) = stats["producers"]
    assert prod["pub_counts"] == [{"topic": "t", "count": 3}]


def test_a_burst_of_pubs_reaches_a_ready_consumer_past_mem_queue_size() -> None:
    # Deliveries are batched per input chunk, but a full memory queue is pumped first, so an
    # ephemeral channel (which drops overflow) loses nothing a ready consumer could take.
    node = make_node(mem_queue_size=2)
    consumer = Client(node)
    consumer.sub("t", "c#ephemeral", rdy=100)
    producer = Client(node)
    producer.pub("t", b"first")
    producer.send(b"".join(frames.encode_pub("t", b"%d" % i) for i in range(20)))
    assert [m.body for m in consumer.messages()] == [b"first"] + [b"%d" % i for i in range(20)]
    assert producer.responses() == [b"OK"] * 20


def test_fins_in_one_chunk_refill_up_to_rdy() -> None:
    node = make_node()
    consumer = Client(node)
    consumer.sub("t", "c", rdy=3)
    node.multi_publish("t", [b"%d" % i for i in range(9)], 0.0)
    first = consumer.messages()
    consumer.send(b"".join(frames.encode_fin(m.id) for m in first))
    second = consumer.messages()
    assert [m.body for m in second] == [b"3", b"4", b"5"]
    assert node.stats(0.0)["topics"][0]["channels"][0]["in_flight_count"] == 3

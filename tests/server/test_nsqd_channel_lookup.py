"""A new topic asks nsqlookupd for its channels first, in the pure nsqd role.

nsqd's ``GetTopic`` asks every nsqlookupd it knows for a new topic's channels and creates
them before the command that made the topic goes on, so the topic's first messages reach
them. The node emits :class:`LookupChannels`, holds the topic's messages and the creating
client's answer and input until every nsqlookupd answered (``lookupd_channels``) or
``http_client_request_timeout`` passed; everybody else goes on meanwhile.
"""

from __future__ import annotations

import json

from hypothesis import given, settings
from hypothesis import strategies as st

from nsq_sansio import frames
from nsq_sansio.server import NSQD, LookupChannels
from nsq_sansio.server.lookupd_client import channels_request_target, parse_channels_answer

from ._wire import Client, make_node

A, B = "127.0.0.1:4161", "127.0.0.1:4261"


def _node(**options: object) -> NSQD:
    options.setdefault("http_client_request_timeout", 5.0)
    node = make_node(**options)
    node.set_lookupd_http_addresses([A, B])
    return node


def _lookups(events: object) -> list[LookupChannels]:
    return [e for e in events if isinstance(e, LookupChannels)]  # type: ignore[attr-defined]


def _channels(node: NSQD, topic: str) -> dict[str, int]:
    (found,) = node.stats(0.0, topic=topic)["topics"]
    return {c["channel_name"]: c["depth"] for c in found["channels"]}


def _drain(node: NSQD, now: float) -> None:
    while (deadline := node.next_deadline()) is not None and deadline <= now:
        node.handle_timer(now)


def _bodies(node: NSQD, topic: str, channel: str, count: int) -> list[bytes]:
    consumer = Client(node)
    consumer.sub(topic, channel, rdy=count)
    return [m.body for m in consumer.messages()]


def test_the_creating_pub_waits_for_every_lookupd_then_its_message_reaches_their_channels() -> None:
    node = _node()
    producer = Client(node)
    events = producer.send(frames.encode_pub("t", b"first") + frames.encode_pub("t", b"second"))
    (lookup,) = _lookups(events)
    assert (lookup.topic, lookup.addresses) == ("t", (A, B))
    assert producer.responses() == []  # the answer waits, and so does the next command
    assert node.input_pending(producer.id) and node.lookups_pending() == 1
    assert node.stats(0.0, topic="t")["topics"][0]["depth"] == 1  # kept in the topic

    assert node.lookupd_channels(lookup.lookup_id, A, ["archive", "live#ephemeral"], 0.1) == []
    assert producer.responses() == []  # B has not answered yet
    node.lookupd_channels(lookup.lookup_id, B, ["audit", "archive", "no spaces"], 0.2)
    assert producer.responses() == [b"OK", b"OK"]  # then the second PUB ran
    assert not node.input_pending(producer.id) and node.lookups_pending() == 0
    # the union, ephemeral and invalid names left out; both messages in each, in order
    assert _channels(node, "t") == {"archive": 2, "audit": 2}
    assert _bodies(node, "t", "archive", 2) == [b"first", b"second"]
    assert _bodies(node, "t", "audit", 2) == [b"first", b"second"]
    # the channels it created are announced to nsqlookupd like any other
    created = [type(e).__name__ for e in node.take_registry_events()]
    assert created.count("ChannelCreated") == 2


def test_a_lookupd_that_does_not_answer_holds_the_topic_for_the_timeout_only() -> None:
    node = _node()
    creator, other = Client(node), Client(node)
    (lookup,) = _lookups(creator.send(frames.encode_pub("t", b"a1"), 0.0))
    node.lookupd_channels(lookup.lookup_id, A, ["c"], 0.5)  # B stays silent
    assert other.pub("t", b"b1", 1.0) == b"OK"  # another producer is answered at once
    assert creator.responses() == []
    assert node.next_deadline() == 5.0
    _drain(node, 4.99)
    assert creator.responses() == []
    _drain(node, 5.0)
    assert creator.responses() == [b"OK"]
    assert creator.pub("t", b"a2", 5.1) == b"OK"
    # what A answered counts; nothing published meanwhile is lost, each producer in order
    assert _channels(node, "t") == {"c": 3}
    assert _bodies(node, "t", "c", 3) == [b"a1", b"b1", b"a2"]
    assert node.lookupd_channels(lookup.lookup_id, B, ["late"], 6.0) == []  # too late
    assert _channels(node, "t") == {"c": 0}


def test_lookupds_that_cannot_be_asked_start_the_topic_with_no_channel() -> None:
    node = _node()
    producer = Client(node)
    (lookup,) = _lookups(producer.send(frames.encode_pub("t", b"x")))
    node.lookupd_channels(lookup.lookup_id, A, None, 0.0)
    node.lookupd_channels(lookup.lookup_id, B, None, 0.0)
    assert producer.responses() == [b"OK"]
    assert _channels(node, "t") == {}
    assert _bodies(node, "t", "c", 1) == [b"x"]  # the first channel gets what waited


def test_without_lookupds_or_for_a_topic_that_exists_nothing_is_asked() -> None:
    node = make_node()
    producer = Client(node)
    assert not _lookups(producer.send(frames.encode_pub("t", b"x")))
    assert producer.responses() == [b"OK"]
    node.set_lookupd_http_addresses([A])
    assert not _lookups(producer.send(frames.encode_pub("t", b"y")))
    assert producer.responses() == [b"OK"]
    assert not _lookups(node.publish("t", b"z", 0.0))


def test_sub_and_the_http_api_create_topics_the_same_way() -> None:
    node = _node()
    consumer = Client(node)
    (lookup,) = _lookups(consumer.send(frames.encode_sub("s", "mine") + frames.encode_rdy(5)))
    assert consumer.responses() == []
    node.lookupd_channels(lookup.lookup_id, A, ["other"], 0.0)
    node.lookupd_channels(lookup.lookup_id, B, [], 0.0)
    assert consumer.responses() == [b"OK"]
    assert sorted(_channels(node, "s")) == ["mine", "other"]
    node.publish("s", b"m", 0.0)
    assert [m.body for m in consumer.messages()] == [b"m"]  # the RDY that waited ran too

    for call in (
        lambda: node.publish("h1", b"x", 0.0),
        lambda: node.multi_publish("h2", [b"x", b"y"], 0.0),
        lambda: node.create_topic("h3", 0.0),
    ):
        (lookup,) = _lookups(call())
        node.lookupd_channels(lookup.lookup_id, A, ["c"], 0.0)
        node.lookupd_channels(lookup.lookup_id, B, None, 0.0)
        assert _channels(node, lookup.topic) == {"c": {"h1": 1, "h2": 2, "h3": 0}[lookup.topic]}


def test_topics_loaded_from_metadata_ask_nothing() -> None:
    node = _node()
    metadata = {"topics": [{"name": "kept", "paused": False, "channels": []}]}
    node.load_metadata(metadata, 0.0)
    assert node.lookups_pending() == 0 and node.topic_names() == ["kept"]


def test_a_waiting_client_gets_heartbeats_and_is_not_dropped_for_silence() -> None:
    node = _node(http_client_request_timeout=30.0)
    producer = Client(node)
    producer.identify(heartbeat_interval=1000)
    (lookup,) = _lookups(producer.send(frames.encode_pub("t", b"x"), 0.0))
    for now in (1.0, 2.0, 2.5):  # past two heartbeat intervals without a read
        _drain(node, now)
    assert not producer.closed
    assert producer.responses() == [b"_heartbeat_", b"_heartbeat_"]
    node.lookupd_channels(lookup.lookup_id, A, [], 3.0)
    node.lookupd_channels(lookup.lookup_id, B, [], 3.0)
    assert producer.responses() == [b"OK"]
    _drain(node, 4.5)  # its read deadline starts over now, as nsqd's next read
    assert not producer.closed
    _drain(node, 5.0)
    assert producer.closed


def test_a_client_gone_or_a_topic_deleted_while_waiting() -> None:
    node = _node()
    leaving = Client(node)
    (first,) = _lookups(leaving.send(frames.encode_pub("gone", b"kept")))
    node.connection_lost(leaving.id, 0.0)
    node.lookupd_channels(first.lookup_id, A, ["c"], 0.0)
    node.lookupd_channels(first.lookup_id, B, None, 0.0)
    assert _channels(node, "gone") == {"c": 1}  # its message was in the topic: not lost

    staying = Client(node)
    (second,) = _lookups(staying.send(frames.encode_pub("deleted", b"x")))
    node.delete_topic("deleted", 0.0)
    node.lookupd_channels(second.lookup_id, A, ["c"], 0.0)
    node.lookupd_channels(second.lookup_id, B, ["c"], 0.0)
    assert staying.responses() == [b"OK"] and not staying.closed
    assert "deleted" not in node.topic_names()


def test_a_waiting_client_that_keeps_sending_is_bounded() -> None:
    node = _node(max_body_size=1024, max_msg_size=1024)
    producer = Client(node)
    producer.send(frames.encode_pub("t", b"x"))
    producer.send(frames.encode_nop() * 10_000)
    assert producer.closed


def test_a_bad_mpub_creates_no_topic() -> None:
    """nsqd reads and checks an MPUB's body before it makes the topic."""
    node = _node()
    producer = Client(node)
    events = producer.send(b"MPUB t\n" + (4).to_bytes(4, "big") + (0).to_bytes(4, "big"))
    assert not _lookups(events) and node.topic_names() == []
    assert producer.closed


@settings(max_examples=200, deadline=None)
@given(
    script=st.lists(
        st.sampled_from(["pub creator", "pub other", "answer A", "answer B", "tick"]),
        max_size=30,
    )
)
def test_no_interleaving_loses_or_reorders_a_producers_messages(script: list[str]) -> None:
    """Whatever happens while the lookup is under way, every message published reaches the
    channel nsqlookupd names, each producer's in the order it published them."""
    node = _node(http_client_request_timeout=1.0)
    creator, other = Client(node), Client(node)
    (lookup,) = _lookups(creator.send(frames.encode_pub("t", b"creator 0")))
    sent = {"creator": 1, "other": 0}
    now = 0.0
    for step in script:
        if step.startswith("pub"):
            who = step.split()[1]
            conn = creator if who == "creator" else other
            conn.send(frames.encode_pub("t", b"%s %d" % (who.encode(), sent[who])), now)
            sent[who] += 1
        elif step.startswith("answer"):
            address = A if step.endswith("A") else B
            node.lookupd_channels(lookup.lookup_id, address, ["c"], now)
        else:
            now += 0.3
            _drain(node, now)
    _drain(node, now + 1.0)  # the timeout has passed in any case
    for conn in (creator, other):
        assert not conn.closed
    answers = {"creator": creator.responses(), "other": other.responses()}
    assert answers == {who: [b"OK"] * count for who, count in sent.items()}
    total = sent["creator"] + sent["other"]
    got = _bodies(node, "t", "c", total)
    for who in sent:
        mine = [body for body in got if body.startswith(who.encode())]
        assert mine == [b"%s %d" % (who.encode(), i) for i in range(sent[who])]
    assert len(got) == total


def test_the_request_and_the_answer_of_lookupd() -> None:
    assert channels_request_target("a.b#ephemeral") == "/channels?topic=a.b%23ephemeral"
    assert parse_channels_answer(b'{"channels":["a","b"]}') == ["a", "b"]
    assert parse_channels_answer(b'{"channels":null}') == []
    old = {"status_code": 200, "status_txt": "OK", "data": {"channels": ["a"]}}
    assert parse_channels_answer(json.dumps(old).encode()) == ["a"]
    assert parse_channels_answer(b'{"channels":["a",1,null]}') == ["a"]


@given(st.binary(max_size=200) | st.text(max_size=200).map(str.encode))
def test_any_answer_is_a_list_of_names_or_a_value_error(body: bytes) -> None:
    try:
        names = parse_channels_answer(body)
    except ValueError:
        return
    assert isinstance(names, list) and all(isinstance(n, str) for n in names)

"""Pull mode: a waiting fetch never keeps the messages it gathered until nsqd times them out.

The messages a fetch gathers while it waits for more are not in the user's hands, so nobody
TOUCHes them; a fetch whose ``expires`` is longer than nsqd's msg_timeout used to keep them
until nsqd had taken them back (and delivered them again, often to the same user: a
duplicate). It now answers early, with what it gathered, once the oldest of them has used
half of its msg_timeout.
"""

from __future__ import annotations

from nsq_sansio.config import Config
from nsq_sansio.pull import FetchEnd

from .harness import CHANNEL, TOPIC, World


def _timeouts(w: World) -> int:
    total = 0
    for node in w.nodes.values():
        stats = node.stats(w.now, topic=TOPIC, channel=CHANNEL, include_clients=False)
        for topic in stats["topics"]:
            for channel in topic["channels"]:
                total += channel["timeout_count"]
    return total


def _aging_world(nodes: int = 1) -> World:
    return World(
        nodes,
        Config(max_in_flight=10, msg_timeout=2.0),
        pull=True,
        node_options={"msg_timeout": 2.0},
    )


def test_a_partly_filled_fetch_answers_before_its_messages_time_out() -> None:
    w = _aging_world()
    w.start()
    c = w.coordinator
    rid = c.fetch(10, w.now, expires=5.0)  # waits longer than the 2 s msg_timeout
    w.publish(0, 3)  # three of the ten come; the rest never do
    while not w.results and w.now < 6.0:
        w.advance(0.05)
    assert w.now <= 1.0 + 0.05  # answered half of msg_timeout after the first one came
    (result,) = w.results
    assert result.request_id == rid
    assert len(result.messages) == 3
    assert all(d.message.attempts == 1 for d in result.messages)
    for d in result.messages:  # the user gets time to answer: still ours
        deadline = c.deadline(d)
        assert deadline is not None and deadline - w.now >= 0.9
        assert c.finish(d, w.now)
    w.pump()  # the FINs reach nsqd now
    w.advance(5.0)
    assert _timeouts(w) == 0
    assert w.server_in_flight() == 0 and w.server_depth() == 0
    assert result.reason is FetchEnd.AGED


def test_aged_answers_deliver_each_message_once_over_two_nsqd() -> None:
    """One message every 0.3 s, alternating between two nsqd, while fetches of 10 wait up to
    5 s and the user finishes what each returns: every message reaches the user exactly once
    and nsqd never has to time one out."""
    w = _aging_world(nodes=2)
    w.start()
    c = w.coordinator
    seen: list[bytes] = []
    total = 40
    next_publish = 0.0
    published = 0
    waiting = False
    while w.now < 30.0:
        if not waiting:
            c.fetch(10, w.now, expires=5.0)
            waiting = True
        if published < total and w.now >= next_publish:
            w.publish(published % 2, 1, body=b"%d" % published)
            published += 1
            next_publish += 0.3
        w.advance(0.05)
        for result in w.results:
            waiting = False
            for d in result.messages:
                seen.append(d.message.body)
                assert c.finish(d, w.now)
        w.results.clear()
    assert sorted(seen) == sorted(b"%d" % i for i in range(total))
    assert _timeouts(w) == 0

"""Pull mode: a waiting fetch never keeps the messages it gathered until nsqd times them out.

The messages a fetch gathers while it waits for more are not in the user's hands, so nobody
TOUCHes them; a fetch whose ``expires`` is longer than nsqd's msg_timeout used to keep them
until nsqd had taken them back (and delivered them again, often to the same user: a
duplicate). It now answers early, with what it gathered, once the oldest of them has used
half of its msg_timeout.
"""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from nsq_sansio.config import Config
from nsq_sansio.consumer import FetchEnd

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


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(
    gaps=st.lists(st.integers(0, 40), min_size=1, max_size=30),
    batch=st.integers(1, 12),
    expires=st.sampled_from([0.5, 1.5, 3.0, 8.0, None]),
    seed=st.integers(0, 5),
)
def test_prompt_users_never_see_a_message_twice(
    gaps: list[int], batch: int, expires: float | None, seed: int
) -> None:
    """Any trickle of messages over two nsqd (gaps in 0.05 s steps), any fetch size and
    expiry (longer than msg_timeout or none): a user who finishes what each fetch returns at
    once gets every message exactly once, and nsqd never times one out."""
    w = World(
        2,
        Config(max_in_flight=10, msg_timeout=2.0),
        seed=seed,
        pull=True,
        node_options={"msg_timeout": 2.0},
    )
    w.start()
    c = w.coordinator
    at = [sum(gaps[: i + 1]) for i in range(len(gaps))]  # publish times, in 0.05 s steps
    seen: list[bytes] = []
    waiting = False
    step = 0
    while step <= at[-1] + 1200:  # 60 s after the last message (batch < nsqd count: slow)
        if not waiting:
            c.fetch(batch, w.now, expires=expires)
            waiting = True
        for index, when in enumerate(at):
            if when == step:
                w.publish(index % 2, 1, body=b"%d" % index)
        w.advance(0.05)
        step += 1
        for result in w.results:
            waiting = False
            for d in result.messages:
                seen.append(d.message.body)
                assert c.finish(d, w.now)
        w.results.clear()
        w.pump()
        if not waiting and len(seen) == len(at):
            break
    assert sorted(seen) == sorted(b"%d" % i for i in range(len(at)))
    assert _timeouts(w) == 0

"""A taken-back report applies to the delivery it is about, not to every copy of
the same message id. Against the embedded broker and the real nsqd (skipped without it)."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import Any

import pytest

from transports.sync import Consumer, Producer
from transports.testing.real_nsq import MISSING_BINARIES, RealNSQD, find_binaries

from ._helpers import channel_stats, running_nsqd, unique, wait_for

#: (tcp address, channel stats reader) of a broker with a 1 s message timeout.
Broker = tuple[str, Callable[[str, str], "dict[str, Any] | None"]]


@pytest.fixture(params=["embedded", "real"])
def broker(request: pytest.FixtureRequest) -> Iterator[Broker]:
    if request.param == "embedded":
        with running_nsqd(msg_timeout=1.0) as (server, runner):
            yield server.tcp_address, lambda t, c: channel_stats(runner, t, c)
        return
    if find_binaries() is None:
        pytest.skip(MISSING_BINARIES)
    with RealNSQD(["--msg-timeout=1s"]) as nsqd:
        yield nsqd.tcp_address, nsqd.channel_stats


def test_only_the_copies_nsqd_took_back_are_taken_back(broker: Broker) -> None:
    address, stats = broker
    topic = unique()
    with Producer(address) as producer:
        producer.publish(topic, b"held 2.5 s")
    with Consumer(topic, "c", nsqd=[address], max_in_flight=5) as consumer:
        copies = []
        for attempts in (1, 2, 3):  # held past the 1 s timeout: nsqd sends it again
            msg = consumer.get(timeout=10)
            assert msg is not None and msg.attempts == attempts
            copies.append(msg)
        first, second, latest = copies
        assert first.id == second.id == latest.id
        # nsqd took back the first two copies: the client knows it (each was sent again)
        wait_for(lambda: first.taken_back and second.taken_back, what="older copies taken back")
        assert not latest.taken_back
        first.finish()  # late: reported, not sent
        second.finish()
        wait_for(lambda: consumer.stats().taken_back >= 4, what="late answers reported")
        assert not latest.taken_back  # those reports are about the older copies
        latest.finish()  # nsqd accepts this one
        channel: dict[str, Any] = {}

        def finished_on_nsqd() -> bool:
            channel.update(stats(topic, "c") or {})
            clients = channel.get("clients") or [{}]
            return channel.get("in_flight_count") == 0 and clients[0].get("finish_count") == 1

        wait_for(finished_on_nsqd, what="nsqd applied the FIN of the latest copy")
        assert not latest.taken_back  # the copy nsqd accepted is not taken back
        assert first.taken_back and second.taken_back
        assert consumer.stats().finished == 1
    assert channel["depth"] == 0 and channel["timeout_count"] == 2


def test_a_fin_refused_in_a_batch_marks_only_its_own_message() -> None:
    """FINs are taken back in batches (one finish_many call): one the coordinator refuses
    (here its handle was answered behind the transport's back, the way a race would) sets
    ``taken_back`` on that message only; the others of the batch are FIN'd."""
    with running_nsqd() as (server, runner):
        topic = unique()
        with Producer(server.tcp_address) as p:
            p.multi_publish(topic, [b"a", b"b", b"c"])
        with Consumer(topic, "c", nsqd=[server.tcp_address], max_in_flight=3) as consumer:
            held = [consumer.get(timeout=10) for _ in range(3)]
            assert all(m is not None for m in held)
            first, second, third = held  # type: ignore[misc]
            answered = consumer._io.call(
                lambda: consumer._io.coordinator.finish(second.delivery, 0.0)
            ).result(10)
            assert answered  # the core FIN'd it; the transport was not told
            assert first.finish() and second.finish() and third.finish()
            wait_for(lambda: second.taken_back, what="the refused FIN to be reported")
            assert not first.taken_back and not third.taken_back
            wait_for(lambda: consumer.stats().finished == 3, what="three FINs")
            assert consumer.stats().taken_back == 1
        ch = channel_stats(runner, topic, "c")
        assert ch is not None and ch["in_flight_count"] == 0 and ch["depth"] == 0

"""The source's consumer on its own (no Spark): what a micro-batch relies on."""

from __future__ import annotations

import time
from typing import Any

import pytest

pytest.importorskip("pyspark")
pytest.importorskip("pyarrow")

from transports.spark._consumer import SourceConsumer

from .helpers import channel_stats, create_channel, publish

pytestmark = pytest.mark.spark


def test_dead_nsqd_in_the_list_does_not_stop_the_others(nsqd_pair: list[Any]) -> None:
    live = nsqd_pair[0]
    create_channel(live, "mixed", "c")
    publish([live], "mixed", [b"%d" % i for i in range(300)])
    consumer = SourceConsumer("mixed", "c", nsqd=["127.0.0.1:1", live.tcp_address])
    consumer.start()
    try:
        got: list[Any] = []
        while len(got) < 300:
            batch = consumer.take(300 - len(got), 2.0)
            assert batch, "the live nsqd stopped delivering"
            got += batch
        assert consumer.connected() == [live.tcp_address]
        assert consumer.finish(got) == 300
    finally:
        consumer.close()


def test_held_messages_survive_many_msg_timeouts_and_fin_after(nsqd_pair: list[Any]) -> None:
    """Held for 3.5 s with a 1 s msg_timeout: TOUCH keeps them; FIN then clears the channel."""
    from nsq_sansio.config import Config

    server = nsqd_pair[1]
    create_channel(server, "held", "c")
    publish([server], "held", [b"h%d" % i for i in range(50)])
    consumer = SourceConsumer(
        "held", "c", nsqd=[server.tcp_address], max_in_flight=50, config=Config(msg_timeout=1.0)
    )
    consumer.start()
    try:
        held = consumer.take(50, 2.0, 0.2)
        assert len(held) == 50
        time.sleep(3.5)
        stats = channel_stats(server, "held", "c")
        assert stats["timeout_count"] == 0 and stats["in_flight_count"] == 50
        assert consumer.finish(held) == 50
        time.sleep(0.2)
        stats = channel_stats(server, "held", "c")
        assert stats["in_flight_count"] == 0 and stats["depth"] == 0
    finally:
        consumer.close()


def test_missing_nsqd_is_a_clear_error() -> None:
    consumer = SourceConsumer("t", "c", nsqd=["127.0.0.1:1"], connect_timeout=0.5)
    with pytest.raises(Exception, match=r"could not subscribe to 't'/'c' on any nsqd"):
        consumer.start()
    consumer.close()

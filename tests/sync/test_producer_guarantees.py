"""The blocking Producer's per-call guarantees that only its API can show, against the real
nsqd: every ``publish_async`` future has its own deadline; back-pressure bounds memory under
100k of them; waiting for a slot counts against the deadline. Real-nsqd tests skip without the
binaries. The guarantees every runtime shares are in tests/clients/.
"""

from __future__ import annotations

import os
import threading
import time

from support.brokers import embedded_topic_count, needs_real, paused, running_nsqd, topic_count

from nsq_sansio.errors import BadMessage
from transports.sync import Producer
from transports.testing.real_nsq import RealNSQD

from ._helpers import unique


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


# --- deadlines, back-pressure -------------------------------------------------------------------


@needs_real
def test_memory_with_100k_publishes_is_bounded_by_max_pending_real() -> None:
    with RealNSQD() as nsqd:
        topic = unique()
        body = b"x" * 1000
        with Producer(nsqd.tcp_address, max_pending=1000, timeout=60) as p:
            p.publish(topic, b"warm")
            before = rss_bytes()
            done = threading.Event()
            peaks: list[int] = []

            def publish_all() -> None:
                for _ in range(100_000):
                    p.publish_async(topic, body)
                done.set()

            with paused(nsqd):
                thread = threading.Thread(target=publish_all)
                thread.start()
                deadline = time.monotonic() + 10
                while p.stats().pending < 1000 and time.monotonic() < deadline:
                    time.sleep(0.01)
                time.sleep(0.2)
                peaks.append(p.stats().pending)
                grown = rss_bytes() - before
                assert not done.is_set()  # the publisher is held back, not buffering
            thread.join(60)
            p.flush(30)
        assert peaks == [1000]
        # 100,000 bodies of 1 KB would be 100 MB; 1000 pending are about 1 MB.
        assert grown < 30 * 1024 * 1024
        assert topic_count(nsqd, topic) == 100_001


# --- waiting for a slot -----------------------------------------------------------------------


def test_threads_publishing_at_once_with_a_bad_body_fail_only_it() -> None:
    """100 threads calling publish() together (their PUBs coalesced by whichever thread
    writes): every tenth body is too big for nsqd, and only those calls fail."""
    topic = unique()
    with running_nsqd(max_msg_size=1024) as (server, runner):
        with Producer(server.tcp_address, timeout=20) as producer:
            producer.publish(topic, b"warm")
            outcomes: dict[int, BaseException | None] = {}
            start = threading.Barrier(100)

            def publish(i: int) -> None:
                start.wait()
                body = b"B" * 2000 if i % 10 == 5 else b"%d" % i
                try:
                    for _ in range(5):
                        producer.publish(topic, body)
                    outcomes[i] = None
                except Exception as exc:
                    outcomes[i] = exc

            threads = [threading.Thread(target=publish, args=(i,)) for i in range(100)]
            for thread in threads:
                thread.start()
            for thread in threads:
                thread.join(60)
            stats = producer.stats()
        failed = sorted(i for i, error in outcomes.items() if error is not None)
        assert failed == list(range(5, 100, 10))
        assert all(isinstance(outcomes[i], BadMessage) for i in failed)
        assert (stats.published, stats.failed) == (1 + 90 * 5, 10)
        assert embedded_topic_count(runner, topic) == 1 + 90 * 5

"""``stats()`` read from another thread (a metrics scrape) while the client changes what it
reports: connections that come and go, messages in flight. It never raises, on any runtime."""

from __future__ import annotations

import sys
import threading
from collections.abc import Callable, Iterator

import anyio
import pytest
from support.brokers import unique
from support.ports import refused_address
from support.runtimes import Runtime

from transports.embedded import EmbeddedNSQD

pytestmark = pytest.mark.anyio


@pytest.fixture
def busy_switching() -> Iterator[None]:
    """Switch threads as often as CPython can: a read from another thread lands anywhere."""
    before = sys.getswitchinterval()
    sys.setswitchinterval(1e-6)
    yield
    sys.setswitchinterval(before)


class Scraper:
    """Calls ``read()`` from its own thread until stopped; counts reads, keeps the first error."""

    def __init__(self, read: Callable[[], object]) -> None:
        self.read = read
        self.reads = 0
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="scraper", daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.read()
            except BaseException as exc:
                self.error = exc
                return
            self.reads += 1

    def __enter__(self) -> Scraper:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(10)


async def test_consumer_stats_from_another_thread_while_connections_come_and_go(
    nsqd: EmbeddedNSQD, busy_switching: None, runtime: Runtime
) -> None:
    topic = unique()
    async with runtime.producer(nsqd.tcp_address) as p:
        await p.multi_publish(topic, [b"%d" % i for i in range(300)])
    refused = [refused_address() for _ in range(8)]  # connect, fail, retry at once
    async with runtime.consumer(
        topic,
        "ch",
        nsqd=[nsqd.tcp_address, *refused],
        max_in_flight=50,
        reconnect_delay=0.001,
        max_reconnect_delay=0.001,
    ) as c:
        with Scraper(c.stats) as scraper:
            seen = 0
            async for msg in c.messages():
                await c.finish(msg)
                seen += 1
                if seen % 10 == 0:
                    await anyio.sleep(0.01)  # let the reconnect loop churn under the reads
                if seen == 300:
                    break
        assert scraper.error is None, repr(scraper.error)
        assert scraper.reads > 0
        stats = c.stats()
        assert stats.finished == 300 and stats.in_flight == 0
        assert stats.connection_errors > 0  # the refused addresses did come and go


async def test_producer_stats_from_another_thread_while_connections_come_and_go(
    nsqd: EmbeddedNSQD, busy_switching: None, runtime: Runtime
) -> None:
    refused = refused_address()
    async with runtime.producer(
        [nsqd.tcp_address, refused], reconnect_delay=0.001, max_reconnect_delay=0.001
    ) as p:
        with Scraper(p.stats) as scraper:
            for i in range(300):
                await p.publish(unique(), b"%d" % i)
        assert scraper.error is None, repr(scraper.error)
        assert scraper.reads > 0 and p.stats().published == 300

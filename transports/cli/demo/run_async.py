"""The demo on the anyio transport (asyncio or trio): broker, producers and consumers share
one event loop."""

from __future__ import annotations

import time
from collections.abc import Iterator

import anyio

from transports.anyio import Consumer, Message, Producer
from transports.anyio.admin import NSQDAdmin
from transports.embedded import Cluster

from .accounting import ChannelTally, Tally, answer, tls_settings
from .report import DemoResult, Progress
from .workload import CHANNELS, TOPIC, DemoOptions, Workload

__all__ = ["run_async"]

PUBLISHERS = 8
PUSH_CONSUMERS = 2
FETCHERS = 8


def _answer(ch: ChannelTally, workload: Workload, msg: Message) -> None:
    answer(ch, workload, msg, Message.finish_nowait, Message.requeue_nowait)


async def run_async(
    options: DemoOptions,
    workload: Workload,
    tally: Tally,
    progress: Progress,
    result: DemoResult,
    tls: tuple[str, str] | None,
) -> None:
    nsqd_options, client_tls = tls_settings(tls)
    async with Cluster(nsqd_count=2, nsqd_options=nsqd_options) as cluster:
        for nsqd in cluster.nsqds:  # before the first publish: no channel misses a message
            async with NSQDAdmin(nsqd.http_url, timeout=5.0) as admin:
                await admin.create_topic(TOPIC)
                for channel in CHANNELS:
                    await admin.create_channel(TOPIC, channel)
        await cluster.wait_registered(TOPIC)
        lookupd = cluster.lookupd_http_urls
        nsqd_addresses = cluster.nsqd_tcp_addresses
        stop = anyio.Event()
        push_consumers: list[Consumer] = []
        pull_consumers: list[Consumer] = []
        client_options = {**options.client_options(), **client_tls}

        async def push(index: int) -> None:
            ch = tally.channels["push"]
            async with Consumer(
                TOPIC,
                "push",
                lookupd=lookupd,
                on_event=tally.on_event("push"),
                client_id=f"demo-push-{index}",
                **client_options,
            ) as consumer:
                push_consumers.append(consumer)
                async for msg in consumer:
                    _answer(ch, workload, msg)

        async def pull() -> None:
            ch = tally.channels["pull"]
            async with Consumer(
                TOPIC,
                "pull",
                lookupd=lookupd,
                pull=True,
                on_event=tally.on_event("pull"),
                client_id="demo-pull",
                **client_options,
            ) as consumer:
                pull_consumers.append(consumer)

                async def fetcher() -> None:
                    while not stop.is_set():
                        for msg in await consumer.fetch(options.batch, timeout=0.25):
                            _answer(ch, workload, msg)

                async with anyio.create_task_group() as tg:
                    for _ in range(FETCHERS):
                        tg.start_soon(fetcher)

        async def publish() -> None:
            batches: Iterator[tuple[str, int, list[int]]] = workload.batches()
            async with Producer(
                nsqd_addresses, **options.producer_options(), **client_tls
            ) as producer:

                async def worker() -> None:
                    for kind, defer_ms, seqs in batches:
                        if kind == "dpub":
                            body = workload.body(seqs[0], defer_ms)
                            await producer.deferred_publish(TOPIC, body, defer_ms / 1000.0)
                            tally.add_published(1, deferred=True)
                        else:
                            await producer.multi_publish(TOPIC, [workload.body(s) for s in seqs])
                            tally.add_published(len(seqs), deferred=False)

                tally.publish_started = time.monotonic()
                async with anyio.create_task_group() as tg:
                    for _ in range(PUBLISHERS):
                        tg.start_soon(worker)
                tally.publish_done = time.monotonic()

        with anyio.move_on_after(options.timeout) as deadline:
            async with anyio.create_task_group() as tg:
                for i in range(PUSH_CONSUMERS):
                    tg.start_soon(push, i)
                tg.start_soon(pull)
                tg.start_soon(publish)
                while not tally.all_accounted():
                    progress.update()
                    await anyio.sleep(0.2)
                # Everything is accounted for: drain (RDY 0, in-flight answered, CLS).
                stop.set()
                for consumer in push_consumers:
                    await consumer.drain(timeout=5.0)
        if deadline.cancelled_caught:
            result.timed_out = True
        if not tally.publish_done:
            tally.publish_done = time.monotonic()

"""The demo on the blocking transport: the broker runs on a background thread (its own
event loop), producers and consumers are the threaded clients of ``transports.sync``."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator
from typing import Any

from transports.embedded import Cluster, ServerThread
from transports.sync import Consumer, Message, Producer, PublishFuture
from transports.sync.admin import NSQDAdmin

from .accounting import ChannelTally, Tally, answer, tls_settings
from .report import DemoResult, Progress
from .workload import CHANNELS, TOPIC, DemoOptions, Workload

__all__ = ["run_blocking"]

PUSH_CONSUMERS = 2
FETCHERS = 4
PIPELINE = 64  # unanswered publishes in flight


def _answer(ch: ChannelTally, workload: Workload, msg: Message) -> None:
    answer(ch, workload, msg, Message.finish, Message.requeue)


def run_blocking(
    options: DemoOptions,
    workload: Workload,
    tally: Tally,
    progress: Progress,
    result: DemoResult,
    tls: tuple[str, str] | None,
) -> None:
    nsqd_options, client_tls = tls_settings(tls)
    with ServerThread(Cluster(nsqd_count=2, nsqd_options=nsqd_options)) as cluster:
        for nsqd in cluster.nsqds:  # before the first publish: no channel misses a message
            with NSQDAdmin(nsqd.http_url, timeout=5.0) as admin:
                admin.create_topic(TOPIC)
                for channel in CHANNELS:
                    admin.create_channel(TOPIC, channel)
        cluster.wait_registered_blocking(TOPIC)
        lookupd = cluster.lookupd_http_urls
        nsqd_addresses = cluster.nsqd_tcp_addresses
        client_options = {**options.client_options(), **client_tls}
        stop = threading.Event()
        consumers: list[Consumer] = []
        errors: list[BaseException] = []

        def guarded(target: Any, *args: Any) -> threading.Thread:
            def run() -> None:
                try:
                    target(*args)
                except BaseException as err:  # reported in the result, never lost
                    errors.append(err)
                    stop.set()

            thread = threading.Thread(target=run, daemon=True)
            thread.start()
            return thread

        def push(index: int) -> None:
            ch = tally.channels["push"]
            consumer = Consumer(
                TOPIC,
                "push",
                lookupd=lookupd,
                on_event=tally.on_event("push"),
                client_id=f"demo-push-{index}",
                **client_options,
            )
            consumers.append(consumer)
            if stop.is_set():  # the run ended before this thread got going
                return
            with consumer:
                for msg in consumer:  # ends once the consumer is drained
                    _answer(ch, workload, msg)

        def pull() -> None:
            ch = tally.channels["pull"]
            consumer = Consumer(
                TOPIC,
                "pull",
                lookupd=lookupd,
                pull=True,
                on_event=tally.on_event("pull"),
                client_id="demo-pull",
                **client_options,
            )
            consumers.append(consumer)

            def fetcher() -> None:
                while not stop.is_set():
                    for msg in consumer.fetch(options.batch, timeout=0.25):
                        _answer(ch, workload, msg)

            with consumer:
                threads = [guarded(fetcher) for _ in range(FETCHERS)]
                for thread in threads:
                    thread.join()

        def publish() -> None:
            batches: Iterator[tuple[str, int, list[int]]] = workload.batches()
            pending: list[tuple[PublishFuture, int, bool]] = []
            with Producer(nsqd_addresses, **options.producer_options(), **client_tls) as producer:
                tally.publish_started = time.monotonic()
                for kind, defer_ms, seqs in batches:
                    if stop.is_set():
                        return
                    if kind == "dpub":
                        future = producer.deferred_publish_async(
                            TOPIC, workload.body(seqs[0], defer_ms), defer_ms / 1000.0
                        )
                    else:
                        future = producer.multi_publish_async(
                            TOPIC, [workload.body(s) for s in seqs]
                        )
                    pending.append((future, len(seqs), kind == "dpub"))
                    if len(pending) >= PIPELINE:
                        for done, count, deferred in pending[: PIPELINE // 2]:
                            done.result()
                            tally.add_published(count, deferred)
                        del pending[: PIPELINE // 2]
                for done, count, deferred in pending:
                    done.result()
                    tally.add_published(count, deferred)
                tally.publish_done = time.monotonic()

        threads = [guarded(push, i) for i in range(PUSH_CONSUMERS)]
        threads.append(guarded(pull))
        threads.append(guarded(publish))
        deadline = time.monotonic() + options.timeout
        while not stop.is_set() and not tally.all_accounted():
            if time.monotonic() > deadline:
                result.timed_out = True
                break
            progress.update()
            time.sleep(0.2)
        stop.set()
        for consumer in consumers:
            if consumer.channel == "push":
                consumer.drain(timeout=5.0)
            else:
                consumer.close()
        for thread in threads:
            thread.join(15.0)
        if errors:
            result.error = f"{type(errors[0]).__name__}: {errors[0]}"
        if not tally.publish_done:
            tally.publish_done = time.monotonic()

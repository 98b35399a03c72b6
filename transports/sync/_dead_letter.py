"""The blocking consumer's dead-letter publisher: publishes what the core hands over as
:class:`~nsq_sansio.consumer.DeadLetter` with a :class:`~transports.sync.Producer`, and
reports the outcome back to the core on the consumer's IO thread (FIN after the publish, REQ
when it failed).

The IO thread never waits for a publish: deliveries go to one thread of their own
(``nsq-sync-dead-letter``, started at the first dead letter), which routes, builds the body
(user code: a routing function) and publishes, one after the other. With lookupd the producer
publishes to the nsqd the consumer is connected to; a dead letter from an nsqd it does not
know yet reopens it over the new set.
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable

from nsq_sansio.consumer import ConsumerCoordinator, Deliver
from transports._common.dead_letter import DeadLetters, DeadLetterSettings, producer_options
from transports._common.logs import fields, message_id_text
from transports._common.options import TransportOptions

from .producer import Producer

__all__ = ["DeadLetterPublisher"]


class DeadLetterPublisher:
    """Publishes one consumer's dead letters (see the module docstring)."""

    def __init__(
        self,
        settings: DeadLetterSettings,
        coordinator: ConsumerCoordinator,
        *,
        nsqd: list[str],
        options: TransportOptions,
        logger: logging.Logger,
        call_soon: Callable[[Callable[[], None]], None],
        connected: Callable[[], list[str]],
    ) -> None:
        self.logic = DeadLetters(settings, coordinator.topic, coordinator.channel)
        self._coord = coordinator
        self._nsqd = nsqd
        self._options = options
        self._logger = logger
        self._call_soon = call_soon
        self._connected = connected
        self._queue: queue.SimpleQueue[Deliver | None] = queue.SimpleQueue()
        self._thread: threading.Thread | None = None
        self._producer: Producer | None = None
        self._known: set[str] = set()

    def submit(self, delivery: Deliver) -> None:
        """The core handed ``delivery`` over (on the IO thread): publish it."""
        if self._thread is None:
            self._thread = threading.Thread(
                target=self._work, name="nsq-sync-dead-letter", daemon=True
            )
            self._thread.start()
        # The addresses are read here, on the IO thread that owns the connections.
        if not self.logic.fixed and str(delivery.address) not in self._known:
            self._known = set(
                self.logic.addresses(self._nsqd, [str(delivery.address), *self._connected()])
            )
            self._queue.put(None)  # reopen the producer over the set known now
        self._queue.put(delivery)

    def close(self) -> None:
        """Stop the thread (what it holds is requeued by nsqd when the consumer closes)."""
        thread = self._thread
        if thread is not None:
            self._closing = True
            self._queue.put(None)
            thread.join(10.0)

    _closing = False

    def _work(self) -> None:
        addresses: list[str] | None = None
        try:
            while True:
                delivery = self._queue.get()
                if delivery is None:
                    if self._closing:
                        return
                    addresses = None  # the next publish opens the producer again
                    self._close_producer()
                    continue
                if addresses is None:
                    addresses = self.logic.addresses(
                        self._nsqd, self._known or [str(delivery.address)]
                    )
                self._publish(delivery, addresses)
        finally:
            self._close_producer()

    def _close_producer(self) -> None:
        producer, self._producer = self._producer, None
        if producer is not None:
            try:
                producer.close()
            except Exception:
                self._logger.exception(
                    "closing the dead-letter producer failed",
                    extra=fields(topic=self.logic.topic, channel=self.logic.channel),
                )

    def _publish(self, delivery: Deliver, addresses: list[str]) -> None:
        topic: str | None = None
        coord = self._coord
        try:
            topic = self.logic.route(delivery)
            if topic is not None:
                if self._producer is None:
                    config = coord.config
                    self._producer = Producer(addresses, **producer_options(config, self._options))
                self._producer.publish(topic, self.logic.body(delivery))
        except Exception as exc:
            self._logger.warning(
                "dead-letter publish of message %s to %s failed, requeued: %r",
                message_id_text(delivery.id),
                topic,
                exc,
                extra=fields(
                    topic=self.logic.topic,
                    channel=self.logic.channel,
                    address=delivery.address,
                    message_id=delivery.id,
                    attempts=delivery.attempts,
                    error=exc,
                ),
            )
            self._call_soon(lambda: _report(coord, delivery, None, failed=True))
        else:
            chosen = topic
            self._call_soon(lambda: _report(coord, delivery, chosen, failed=False))


def _report(
    coord: ConsumerCoordinator, delivery: Deliver, topic: str | None, *, failed: bool
) -> None:
    """The publish's outcome, to the core (on the consumer's IO thread)."""
    if failed:
        coord.dead_letter_failed(delivery, time.monotonic())
    else:
        coord.dead_letter_published(delivery, time.monotonic(), topic)

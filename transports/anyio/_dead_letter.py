"""The anyio consumer's dead-letter publisher: publishes what the core hands over as
:class:`~nsq_sansio.consumer.DeadLetter` with a :class:`~transports.anyio.Producer`, and
reports the outcome back to the core (FIN after the publish, REQ when it failed).

One task of the consumer owns the producer (started at the first dead letter); each publish
runs in its own task under it, so one slow publish does not hold the others. With lookupd,
the producer publishes to the nsqd the consumer is connected to; a dead letter from an nsqd
it does not know yet reopens it over the new set (after the publishes under way).
"""

from __future__ import annotations

import logging
from collections import deque
from collections.abc import Callable
from time import monotonic

import anyio

from nsq_sansio.consumer import ConsumerCoordinator, Deliver
from nsq_sansio.errors import LocalProtocolError
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
        spawn: Callable[..., None],
        kick: Callable[[], None],
        connected: Callable[[], list[str]],
    ) -> None:
        self.logic = DeadLetters(settings, coordinator.topic, coordinator.channel)
        self._coord = coordinator
        self._nsqd = nsqd
        self._options = options
        self._logger = logger
        self._spawn = spawn
        self._kick = kick
        self._connected = connected
        self._queue: deque[Deliver] = deque()
        self._wake = anyio.Event()
        self._running = False

    def submit(self, delivery: Deliver) -> None:
        """The core handed ``delivery`` over: publish it (from the consumer's loop)."""
        self._queue.append(delivery)
        self._wake.set()
        if not self._running:
            try:
                self._spawn(self._run)
            except LocalProtocolError:  # the consumer is closing: nsqd keeps the message
                self._queue.clear()
                self._coord.dead_letter_failed(delivery, monotonic())
                self._kick()
                return
            self._running = True

    async def _run(self) -> None:
        while True:
            while not self._queue:
                self._wake = anyio.Event()
                await self._wake.wait()
            first = str(self._queue[0].address)
            addresses = self.logic.addresses(self._nsqd, [first, *self._connected()])
            known = set(addresses)
            config = self._coord.config
            async with (
                Producer(addresses, **producer_options(config, self._options)) as producer,
                anyio.create_task_group() as tg,
            ):
                while True:
                    while not self._queue:
                        self._wake = anyio.Event()
                        await self._wake.wait()
                    delivery = self._queue[0]
                    if not self.logic.fixed and str(delivery.address) not in known:
                        break  # reopen over the nsqd known now, once these publishes end
                    self._queue.popleft()
                    tg.start_soon(self._publish, producer, delivery)

    async def _publish(self, producer: Producer, delivery: Deliver) -> None:
        topic: str | None = None
        try:
            topic = self.logic.route(delivery)
            if topic is not None:
                await producer.publish(topic, self.logic.body(delivery))
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
            self._coord.dead_letter_failed(delivery, monotonic())
        else:
            self._coord.dead_letter_published(delivery, monotonic(), topic)
        self._kick()

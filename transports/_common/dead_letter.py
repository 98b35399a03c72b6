"""Dead letters, what every runtime shares: the consumer's settings checked, where a given-up
message goes and what is published, the last handler error of each message, and which nsqd
the dead-letter producer publishes to.

The runtimes' own parts only publish (``transports/anyio/_dead_letter.py``,
``transports/sync/_dead_letter.py``); the decision to hold the message until the publish is
reported is the core's (:class:`~nsq_sansio.consumer.DeadLetter`).
"""

from __future__ import annotations

import time
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from nsq_sansio.config import Config
from nsq_sansio.consumer import Deliver
from nsq_sansio.dead_letter import (
    DeadLetterEnvelope,
    DeadLetterFormat,
    check_dead_letter_format,
    check_dead_letter_topic,
    encode_envelope,
)
from nsq_sansio.errors import ConfigError
from nsq_sansio.events import Message

from .options import TransportOptions

__all__ = ["DeadLetterRoute", "DeadLetterSettings", "dead_letter_settings"]

#: ``message -> topic name or None``: where a given-up message goes (None: nowhere, it is
#: given up as without dead letters).
DeadLetterRoute = Callable[[Message], "str | None"]

#: How many messages' last handler error are remembered (the oldest are forgotten first).
_ERRORS_KEPT = 10_000


@dataclass(frozen=True)
class DeadLetterSettings:
    """A consumer's dead-letter destination, checked."""

    #: The topic, or the routing function.
    destination: str | DeadLetterRoute
    format: DeadLetterFormat
    #: nsqd TCP addresses to publish to; None: the consumer's own nsqd (see :func:`addresses`).
    nsqd: tuple[str, ...] | None


def dead_letter_settings(
    topic: str | DeadLetterRoute | None,
    format: object,
    nsqd: str | Iterable[str] | None,
) -> DeadLetterSettings | None:
    """The consumer's ``dead_letter_topic``, ``dead_letter_format`` and ``dead_letter_nsqd``
    checked (ConfigError, the same on every runtime); None when there is no destination."""
    checked_format = check_dead_letter_format(format)
    if nsqd is not None:
        addresses = (nsqd,) if isinstance(nsqd, str) else tuple(nsqd)
        if not addresses or not all(isinstance(a, str) and a for a in addresses):
            raise ConfigError(
                f"dead_letter_nsqd must be nsqd TCP addresses (host:port), got {nsqd!r}"
            )
    else:
        addresses = None
    if topic is None:
        if addresses is not None or checked_format is not DeadLetterFormat.BODY:
            raise ConfigError("dead_letter_format and dead_letter_nsqd need a dead_letter_topic")
        return None
    destination = topic if callable(topic) else check_dead_letter_topic(topic)
    return DeadLetterSettings(destination, checked_format, addresses)


class DeadLetters:
    """One consumer's dead-letter logic, without IO: the route, the body, the last errors."""

    def __init__(self, settings: DeadLetterSettings, topic: str, channel: str) -> None:
        self.settings = settings
        self.topic = topic
        self.channel = channel
        self._errors: OrderedDict[bytes, str] = OrderedDict()

    def note_error(self, message_id: bytes, error: BaseException) -> None:
        """The handler raised ``error`` for ``message_id``: the envelope's ``error`` if that
        message is given up here later."""
        errors = self._errors
        errors[message_id] = repr(error)
        errors.move_to_end(message_id)
        if len(errors) > _ERRORS_KEPT:
            errors.popitem(last=False)

    def route(self, delivery: Deliver) -> str | None:
        """The topic ``delivery`` goes to (None: nowhere). A routing function's exception
        goes up as itself; a name it returns that is not a topic name is a ConfigError."""
        destination = self.settings.destination
        if isinstance(destination, str):
            return destination
        chosen = destination(delivery.message)
        return None if chosen is None else check_dead_letter_topic(chosen)

    def body(self, delivery: Deliver) -> bytes:
        """What is published: the body as it came, or the JSON envelope around it."""
        if self.settings.format is DeadLetterFormat.BODY:
            self._errors.pop(delivery.id, None)
            return delivery.body
        envelope = DeadLetterEnvelope(
            id=delivery.id.decode("ascii", "replace"),
            attempts=delivery.attempts,
            timestamp=delivery.timestamp,
            topic=self.topic,
            channel=self.channel,
            nsqd=str(delivery.address),
            error=self._errors.pop(delivery.id, None),
            dead_lettered_at=time.time(),
            body=delivery.body,
        )
        return encode_envelope(envelope)

    def addresses(self, consumer_nsqd: Iterable[str], connected: Iterable[str]) -> list[str]:
        """Where the dead-letter producer publishes (its failover goes through them in turn):
        ``dead_letter_nsqd`` when given; else the consumer's own ``nsqd=`` addresses; else
        (lookupd) the nsqd the consumer is connected to now."""
        if self.settings.nsqd is not None:
            return list(self.settings.nsqd)
        own = list(dict.fromkeys(consumer_nsqd))
        return own if own else list(dict.fromkeys(connected))

    @property
    def fixed(self) -> bool:
        """Whether the producer's addresses are set once (False: lookupd, they follow the
        connections)."""
        return self.settings.nsqd is not None


def producer_options(config: Config, options: TransportOptions) -> dict[str, Any]:
    """The dead-letter producer's settings: the consumer's (TLS, AUTH, compression, timeouts)."""
    extra: dict[str, Any] = {"config": config}
    if config.tls_v1:
        extra["tls"] = options.tls
    return extra

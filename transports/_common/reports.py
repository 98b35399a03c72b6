"""What the clients log, written once: the same event gets the same level and the same text on
every runtime (anyio, trio, blocking), only the logger's name says which runtime logged it.

Every line about one connection goes through :class:`~.connection_log.ConnectionLogger`
(``[host:port]`` first, ``record.nsq_address`` set), and every record carries its facts as
``nsq_*`` extra fields (:func:`.logs.fields`). The consumers log the coordinator's reports with
:func:`log_consumer_report`; the producers call the ``log_*`` helpers below.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable

from nsq_sansio.consumer import (
    ConnectionUp,
    ConsumerFailed,
    Disconnected,
    GiveUp,
    LookupdFailed,
    NodeRefused,
    TakenBack,
)
from nsq_sansio.discovery import NSQDAddress
from nsq_sansio.errors import IncompatibleNSQD

from .connection_log import ConnectionLogger
from .failures import without_address
from .logs import fields, message_id_text
from .message import KeepaliveExpired

__all__ = [
    "EventCallback",
    "log_coalesced_refused",
    "log_consumer_report",
    "log_fetch_refused",
    "log_handler_failed",
    "log_keepalive_expired",
    "log_producer_disconnect",
    "log_publish_refused",
    "log_signal_drain",
]

#: ``on_event`` receives a consumer's reports (ConnectionUp, Disconnected, GiveUp, TakenBack,
#: LookupdFailed, NodeRefused, ConsumerFailed) and KeepaliveExpired, synchronously: on the
#: event loop, or, blocking, on the IO thread. It must return quickly and never block.
EventCallback = Callable[[object], None]


def log_consumer_report(
    logger: logging.Logger, action: object, *, topic: str, channel: str, now: float
) -> None:
    """Log one of the coordinator's reports (ConnectionUp, Disconnected, GiveUp, TakenBack,
    LookupdFailed, NodeRefused, ConsumerFailed); anything else is not logged."""
    if isinstance(action, TakenBack):
        message_id = message_id_text(action.message_id) if action.message_id else "?"
        ConnectionLogger(logger, str(action.address)).warning(
            "%s for message %s came too late: %s",
            action.command,
            message_id,
            action.error,
            extra=fields(
                topic=topic,
                channel=channel,
                message_id=action.message_id,
                command=action.command,
                error=action.error,
            ),
        )
    elif isinstance(action, Disconnected):
        log = ConnectionLogger(logger, str(action.address))
        if action.error is None:
            log.info(
                "connection closed", extra=fields(topic=topic, channel=channel, state="closed")
            )
            return
        delay = max(action.reconnect_at - now, 0.0) if action.reconnect_at is not None else None
        retry = f"; reconnecting in {delay:.1f}s" if delay is not None else ""
        log.warning(
            "connection lost: %s (%d messages unanswered%s)",
            action.error,
            len(action.unanswered),
            retry,
            extra=fields(
                topic=topic,
                channel=channel,
                error=action.error,
                count=len(action.unanswered),
                state="disconnected" if delay is None else "reconnecting",
                delay=delay,
            ),
        )
    elif isinstance(action, ConnectionUp):
        settings = action.settings
        ConnectionLogger(logger, str(action.address)).info(
            "subscribed to %s/%s (nsqd %s, max_rdy_count %d, msg_timeout %gs)",
            topic,
            channel,
            settings.version or "?",
            settings.max_rdy_count,
            settings.msg_timeout / 1000,
            extra=fields(topic=topic, channel=channel, state="subscribed"),
        )
    elif isinstance(action, GiveUp):
        message = action.message
        ConnectionLogger(logger, str(action.address)).warning(
            "giving up on message %s after %d attempts; it was FIN'd",
            message_id_text(message.id),
            message.attempts,
            extra=fields(
                topic=topic, channel=channel, message_id=message.id, attempts=message.attempts
            ),
        )
    elif isinstance(action, LookupdFailed):
        ConnectionLogger(logger, str(action.lookupd), field="nsq_lookupd").warning(
            "lookupd query failed: %s",
            action.error,
            extra=fields(topic=topic, channel=channel, error=action.error),
        )
    elif isinstance(action, NodeRefused):
        ConnectionLogger(logger, str(action.lookupd), field="nsq_lookupd").warning(
            "lookupd listed nsqd %s; nsqd_filter refused it: not connecting (said once)",
            action.address,
            extra=fields(topic=topic, channel=channel, address=action.address),
        )
    elif isinstance(action, ConsumerFailed):
        logger.error(
            "consumer %s/%s failed, not retrying: %s",
            topic,
            channel,
            action.error,
            extra=fields(topic=topic, channel=channel, error=action.error, state="failed"),
        )


def log_keepalive_expired(
    logger: logging.Logger,
    event: KeepaliveExpired,
    now: float,
    *,
    topic: str | None = None,
    channel: str | None = None,
) -> None:
    """``keepalive()`` cannot extend a message any further (nsqd's max_msg_timeout)."""
    delay = max(event.deadline - now, 0.0)
    ConnectionLogger(logger, str(event.address)).warning(
        "keepalive: message %s reaches nsqd's max_msg_timeout in %.1fs; nsqd will take it back "
        "and deliver it again unless it is answered (TOUCH cannot extend it further)",
        message_id_text(event.message_id),
        delay,
        extra=fields(topic=topic, channel=channel, message_id=event.message_id, delay=delay),
    )


def log_handler_failed(
    logger: logging.Logger,
    address: NSQDAddress | str,
    message_id: bytes,
    *,
    topic: str | None = None,
    channel: str | None = None,
    attempts: int | None = None,
) -> None:
    """``run()``'s handler raised (call from the ``except`` block: the traceback is logged)."""
    ConnectionLogger(logger, str(address)).exception(
        "handler failed for message %s; requeueing it",
        message_id_text(message_id),
        extra=fields(topic=topic, channel=channel, message_id=message_id, attempts=attempts),
    )


def log_fetch_refused(
    logger: logging.Logger, *, topic: str | None = None, channel: str | None = None
) -> None:
    logger.warning(
        "fetch refused: max_waiting_fetches requests already wait",
        extra=fields(topic=topic, channel=channel),
    )


def log_signal_drain(
    logger: logging.Logger, signum: int, *, topic: str | None = None, channel: str | None = None
) -> None:
    try:
        name = signal.Signals(signum).name
    except ValueError:
        name = str(signum)
    logger.warning(
        "signal %s received: draining the consumer",
        name,
        extra=fields(topic=topic, channel=channel, signal=name, state="draining"),
    )


def log_publish_refused(log: ConnectionLogger, kind: str, topic: str, error: BaseException) -> None:
    """nsqd refused one publish (its error goes to that publish's caller)."""
    log.warning(
        "%s to %r refused: %s",
        kind,
        topic,
        error,
        extra=fields(topic=topic, command=kind, error=error),
    )


def log_coalesced_refused(log: ConnectionLogger, topic: str, error: BaseException) -> None:
    """nsqd refused an MPUB that concurrent PUBs were coalesced into (once per MPUB)."""
    log.warning(
        "coalesced MPUB to %r refused (%s): each PUB goes again alone",
        topic,
        error,
        extra=fields(topic=topic, command="MPUB", error=error),
    )


def log_producer_disconnect(
    log: ConnectionLogger, error: BaseException, *, was_ready: bool, unanswered: int
) -> None:
    """A producer's connection attempt failed, or its connection was lost."""
    text = without_address(log.address, error)  # the line starts with the address already
    if isinstance(error, IncompatibleNSQD):
        log.error("nsqd cannot serve this producer: %s", text, extra=fields(error=text))
    elif was_ready:
        log.warning(
            "connection lost: %s (%d unanswered publishes go again)",
            text,
            unanswered,
            extra=fields(error=text, count=unanswered, state="reconnecting"),
        )
    else:
        log.warning("cannot connect: %s", text, extra=fields(error=text, state="reconnecting"))

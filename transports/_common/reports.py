"""What the clients log, written once: the same event gets the same level and the same text on
every runtime (anyio, trio, blocking), only the logger's name says which runtime logged it.

Every line about one connection goes through :class:`~.connection_log.ConnectionLogger`
(``[host:port]`` first, ``record.nsq_address`` set). The consumers log the coordinator's
reports with :func:`log_consumer_report`; the producers call the ``log_*`` helpers below.
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
        ConnectionLogger(logger, str(action.address)).warning(
            "%s for message %s came too late: %s",
            action.command,
            (action.message_id or b"?").decode(errors="replace"),
            action.error,
        )
    elif isinstance(action, Disconnected):
        log = ConnectionLogger(logger, str(action.address))
        if action.error is None:
            log.info("connection closed")
            return
        retry = (
            f"; reconnecting in {max(action.reconnect_at - now, 0.0):.1f}s"
            if action.reconnect_at is not None
            else ""
        )
        log.warning(
            "connection lost: %s (%d messages unanswered%s)",
            action.error,
            len(action.unanswered),
            retry,
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
        )
    elif isinstance(action, GiveUp):
        if action.dead_letter_topic is not None:
            ConnectionLogger(logger, str(action.address)).warning(
                "giving up on message %s after %d attempts; published to dead-letter topic "
                "%s, then FIN'd",
                action.message.id.decode(errors="replace"),
                action.message.attempts,
                action.dead_letter_topic,
            )
        else:
            ConnectionLogger(logger, str(action.address)).warning(
                "giving up on message %s after %d attempts; it was FIN'd",
                action.message.id.decode(errors="replace"),
                action.message.attempts,
            )
    elif isinstance(action, LookupdFailed):
        ConnectionLogger(logger, str(action.lookupd)).warning(
            "lookupd query failed: %s", action.error
        )
    elif isinstance(action, NodeRefused):
        ConnectionLogger(logger, str(action.lookupd)).warning(
            "lookupd listed nsqd %s; nsqd_filter refused it: not connecting (said once)",
            action.address,
        )
    elif isinstance(action, ConsumerFailed):
        logger.error("consumer %s/%s failed, not retrying: %s", topic, channel, action.error)


def log_keepalive_expired(logger: logging.Logger, event: KeepaliveExpired, now: float) -> None:
    """``keepalive()`` cannot extend a message any further (nsqd's max_msg_timeout)."""
    ConnectionLogger(logger, str(event.address)).warning(
        "keepalive: message %s reaches nsqd's max_msg_timeout in %.1fs; nsqd will take it back "
        "and deliver it again unless it is answered (TOUCH cannot extend it further)",
        event.message_id.decode(errors="replace"),
        max(event.deadline - now, 0.0),
    )


def log_handler_failed(
    logger: logging.Logger, address: NSQDAddress | str, message_id: bytes
) -> None:
    """``run()``'s handler raised (call from the ``except`` block: the traceback is logged)."""
    ConnectionLogger(logger, str(address)).exception(
        "handler failed for message %s; requeueing it", message_id.decode(errors="replace")
    )


def log_fetch_refused(logger: logging.Logger) -> None:
    logger.warning("fetch refused: max_waiting_fetches requests already wait")


def log_signal_drain(logger: logging.Logger, signum: int) -> None:
    try:
        name: object = signal.Signals(signum).name
    except ValueError:
        name = signum
    logger.warning("signal %s received: draining the consumer", name)


def log_publish_refused(log: ConnectionLogger, kind: str, topic: str, error: BaseException) -> None:
    """nsqd refused one publish (its error goes to that publish's caller)."""
    log.warning("%s to %r refused: %s", kind, topic, error)


def log_coalesced_refused(log: ConnectionLogger, topic: str, error: BaseException) -> None:
    """nsqd refused an MPUB that concurrent PUBs were coalesced into (once per MPUB)."""
    log.warning("coalesced MPUB to %r refused (%s): each PUB goes again alone", topic, error)


def log_producer_disconnect(
    log: ConnectionLogger, error: BaseException, *, was_ready: bool, unanswered: int
) -> None:
    """A producer's connection attempt failed, or its connection was lost."""
    text = without_address(log.address, error)  # the line starts with the address already
    if isinstance(error, IncompatibleNSQD):
        log.error("%s", text)
    elif was_ready:
        log.warning("connection lost: %s (%d unanswered publishes go again)", text, unanswered)
    else:
        log.warning("cannot connect: %s", text)

"""What the clients log, written once: the same event gets the same level and the same text on
every runtime (anyio, trio, blocking), only the logger's name says which runtime logged it.

Every line about one connection goes through :class:`~.connection_log.ConnectionLogger`
(``[host:port]`` first, ``record.nsq_address`` set). The consumers log the coordinator's
reports with :func:`log_consumer_report`; the producers call the ``log_*`` helpers below.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable, Iterable, Mapping, Sequence

from nsq_sansio.consumer import (
    ConnectionUp,
    ConsumerFailed,
    Disconnected,
    GiveUp,
    LookupdFailed,
    NodeRefused,
    TakenBack,
    TopicNotFound,
)
from nsq_sansio.discovery import NSQDAddress
from nsq_sansio.errors import IncompatibleNSQD, MessageGone, ServerError

from .connection_log import ConnectionLogger
from .failures import seconds, without_address
from .message import KeepaliveExpired

__all__ = [
    "EventCallback",
    "hex_id",
    "log_coalesced_refused",
    "log_consumer_report",
    "log_drain_timed_out",
    "log_fetch_refused",
    "log_handler_failed",
    "log_handlers_left_running",
    "log_keepalive_expired",
    "log_paused",
    "log_producer_disconnect",
    "log_publish_refused",
    "log_signal_drain",
    "log_signal_stop",
    "signal_name",
]

#: ``on_event`` receives a consumer's reports (ConnectionUp, Disconnected, GiveUp, TakenBack,
#: LookupdFailed, NodeRefused, TopicNotFound, DrainTimedOut, ConsumerFailed) and
#: KeepaliveExpired, synchronously: on the event loop, or, blocking, on the IO thread. It
#: must return quickly and never block.
EventCallback = Callable[[object], None]


def hex_id(message_id: bytes) -> str:
    """A message id as the logs print it: its hex text (nsqd's ids are 16 hex digits)."""
    return message_id.decode("ascii", "backslashreplace")


def _ids(message_ids: Iterable[bytes]) -> str:
    return ", ".join(map(hex_id, message_ids))


def _late_reason(action: TakenBack) -> str:
    """Why an answer came too late, without what the line says already (command, id,
    address): nsqd's error code and reason, or why the message is no longer ours."""
    error = action.error
    text = str(error)
    if action.message_id is not None:
        message_id = hex_id(action.message_id)
        if isinstance(error, MessageGone):
            prefix = f"{action.command} for message {message_id} from {action.address}: "
            if text.startswith(prefix):
                return text[len(prefix) :]
        elif isinstance(error, ServerError):  # nsqd: "FIN <id> failed ID not in flight"
            prefix = f"{action.command} {message_id} failed "
            if error.text.startswith(prefix):
                return f"{error.code} {error.text[len(prefix) :]}"
    return text


def log_consumer_report(
    logger: logging.Logger, action: object, *, topic: str, channel: str, now: float
) -> None:
    """Log one of the coordinator's reports (ConnectionUp, Disconnected, GiveUp, TakenBack,
    LookupdFailed, NodeRefused, ConsumerFailed); anything else is not logged."""
    if isinstance(action, TakenBack):
        ConnectionLogger(logger, str(action.address)).warning(
            "%s for message %s came too late: %s",
            action.command,
            hex_id(action.message_id or b"?"),
            _late_reason(action),
        )
    elif isinstance(action, Disconnected):
        log = ConnectionLogger(logger, str(action.address))
        if action.error is None:
            log.info("connection closed")
            return
        if isinstance(action.error, IncompatibleNSQD):
            # The consumer fails on it at once: its ERROR line (which names the address)
            # says it; this is only the connection's end.
            log.debug("connection closed: nsqd cannot serve this configuration")
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
        ConnectionLogger(logger, str(action.address)).warning(
            "giving up on message %s after %d attempts; it was FIN'd",
            hex_id(action.message.id),
            action.message.attempts,
        )
    elif isinstance(action, LookupdFailed):
        ConnectionLogger(logger, str(action.lookupd)).warning(
            "lookupd query failed: %s", action.error
        )
    elif isinstance(action, TopicNotFound):
        ConnectionLogger(logger, str(action.lookupd)).info(
            "lookupd lists no nsqd for topic %s: nothing to consume until an nsqd has it "
            "(lookupd is asked again at each poll)",
            action.topic,
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
        hex_id(event.message_id),
        max(event.deadline - now, 0.0),
    )


def log_handler_failed(
    logger: logging.Logger, address: NSQDAddress | str, message_id: bytes
) -> None:
    """``run()``'s handler raised (call from the ``except`` block: the traceback is logged)."""
    ConnectionLogger(logger, str(address)).exception(
        "handler failed for message %s; requeueing it", hex_id(message_id)
    )


def log_fetch_refused(logger: logging.Logger) -> None:
    logger.warning("fetch refused: max_waiting_fetches requests already wait")


def signal_name(signum: int) -> str:
    """``SIGTERM`` for 15: a signal as the logs name it."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def log_signal_drain(logger: logging.Logger, signum: int, timeout: float) -> None:
    """The first signal: a graceful drain starts (a second one stops at once)."""
    name = signal_name(signum)
    logger.warning(
        "%s received: draining the consumer (up to %s; %s again stops at once)",
        name,
        seconds(timeout),
        name,
    )


def log_signal_stop(logger: logging.Logger, signum: int) -> None:
    """A signal during the drain: stop at once (a third gets the runtime's own handling)."""
    logger.warning(
        "%s received again: stopping at once (unanswered messages are requeued)",
        signal_name(signum),
    )


def log_paused(logger: logging.Logger, topic: str, channel: str, max_in_flight: int) -> None:
    """``max_in_flight`` went to 0 (paused: nothing is asked of nsqd) or back up from it."""
    if max_in_flight == 0:
        logger.info(
            "consumer %s/%s is paused: max_in_flight is 0, so no message is asked for "
            "(set_max_in_flight() resumes it)",
            topic,
            channel,
        )
    else:
        logger.info("consumer %s/%s resumed: max_in_flight %d", topic, channel, max_in_flight)


def log_drain_timed_out(
    logger: logging.Logger,
    *,
    timeout: float,
    held: Sequence[bytes],
    cancelled: Sequence[bytes] = (),
    running: Mapping[bytes, str] | None = None,
) -> None:
    """The drain's deadline passed: what user code still held was requeued (``held``), and
    ``run()``'s handlers were cancelled (asyncio, trio: ``cancelled``) or are left running in
    their threads (blocking: ``running``, message id to thread name). One line, each message
    named once."""
    running = running or {}
    cancelled_set = set(cancelled)
    parts: list[str] = []
    if held:

        def named(message_id: bytes) -> str:
            if message_id in cancelled_set:
                return f"{hex_id(message_id)} (its run() handler cancelled)"
            if message_id in running:
                thread = running[message_id]
                return f"{hex_id(message_id)} (its run() handler still running on {thread})"
            return hex_id(message_id)

        one = len(held) == 1
        count, verb, them = (
            ("1 message", "was", "it") if one else (f"{len(held)} messages", "were", "them")
        )
        when = f"still unanswered after {seconds(timeout)}" if timeout > 0 else "unanswered"
        now = "" if timeout > 0 else " at once"
        parts.append(
            f"drain: {count} {when} {verb} requeued{now} (nsqd delivers {them} again): "
            + ", ".join(map(named, held))
        )
    after = [i for i in cancelled if i not in held]
    if after:
        parts.append(f"drain: run() handlers cancelled after answering: {_ids(after)}")
    if any(i in running for i in held):
        parts.append("a thread cannot be cancelled: what such a handler answers now is ignored")
    if not parts:
        return
    level = logging.WARNING if (timeout > 0 or cancelled or running) else logging.INFO
    logger.log(level, "%s", "; ".join(parts))


def log_handlers_left_running(logger: logging.Logger, running: Mapping[bytes, str]) -> None:
    """Blocking ``run()`` returned with handlers still running in their threads, not
    reported at the drain's deadline (they had answered their message)."""
    if running:
        threads = ", ".join(f"{hex_id(i)} on {name}" for i, name in running.items())
        logger.warning(
            "run() returns with handlers still running (a thread cannot be cancelled): %s",
            threads,
        )


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

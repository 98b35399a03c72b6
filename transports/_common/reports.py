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
from collections.abc import Callable, Iterable, Mapping, Sequence

from nsq_sansio.backoff import BackoffPhase
from nsq_sansio.consumer import (
    BackoffChanged,
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
from .logs import fields, message_id_text
from .message import KeepaliveExpired

__all__ = [
    "EventCallback",
    "log_coalesced_refused",
    "log_consumer_report",
    "log_drain_timed_out",
    "log_fetch_refused",
    "log_handler_failed",
    "log_handler_result_invalid",
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
#: BackoffChanged, LookupdFailed, NodeRefused, TopicNotFound, DrainTimedOut, ConsumerFailed)
#: and KeepaliveExpired, synchronously: on the event loop, or, blocking, on the IO thread.
#: It must return quickly and never block.
EventCallback = Callable[[object], None]


def _ids(message_ids: Iterable[bytes]) -> str:
    return ", ".join(map(message_id_text, message_ids))


def _late_reason(action: TakenBack) -> str:
    """Why an answer came too late, without what the line says already (command, id,
    address): nsqd's error code and reason, or why the message is no longer ours."""
    error = action.error
    text = str(error)
    if action.message_id is not None:
        message_id = message_id_text(action.message_id)
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
    BackoffChanged, LookupdFailed, NodeRefused, ConsumerFailed); anything else is not logged."""
    if isinstance(action, BackoffChanged):
        log_backoff(logger, action, topic=topic, channel=channel)
    elif isinstance(action, TakenBack):
        message_id = message_id_text(action.message_id) if action.message_id else "?"
        ConnectionLogger(logger, str(action.address)).warning(
            "%s for message %s came too late: %s",
            action.command,
            message_id,
            _late_reason(action),
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
        if isinstance(action.error, IncompatibleNSQD):
            # The consumer fails on it at once: its ERROR line (which names the address)
            # says it; this is only the connection's end.
            log.debug(
                "connection closed: nsqd cannot serve this configuration",
                extra=fields(topic=topic, channel=channel, error=action.error, state="failed"),
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
        given_up_fields = fields(
            topic=topic, channel=channel, message_id=message.id, attempts=message.attempts
        )
        if action.dead_letter_topic is not None:
            ConnectionLogger(logger, str(action.address)).warning(
                "giving up on message %s after %d attempts; published to dead-letter topic "
                "%s, then FIN'd",
                message_id_text(message.id),
                message.attempts,
                action.dead_letter_topic,
                extra=given_up_fields,
            )
        else:
            ConnectionLogger(logger, str(action.address)).warning(
                "giving up on message %s after %d attempts; it was FIN'd",
                message_id_text(message.id),
                message.attempts,
                extra=given_up_fields,
            )
    elif isinstance(action, LookupdFailed):
        ConnectionLogger(logger, str(action.lookupd), field="nsq_lookupd").warning(
            "lookupd query failed: %s",
            action.error,
            extra=fields(topic=topic, channel=channel, error=action.error),
        )
    elif isinstance(action, TopicNotFound):
        ConnectionLogger(logger, str(action.lookupd), field="nsq_lookupd").info(
            "lookupd lists no nsqd for topic %s: nothing to consume until an nsqd has it "
            "(lookupd is asked again at each poll)",
            action.topic,
            extra=fields(topic=topic, channel=channel),
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


def log_backoff(
    logger: logging.Logger, change: BackoffChanged, *, topic: str, channel: str
) -> None:
    """Backoff moved (once per change, at INFO): a window opened, a test, the end of it."""
    if change.phase is BackoffPhase.WAITING:
        logger.info(
            "backing off %.1f s after %d failure%s (level %d)",
            change.window,
            change.failures,
            "" if change.failures == 1 else "s",
            change.level,
            extra=fields(topic=topic, channel=channel, delay=change.window, count=change.failures),
        )
    elif change.phase is BackoffPhase.TESTING:
        logger.info(
            "testing after backoff (level %d)",
            change.level,
            extra=fields(topic=topic, channel=channel),
        )
    else:
        logger.info("resuming after backoff", extra=fields(topic=topic, channel=channel))


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


def log_handler_result_invalid(
    logger: logging.Logger,
    address: NSQDAddress | str,
    message_id: bytes,
    error: TypeError,
    *,
    topic: str | None = None,
    channel: str | None = None,
    attempts: int | None = None,
) -> None:
    """``run()``'s handler returned something other than None, True or False (``error`` says
    which handler and what it returned; logged with it, as a raised exception would be)."""
    ConnectionLogger(logger, str(address)).error(
        "handler failed for message %s; requeueing it",
        message_id_text(message_id),
        exc_info=(TypeError, error, None),
        extra=fields(
            topic=topic, channel=channel, message_id=message_id, attempts=attempts, error=error
        ),
    )


def log_fetch_refused(
    logger: logging.Logger, *, topic: str | None = None, channel: str | None = None
) -> None:
    logger.warning(
        "fetch refused: max_waiting_fetches requests already wait",
        extra=fields(topic=topic, channel=channel),
    )


def signal_name(signum: int) -> str:
    """``SIGTERM`` for 15: a signal as the logs name it."""
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


def log_signal_drain(
    logger: logging.Logger,
    signum: int,
    timeout: float,
    *,
    topic: str | None = None,
    channel: str | None = None,
) -> None:
    """The first signal: a graceful drain starts (a second one stops at once)."""
    name = signal_name(signum)
    logger.warning(
        "%s received: draining the consumer (up to %s; %s again stops at once)",
        name,
        seconds(timeout),
        name,
        extra=fields(topic=topic, channel=channel, signal=name, state="draining"),
    )


def log_signal_stop(
    logger: logging.Logger, signum: int, *, topic: str | None = None, channel: str | None = None
) -> None:
    """A signal during the drain: stop at once (a third gets the runtime's own handling)."""
    name = signal_name(signum)
    logger.warning(
        "%s received again: stopping at once (unanswered messages are requeued)",
        name,
        extra=fields(topic=topic, channel=channel, signal=name, state="closed"),
    )


def log_paused(logger: logging.Logger, topic: str, channel: str, max_in_flight: int) -> None:
    """``max_in_flight`` went to 0 (paused: nothing is asked of nsqd) or back up from it."""
    if max_in_flight == 0:
        logger.info(
            "consumer %s/%s is paused: max_in_flight is 0, so no message is asked for "
            "(set_max_in_flight() resumes it)",
            topic,
            channel,
            extra=fields(topic=topic, channel=channel, count=0),
        )
    else:
        logger.info(
            "consumer %s/%s resumed: max_in_flight %d",
            topic,
            channel,
            max_in_flight,
            extra=fields(topic=topic, channel=channel, count=max_in_flight),
        )


def log_drain_timed_out(
    logger: logging.Logger,
    *,
    timeout: float,
    held: Sequence[bytes],
    cancelled: Sequence[bytes] = (),
    running: Mapping[bytes, str] | None = None,
    topic: str | None = None,
    channel: str | None = None,
) -> None:
    """The drain's deadline passed: what user code still held was requeued (``held``), and
    ``run()``'s handlers were cancelled (asyncio, trio: ``cancelled``) or are left running in
    their threads (blocking: ``running``, message id to thread name). One line, each message
    named once: WARNING when the deadline cut something short, INFO for a drain asked to end
    at once with nothing running."""
    running = running or {}
    cancelled_set = set(cancelled)
    parts: list[str] = []
    if held:

        def named(message_id: bytes) -> str:
            if message_id in cancelled_set:
                return f"{message_id_text(message_id)} (its run() handler cancelled)"
            if message_id in running:
                thread = running[message_id]
                return (
                    f"{message_id_text(message_id)} (its run() handler still running on {thread})"
                )
            return message_id_text(message_id)

        one = len(held) == 1
        count, verb, them = (
            ("1 message", "was", "it") if one else (f"{len(held)} messages", "were", "them")
        )
        when = f"still unanswered after {seconds(timeout)}" if timeout > 0 else "unanswered"
        now = "" if timeout > 0 else " at once"
        parts.append(
            f"{count} {when} {verb} requeued{now} (nsqd delivers {them} again): "
            + ", ".join(map(named, held))
        )
    after = [i for i in cancelled if i not in held]
    if after:
        parts.append(f"run() handlers cancelled after answering: {_ids(after)}")
    if any(i in running for i in held):
        parts.append("a thread cannot be cancelled: what such a handler answers now is ignored")
    if not parts:
        return
    text = "; ".join(parts)
    extra = fields(topic=topic, channel=channel, count=len(held), state="draining")
    if timeout > 0 or cancelled or running:
        logger.warning("drain: %s", text, extra=extra)
    else:
        logger.info("drain: %s", text, extra=extra)


def log_handlers_left_running(
    logger: logging.Logger,
    running: Mapping[bytes, str],
    *,
    topic: str | None = None,
    channel: str | None = None,
) -> None:
    """Blocking ``run()`` returned with handlers still running in their threads, not
    reported at the drain's deadline (they had answered their message)."""
    if running:
        threads = ", ".join(f"{message_id_text(i)} on {name}" for i, name in running.items())
        logger.warning(
            "run() returns with handlers still running (a thread cannot be cancelled): %s",
            threads,
            extra=fields(topic=topic, channel=channel, count=len(running)),
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
        log.error(
            "nsqd cannot serve this producer: %s",
            text,
            extra=fields(error=text, state="failed"),
        )
    elif was_ready:
        log.warning(
            "connection lost: %s (%d unanswered publishes go again)",
            text,
            unanswered,
            extra=fields(error=text, count=unanswered, state="reconnecting"),
        )
    else:
        log.warning("cannot connect: %s", text, extra=fields(error=text, state="reconnecting"))

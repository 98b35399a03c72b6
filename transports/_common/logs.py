"""Structured logs: the facts of every record the library logs, as ``extra`` fields.

Every record carries its facts (topic, channel, nsqd address, message id...) as attributes
named ``nsq_*`` (so they never clash with :class:`logging.LogRecord`'s own), which JSON
formatters and structlog pick up. :func:`fields` builds the ``extra`` mapping, leaving out
what a record does not know; docs/logging.md lists each field and each message.
"""

from __future__ import annotations

__all__ = ["ROOT_LOGGER", "fields", "message_id_text"]

#: Every logger of the library is named under this one: ``logging.getLogger("nsq_sansio")``
#: configures them all.
ROOT_LOGGER = "nsq_sansio"


def message_id_text(message_id: bytes) -> str:
    """A message id as text: nsqd's ids are 16 hex digits (ASCII), shown as they are; any
    other bytes (a hostile or broken nsqd) as their hex, never as a ``b'...'`` repr."""
    if message_id.isalnum() and message_id.isascii():
        return message_id.decode("ascii")
    return message_id.hex()


def fields(
    *,
    topic: str | None = None,
    channel: str | None = None,
    address: object = None,
    lookupd: object = None,
    message_id: bytes | None = None,
    attempts: int | None = None,
    state: str | None = None,
    conn_id: int | None = None,
    error: BaseException | str | None = None,
    delay: float | None = None,
    count: int | None = None,
    command: str | None = None,
    signal: str | None = None,
) -> dict[str, object]:
    """The ``extra`` of one log record: each fact given, under its ``nsq_*`` name.

    ``address`` and ``lookupd`` become ``"host:port"`` text, ``message_id`` hex text,
    ``error`` its text (``str(error)``, or the exception's class name when that is empty).
    """
    extra: dict[str, object] = {}
    if topic is not None:
        extra["nsq_topic"] = topic
    if channel is not None:
        extra["nsq_channel"] = channel
    if address is not None:
        extra["nsq_address"] = str(address)
    if lookupd is not None:
        extra["nsq_lookupd"] = str(lookupd)
    if message_id is not None:
        extra["nsq_message_id"] = message_id_text(message_id)
    if attempts is not None:
        extra["nsq_attempts"] = attempts
    if state is not None:
        extra["nsq_state"] = state
    if conn_id is not None:
        extra["nsq_conn_id"] = conn_id
    if error is not None:
        extra["nsq_error"] = (
            error if isinstance(error, str) else (str(error) or type(error).__name__)
        )
    if delay is not None:
        extra["nsq_delay"] = round(delay, 3)
    if count is not None:
        extra["nsq_count"] = count
    if command is not None:
        extra["nsq_command"] = command
    if signal is not None:
        extra["nsq_signal"] = signal
    return extra

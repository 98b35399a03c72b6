"""What a ``run()`` handler's return value means, written once for every runtime.

As in pynsq: ``None`` (a plain ``return``) or ``True`` finishes the message, ``False``
requeues it (with backoff); a handler that raises requeues it too (the runtimes catch and log
that). Anything else is a mistake (an int, a string, a coroutine a blocking handler forgot to
await...): it is reported as a :class:`TypeError` naming the handler and the value, and the
message is requeued, never finished, since the handler said neither yes nor no.
"""

from __future__ import annotations

import inspect
import logging
from typing import Any

from nsq_sansio.discovery import NSQDAddress

from .reports import log_handler_result_invalid

__all__ = ["DRAIN_IN_HANDLER", "handler_finishes", "handler_name"]

#: Why ``drain()`` is refused in a ``run()`` handler, and what to call instead (one text for
#: every runtime's LocalProtocolError).
DRAIN_IN_HANDLER = (
    "drain() called from a run() handler of this consumer before its message was answered, "
    "where it would wait for that message until the drain's deadline: call start_drain(), "
    "which begins the drain and returns at once"
)


def handler_finishes(
    result: object,
    handler: Any,
    logger: logging.Logger,
    address: NSQDAddress | str,
    message_id: bytes,
    *,
    topic: str | None = None,
    channel: str | None = None,
    attempts: int | None = None,
) -> bool:
    """True when ``result`` (what ``handler`` returned for the message ``message_id``) means
    FIN, False when it means REQ with backoff; a result that is neither None, True nor False
    is logged as a TypeError first (and means REQ; ``topic``, ``channel`` and ``attempts`` go
    into the record's fields)."""
    if result is None or result is True:
        return True
    if result is False:
        return False
    hint = ""
    if inspect.iscoroutine(result):
        result.close()  # never awaited: say so once, here, not as a RuntimeWarning later
        hint = " (a coroutine: the blocking run() calls plain functions; use transports.anyio)"
    error = TypeError(
        f"run() handler {handler_name(handler)} returned {result!r}{hint}: expected None or "
        "True (finish the message) or False (requeue it)"
    )
    log_handler_result_invalid(
        logger, address, message_id, error, topic=topic, channel=channel, attempts=attempts
    )
    return False


def handler_name(handler: Any) -> str:
    """``module.qualname`` of a function or method, else the object's repr."""
    qualname = getattr(handler, "__qualname__", None)
    if isinstance(qualname, str):
        module = getattr(handler, "__module__", None)
        return f"{module}.{qualname}" if isinstance(module, str) else qualname
    return repr(handler)

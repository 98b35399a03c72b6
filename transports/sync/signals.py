"""Opt-in: turn SIGTERM / SIGHUP / SIGINT into a graceful drain of a blocking consumer.

::

    with Consumer("events", "archive", lookupd=[...]) as c, drain_on_signals(c):
        for msg in c:            # ends once the drain is over
            handle(msg)
            msg.finish()

The handler only *starts* the drain (a signal handler must not block): the consumer stops
taking messages (RDY 0 everywhere), requeues what user code has not seen, lets the messages in
user code finish, then closes. Iteration and ``run()`` return when that is done. A second
signal while draining is left to the previous handler (Ctrl-C twice still interrupts).
Signal handlers can only be installed from the main thread; elsewhere this raises
:class:`ValueError`, as :func:`signal.signal` does.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, Protocol

from transports._common.arguments import check_seconds
from transports._common.reports import log_signal_drain

__all__ = ["DEFAULT_DRAIN_SIGNALS", "Drainable", "drain_on_signals"]

_log = logging.getLogger("nsq_sansio.sync.consumer")


def _default_signals() -> tuple[signal.Signals, ...]:
    names = ("SIGTERM", "SIGHUP", "SIGINT")
    return tuple(getattr(signal, n) for n in names if hasattr(signal, n))


DEFAULT_DRAIN_SIGNALS: tuple[signal.Signals, ...] = _default_signals()


class Drainable(Protocol):
    def start_drain(self, timeout: float | None = None) -> None: ...

    @property
    def draining(self) -> bool: ...


@contextmanager
def drain_on_signals(
    consumer: Drainable, *signals: int, timeout: float | None = None
) -> Iterator[None]:
    """While the block runs, SIGTERM/SIGHUP/SIGINT (or ``signals``) start ``consumer``'s drain
    (with ``timeout``); the previous handlers come back on exit. A bad ``timeout`` raises
    LocalProtocolError here, not later in the signal handler."""
    if timeout is not None:
        check_seconds("drain timeout", timeout)
    previous: dict[int, Any] = {}

    def handler(signum: int, frame: FrameType | None) -> None:
        if consumer.draining:
            old = previous.get(signum)
            if callable(old):
                old(signum, frame)
            elif old == signal.SIG_DFL and signum == getattr(signal, "SIGINT", None):
                raise KeyboardInterrupt
            return
        log_signal_drain(
            _log,
            signum,
            topic=getattr(consumer, "topic", None),
            channel=getattr(consumer, "channel", None),
        )
        consumer.start_drain(timeout)

    installed: list[int] = []
    try:
        for signum in signals or DEFAULT_DRAIN_SIGNALS:
            previous[signum] = signal.signal(signum, handler)
            installed.append(signum)
        yield
    finally:
        for signum in installed:
            restore: Callable[..., Any] | int | None = previous[signum]
            signal.signal(signum, restore if restore is not None else signal.SIG_DFL)

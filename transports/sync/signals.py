"""Opt-in: turn SIGTERM / SIGHUP / SIGINT into a graceful drain of a blocking consumer.

::

    with Consumer("events", "archive", lookupd=[...]) as c, drain_on_signals(c):
        for msg in c:            # ends once the drain starts
            handle(msg)
            msg.finish()

The first signal only *starts* the drain (a signal handler must not block): the consumer stops
taking messages (RDY 0 everywhere), requeues what user code has not seen, lets the messages in
user code finish (up to the drain's timeout), then closes. Iteration ends as the drain starts
(nothing new comes) and ``run()`` once its handlers under way are done. One more signal during
the drain stops at once: what user code still holds is requeued, and the block is interrupted
where the main thread is (an exception the block's exit absorbs, as ``KeyboardInterrupt`` would
be raised there), so the code after it runs; the handlers that were there before are put back,
so a third signal gets their handling (Ctrl-C: ``KeyboardInterrupt``). Signal handlers can only
be installed from the main thread; elsewhere this raises :class:`ValueError`, as
:func:`signal.signal` does.
"""

from __future__ import annotations

import logging
import signal
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from types import FrameType
from typing import Any, Protocol

from nsq_sansio.config import Config
from transports._common.arguments import check_seconds
from transports._common.reports import log_signal_drain, log_signal_stop

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

    @property
    def config(self) -> Config: ...


class _StopNow(BaseException):
    """Raised in the main thread by a signal during the drain: it ends the block of
    :func:`drain_on_signals`, whose exit absorbs it (a ``BaseException``, as
    ``KeyboardInterrupt``, so that ``except Exception`` in user code lets it through)."""


@contextmanager
def drain_on_signals(
    consumer: Drainable, *signals: int, timeout: float | None = None
) -> Iterator[None]:
    """While the block runs, SIGTERM/SIGHUP/SIGINT (or ``signals``) start ``consumer``'s drain
    (with ``timeout``); one more during the drain stops at once and ends the block (the code
    after it runs); the previous handlers come back then, or on exit. A bad ``timeout``
    raises LocalProtocolError here, not later in the signal handler."""
    if timeout is not None:
        check_seconds("drain timeout", timeout)
    previous: dict[int, Any] = {}
    inside = False  # the block runs: a second signal may interrupt it

    def restore() -> None:
        for signum, old in list(previous.items()):
            signal.signal(signum, old if old is not None else signal.SIG_DFL)
        previous.clear()

    def handler(signum: int, frame: FrameType | None) -> None:
        if not consumer.draining:
            limit = consumer.config.drain_timeout if timeout is None else timeout
            log_signal_drain(
                _log,
                signum,
                limit,
                topic=getattr(consumer, "topic", None),
                channel=getattr(consumer, "channel", None),
            )
            consumer.start_drain(timeout)
            return
        log_signal_stop(
            _log,
            signum,
            topic=getattr(consumer, "topic", None),
            channel=getattr(consumer, "channel", None),
        )
        restore()  # a third signal gets the handling that was there before
        consumer.start_drain(0.0)  # what user code holds goes back now
        if inside:
            raise _StopNow

    try:
        for signum in signals or DEFAULT_DRAIN_SIGNALS:
            old: Callable[..., Any] | int | None = signal.signal(signum, handler)
            previous[signum] = old
        inside = True
        try:
            yield
        except _StopNow:
            pass  # a signal during the drain: the block is over
        finally:
            inside = False
    finally:
        restore()

"""The demo's accounting, written once for every runtime: what happened to each message on each
channel (:class:`ChannelTally`: finished, requeued, given up, redelivered, duplicated, with
latencies), the publishing counters (:class:`Tally`), and the steps each runtime's runner
shares: answering a message as the handler decides (:func:`answer`), the TLS settings for
broker and clients (:func:`tls_settings`).
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from typing import Any, Protocol, TypeVar

from transports._common import TLSOptions

from .workload import CHANNELS, HEADER, Workload

__all__ = ["ChannelTally", "Tally", "answer", "tls_settings"]

# Bound once: a method called on an imported name compiles to a slower attribute load (3.11).
_unpack_header = HEADER.unpack_from


_PENDING, _FINISHED, _GIVEN_UP = 0, 1, 2


class ChannelTally:
    """What happened to every message on one channel. Thread-safe (the blocking runtime)."""

    def __init__(self, name: str, count: int) -> None:
        self.name = name
        self.count = count
        self.state = bytearray(count)
        self.first_ok_attempt = [0] * count
        self.handled = 0
        self.finished = 0
        self.requeued = 0
        self.given_up = 0
        self.redelivered = 0
        self.duplicates = 0
        self.double_end = 0  # finished and given up
        self.taken_back = 0
        self.latencies: list[float] = []
        self.first_at = 0.0
        self.last_at = 0.0
        self._lock = threading.Lock()

    @property
    def accounted(self) -> int:
        return self.finished + self.given_up

    def complete(self) -> bool:
        return self.accounted >= self.count

    def handle(self, workload: Workload, body: bytes, attempts: int) -> bool:
        """The demo's handler: True = finish it, False = requeue it."""
        seq, published, defer_ms = Workload.parse(body)
        now = time.monotonic()
        with self._lock:
            self.handled += 1
            if not self.first_at:
                self.first_at = now
            self.last_at = now
            if attempts == 1:
                self.latencies.append(now - published - defer_ms / 1000.0)
        fails = workload.is_poison(seq) or (attempts == 1 and workload.fails_first(seq))
        return not fails

    def record_requeue(self) -> None:
        with self._lock:
            self.requeued += 1

    def record_finish(self, body: bytes, attempts: int) -> None:
        seq = _unpack_header(body)[0]
        with self._lock:
            state = self.state[seq]
            if state == _PENDING:
                self.state[seq] = _FINISHED
                self.first_ok_attempt[seq] = attempts
                self.finished += 1
            elif state == _GIVEN_UP:
                self.double_end += 1
            elif attempts > self.first_ok_attempt[seq]:
                self.redelivered += 1
                self.first_ok_attempt[seq] = attempts
            else:
                self.duplicates += 1

    def record_give_up(self, body: bytes) -> None:
        seq = _unpack_header(body)[0]
        with self._lock:
            state = self.state[seq]
            if state == _PENDING:
                self.state[seq] = _GIVEN_UP
                self.given_up += 1
            elif state == _FINISHED:
                self.double_end += 1
            # given up twice: nsqd redelivered it after the FIN was lost; a retry, not a loss
            else:
                self.redelivered += 1

    def record_taken_back(self) -> None:
        with self._lock:
            self.taken_back += 1

    def missing(self, limit: int = 10) -> list[int]:
        out = []
        for seq, state in enumerate(self.state):
            if state == _PENDING:
                out.append(seq)
                if len(out) >= limit:
                    break
        return out

    def wrongly_given_up(self, workload: Workload) -> int:
        return sum(
            1
            for seq, state in enumerate(self.state)
            if state == _GIVEN_UP and not workload.is_poison(seq)
        )


class Tally:
    """Publishing counters plus one :class:`ChannelTally` per channel."""

    def __init__(self, workload: Workload) -> None:
        self.workload = workload
        self.published = 0
        self.deferred = 0
        self.publish_started = 0.0
        self.publish_done = 0.0
        self.channels = {name: ChannelTally(name, workload.count) for name in CHANNELS}
        self._lock = threading.Lock()

    def add_published(self, count: int, deferred: bool) -> None:
        with self._lock:
            self.published += count
            if deferred:
                self.deferred += count

    def complete(self) -> bool:
        return all(ch.complete() for ch in self.channels.values())

    def all_accounted(self) -> bool:
        """Everything published, and every message finished or given up on every channel:
        the runners wait for this, then drain."""
        return self.complete() and self.published >= self.workload.count

    def on_event(self, channel: str) -> Callable[[object], None]:
        """An ``on_event`` callback recording GiveUp and TakenBack reports for ``channel``."""
        from nsq_sansio.consumer import GiveUp, TakenBack

        tally = self.channels[channel]

        def on_event(event: object) -> None:
            if isinstance(event, GiveUp):
                tally.record_give_up(event.message.body)
            elif isinstance(event, TakenBack):
                tally.record_taken_back()

        return on_event


# --- what every runner does the same way -----------------------------------------------------


class Answerable(Protocol):
    """A delivered message as the runners see it (both runtimes' ``Message`` are one)."""

    @property
    def body(self) -> bytes: ...

    @property
    def attempts(self) -> int: ...


M = TypeVar("M", bound=Answerable)


def answer(
    ch: ChannelTally,
    workload: Workload,
    msg: M,
    finish: Callable[[M], bool],
    requeue: Callable[..., bool],
) -> None:
    """Run the demo's handler on ``msg`` and answer it: ``finish(msg)``, or
    ``requeue(msg, backoff=...)`` (the runtime's own answer calls), counting what was taken."""
    body, attempts = msg.body, msg.attempts
    if ch.handle(workload, body, attempts):
        if finish(msg):
            ch.record_finish(body, attempts)
    elif requeue(msg, backoff=workload.wants_backoff(body, attempts)):
        ch.record_requeue()


def tls_settings(tls: tuple[str, str] | None) -> tuple[dict[str, Any], dict[str, Any]]:
    """(nsqd options, client options) for a (cert, key) pair: TLS on both sides, or none."""
    if tls is None:
        return {}, {}
    return (
        {"tls_cert": tls[0], "tls_key": tls[1]},
        {"tls_v1": True, "tls": TLSOptions(ca_file=tls[0])},
    )

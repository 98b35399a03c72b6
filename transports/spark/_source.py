"""The streaming source's consumer: the blocking transport's pull-mode Consumer, holding the
messages of micro-batches in flight until Spark has committed them.

Every consuming decision (RDY, discovery, reconnection, TLS, AUTH, compression, the pull
budget) is the core's, through :class:`transports.sync.Consumer` with ``pull=True``. What a
micro-batch source adds on top:

* The messages taken for a batch stay unanswered across micro-batches, possibly for minutes. A
  background thread TOUCHes every one of them each ``touch_interval`` (by default a third of
  the msg_timeout nsqd announced), so nsqd keeps them while Spark works or waits for a trigger.
* nsqd caps what one connection may hold unanswered (``--max-rdy-count``, 2500 by default) and
  the core opens one connection per nsqd; a micro-batch holds all its messages. So when
  ``max_in_flight`` is above that cap, the source runs several consumers on the channel
  (each its own connection to every nsqd, ``max_in_flight`` split between them), up to
  :data:`MAX_CONSUMERS`, and fetches from all of them at once (40 consumers fetch 100,000
  messages as fast as one whose nsqd allows 100,000 per connection).

A message is answered on the connection it came from (the core's rule); one whose connection
died is not ours any more (nsqd redelivers it), which :meth:`SourceConsumer.finish` reports.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
import time
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from itertools import groupby
from operator import attrgetter

from nsq_sansio.consumer import ConnectionUp, Disconnected, LookupdFailed
from nsq_sansio.errors import NSQError
from transports._common.logs import fields
from transports.sync import Consumer, Message

from . import _collector
from ._options import ReadOptions

__all__ = ["MAX_CONSUMERS", "SourceConsumer", "consumers_needed"]

_log = logging.getLogger("nsq_sansio.spark.source")

#: Most consumers (so connections per nsqd) one source runs; with nsqd's default
#: ``--max-rdy-count`` of 2500 that bounds a micro-batch at 160,000 messages per nsqd.
MAX_CONSUMERS = 64

#: A fetch waits at least this long (the core refuses a zero wait; ``linger=0`` means "what
#: nsqd sends at once").
_MIN_WAIT = 0.01


_taken_back = attrgetter("taken_back")
_owner = attrgetter("_consumer")  # the Consumer that delivered a Message


def consumers_needed(max_in_flight: int, max_rdy_count: int) -> int:
    """How many consumers let one nsqd hand out ``max_in_flight`` messages at once."""
    return max(1, min(MAX_CONSUMERS, math.ceil(max_in_flight / max(1, max_rdy_count))))


def _shares(total: int, parts: int) -> list[int]:
    base, extra = divmod(total, parts)
    return [base + (1 if i < extra else 0) for i in range(parts)]


class SourceConsumer:
    """Pull-mode consumers of ``options.topic``/``options.channel`` for one streaming source.

    :meth:`take` fetches a batch and keeps it in flight (TOUCHed) until :meth:`finish`.
    Thread-safe for one caller (Spark calls the source from one thread) plus the toucher.
    """

    def __init__(self, options: ReadOptions, reserve: int = 0) -> None:
        self.options = options
        #: Messages the consumers may hold at once: ``max_in_flight``, plus ``reserve`` for the
        #: redeliveries of a committed batch a restarted source sets aside until they can be
        #: matched (so that they never starve the batches).
        self.capacity = options.max_in_flight + max(0, reserve)
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)
        self._consumers: list[Consumer] = []
        self._up: dict[tuple[int, int], str] = {}  # (consumer, conn_id) -> nsqd address
        self._errors: dict[str, str] = {}
        self._max_rdy: int | None = None
        self._msg_timeout: float | None = None
        self._max_msg_timeout = 900.0  # nsqd's default --max-msg-timeout, until it says
        self._scaled = False
        self._held: set[Message] = set()
        self._pool: ThreadPoolExecutor | None = None
        self._prefetcher: ThreadPoolExecutor | None = None
        self._prefetch_job: Future[list[Message]] | None = None
        self._ready: list[Message] = []
        self._prefetch_count = 0  # what the running prefetch asked for
        self._stop = threading.Event()
        self._toucher: threading.Thread | None = None
        self._collector_raised = False
        self.touches = 0

    # --- lifecycle -----------------------------------------------------------------------------

    def start(self) -> None:
        """Start the first consumer; with nsqd addresses, raise :class:`NSQError` when none
        of them could be subscribed to within ``connect_timeout``."""
        options = self.options
        if not self._collector_raised:  # see _collector: batches held in flight
            self._collector_raised = _collector.raise_threshold(options.gc_threshold)
        self._consumers.append(self._new_consumer(0, self.capacity))
        deadline = time.monotonic() + options.connect_timeout
        with self._changed:
            while not self._up:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._changed.wait(min(left, 0.1))
            connected = bool(self._up)
            details = "; ".join(f"{a}: {e}" for a, e in sorted(self._errors.items()))
        if not connected:
            if options.nsqd and not options.lookupd:
                self.close()
                raise NSQError(
                    f"could not subscribe to {options.topic!r}/{options.channel!r} on any nsqd "
                    f"of {list(options.nsqd)} within {options.connect_timeout}s"
                    + (f" ({details})" if details else "")
                )
            _log.warning(
                "nsq source: no nsqd subscribed to %r/%r yet%s; still trying",
                options.topic,
                options.channel,
                f" ({details})" if details else "",
                extra=fields(topic=self.options.topic, channel=self.options.channel),
            )
        self._scale()
        self._toucher = threading.Thread(target=self._touch_loop, name="nsq-spark-touch")
        self._toucher.daemon = True
        self._toucher.start()

    def close(self) -> None:
        """REQ every message still held (Spark did not commit it), close every consumer."""
        self._stop.set()
        with self._lock:
            self._held.clear()
            consumers, self._consumers = self._consumers, []
        for consumer in consumers:
            with contextlib.suppress(Exception):
                consumer.close()
        for pool in (self._pool, self._prefetcher):
            if pool is not None:
                pool.shutdown(wait=False)
        self._ready = []
        if self._toucher is not None and self._toucher is not threading.current_thread():
            self._toucher.join(5.0)
        if self._collector_raised:
            self._collector_raised = False
            _collector.restore_threshold()

    # --- taking and answering ----------------------------------------------------------------

    def take(
        self, limit: int, wait: float, linger: float = 0.0, *, prefetch: int = 0
    ) -> list[Message]:
        """Up to ``limit`` messages: what nsqd sends within ``linger`` s, else the first to come
        within ``wait`` s and what follows it within ``linger`` s. They stay in flight,
        TOUCHed, until :meth:`finish`.

        ``prefetch``: then fetch up to that many more in the background (held and TOUCHed
        too), so that the next take finds them ready: reading from nsqd overlaps with Spark's
        work on the batch just taken. The next take returns them (``linger`` applied from
        when the prefetch started)."""
        self._scale()
        linger = max(linger, _MIN_WAIT)
        got, filled = self._take_prefetched(limit)
        if got and filled and len(got) < limit:
            # The prefetch was filled (there may be more): top the batch up.
            more = self._fetch_all(limit - len(got), linger)
            with self._lock:
                self._held.update(more)
            got += more
        if not got:
            got = self._fetch_all(limit, linger)
            if not got and wait > linger and self._consumers:
                got = self._consumers[0].fetch(1, timeout=wait - linger)
                if got and limit > 1:
                    got += self._fetch_all(limit - 1, linger)
            if got:
                with self._lock:
                    self._held.update(got)
        if prefetch > 0 and not self._stop.is_set():
            self._start_prefetch(prefetch, linger)
        return got

    def _take_prefetched(self, limit: int) -> tuple[list[Message], bool]:
        """Up to ``limit`` prefetched messages, and whether the prefetch was filled (so that
        more may be waiting on nsqd)."""
        job, self._prefetch_job = self._prefetch_job, None
        filled = False
        if job is not None:
            fetched = job.result()
            filled = len(fetched) >= self._prefetch_count
            self._ready += fetched
        if not self._ready:
            return [], False
        # Held since the last trigger: those nsqd took back, or that come close to its
        # max_msg_timeout (TOUCH cannot keep them longer), go back to nsqd instead.
        oldest = time.monotonic() - self._max_msg_timeout / 2
        stale = [m for m in self._ready if m.taken_back or m.received_at < oldest]
        if stale:
            self._ready = [m for m in self._ready if not (m.taken_back or m.received_at < oldest)]
            with self._lock:
                self._held.difference_update(stale)
            for message in stale:
                message.requeue(0.0, backoff=False)
        got, self._ready = self._ready[:limit], self._ready[limit:]
        return got, filled

    def _start_prefetch(self, count: int, linger: float) -> None:
        if self._prefetcher is None:
            self._prefetcher = ThreadPoolExecutor(1, thread_name_prefix="nsq-spark-prefetch")

        def fetch() -> list[Message]:
            got = self._fetch_all(count, linger)
            with self._lock:
                self._held.update(got)
            return got

        self._prefetch_count = count
        self._prefetch_job = self._prefetcher.submit(fetch)

    def finish(self, messages: Sequence[Message]) -> int:
        """FIN ``messages``; returns how many were still ours (the others' connection closed or
        nsqd timed them out: nsqd delivers those again)."""
        with self._lock:
            self._held.difference_update(messages)
        gone: int = sum(map(_taken_back, messages))
        # One post per consumer (a batch holds runs of each consumer's fetch), not one each.
        for consumer, run in groupby(messages, _owner):
            consumer.finish_many(list(run))
        return len(messages) - gone

    def connected(self) -> list[str]:
        """nsqd addresses with at least one subscribed connection."""
        with self._lock:
            return sorted(set(self._up.values()))

    @property
    def max_msg_timeout(self) -> float:
        """Seconds nsqd keeps a message for a consumer at most, TOUCH or not (its
        ``--max-msg-timeout``, as IDENTIFY announced; 15 minutes until then)."""
        return self._max_msg_timeout

    @property
    def consumer_count(self) -> int:
        return len(self._consumers)

    @property
    def touch_interval(self) -> float:
        """Seconds between TOUCH sweeps: the option, else a third of nsqd's msg_timeout."""
        if self.options.touch_interval is not None:
            return self.options.touch_interval
        timeout = self._msg_timeout or self.options.msg_timeout or 60.0
        return timeout / 3

    # --- internals -----------------------------------------------------------------------------

    def _new_consumer(self, index: int, max_in_flight: int) -> Consumer:
        options = self.options

        def on_event(event: object) -> None:
            self._on_event(index, event)

        consumer = Consumer(
            options.topic,
            options.channel,
            nsqd=list(options.nsqd),
            lookupd=list(options.lookupd),
            pull=True,
            on_event=on_event,
            **options.consumer_kwargs(max_in_flight),
        )
        consumer.start()
        return consumer

    def _on_event(self, index: int, event: object) -> None:
        """The consumers' reports (on their IO threads: short)."""
        if isinstance(event, ConnectionUp):
            with self._changed:
                address = str(event.address)
                self._up[(index, event.conn_id)] = address
                self._errors.pop(address, None)
                settings = event.settings
                if self._max_rdy is None or settings.max_rdy_count < self._max_rdy:
                    self._max_rdy = max(1, settings.max_rdy_count)
                self._max_msg_timeout = min(self._max_msg_timeout, settings.max_msg_timeout / 1000)
                timeout = settings.msg_timeout / 1000
                if timeout > 0 and (self._msg_timeout is None or timeout < self._msg_timeout):
                    self._msg_timeout = timeout
                self._changed.notify_all()
        elif isinstance(event, Disconnected):
            with self._changed:
                self._up.pop((index, event.conn_id), None)
                if event.error is not None:
                    self._errors[str(event.address)] = str(event.error)
        elif isinstance(event, LookupdFailed):
            with self._changed:
                self._errors[str(event.lookupd)] = str(event.error)

    def _scale(self) -> None:
        """Once nsqd's max_rdy_count is known: enough consumers for max_in_flight."""
        if self._scaled or self._max_rdy is None or self._stop.is_set():
            return
        self._scaled = True
        wanted = consumers_needed(self.capacity, self._max_rdy)
        if wanted == 1:
            return
        shares = _shares(self.capacity, wanted)
        self._consumers[0].set_max_in_flight(shares[0])
        for index in range(1, wanted):
            self._consumers.append(self._new_consumer(index, shares[index]))
        self._pool = ThreadPoolExecutor(wanted, thread_name_prefix="nsq-spark-fetch")
        _log.info(
            "nsq source: %d consumers on %r/%r (max_in_flight %d over nsqd's max_rdy_count %d)",
            wanted,
            self.options.topic,
            self.options.channel,
            self.capacity,
            self._max_rdy,
            extra=fields(topic=self.options.topic, channel=self.options.channel),
        )

    def _fetch_all(self, count: int, wait: float) -> list[Message]:
        consumers = self._consumers
        if not consumers or count < 1:
            return []
        if len(consumers) == 1 or self._pool is None:
            return consumers[0].fetch(count, timeout=wait)
        jobs = [
            self._pool.submit(consumer.fetch, share, wait)
            for consumer, share in zip(consumers, _shares(count, len(consumers)), strict=True)
            if share > 0
        ]
        got: list[Message] = []
        for job in jobs:
            got += job.result()
        return got

    def _touch_loop(self) -> None:
        """TOUCH every held message each touch_interval (they wait for Spark's commit)."""
        while not self._stop.wait(self.touch_interval):
            with self._lock:
                held = list(self._held)
            touched = 0
            for message in held:
                if message.touch():
                    touched += 1
            self.touches += touched

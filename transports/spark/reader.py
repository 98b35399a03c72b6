"""The streaming source: a channel read in micro-batches, at-least-once.

How the source knows a batch is durable
---------------------------------------
Spark runs everything below on the driver, in one long-lived Python process per query, so the
consumer (its connections and the messages it holds) lives across micro-batches. In Spark's
default synchronous micro-batch loop, ``latestOffset(start, ...)`` is called at every trigger,
data or not, and only after the previous batch ran and its entry was written to the
checkpoint's commit log; ``start`` is then that batch's end offset. So when
``latestOffset`` receives ``start = {"batch": N, ...}``, batch N is durably complete, and its
messages are FIN'd there, before batch N+1 is taken. (``commit(end)``, which Spark calls one
batch late and not at all on an idle stream, FINs too, idempotently.) Until then the consumer
TOUCHes every message held (``touch_interval``, by default a third of nsqd's msg_timeout), so
nothing times out while Spark works or idles between triggers.

Offsets: ``{"batch": N, "count": n, "nsqd": {"host:port": [run, ...]}}``, where the runs
summarise the ids the batch took from that nsqd (see ``_redelivery``): under a kilobyte per
nsqd whatever the batch size. They let a restarted query recognise the redeliveries of a batch
that was committed but whose FINs were not sent (the query stopped between its commit and the
next trigger): they are FIN'd and dropped, never read again. A batch found in the offset log
but not committed is replayed by Spark through ``partitions()``; the source cannot rebuild it
(nsqd took the messages back), so it answers with no rows and the messages come again,
redelivered by nsqd, in later batches.

A micro-batch's rows travel to the executors inside its tasks, as Arrow record batches: they
are cut by count (``partitions``) and by bytes (``max_partition_bytes``), so that no task comes
near Spark's ``spark.rpc.message.maxSize``.
"""

from __future__ import annotations

import logging
import time
from bisect import bisect_right
from collections import Counter
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from itertools import accumulate, repeat
from operator import add, attrgetter
from typing import Any

from pyspark.sql.datasource import DataSourceStreamReader, InputPartition
from pyspark.sql.streaming.datasource import (
    ReadAllAvailable,
    ReadLimit,
    ReadMaxRows,
    SupportsTriggerAvailableNow,
)
from pyspark.sql.types import (
    BinaryType,
    IntegerType,
    StringType,
    StructField,
    StructType,
    TimestampType,
)

from nsq_sansio.errors import NSQError
from nsq_sansio.frames import MESSAGE_ID_SIZE
from transports._common.logs import fields
from transports.sync import Message

from ._nsqd_http import ChannelCounts, NSQDView
from ._options import PARTITION_BYTES_CEILING, NSQOptionError, ReadOptions
from ._redelivery import RedeliveryFilter, batch_digests, digests_from_offset
from ._source import SourceConsumer

__all__ = ["SOURCE_SCHEMA", "NSQDataLossError", "NSQStreamReader"]

_log = logging.getLogger("nsq_sansio.spark.reader")

#: After a restart, when an nsqd's /stats cannot be read: how long the redeliveries of the
#: last committed batch may trickle in (since the last one, and beyond msg_timeout after the
#: start) before the ones set aside are read after all (as duplicates).
REDELIVERY_PATIENCE = 10.0

#: Seconds between two /stats reads of the redelivery filter's check, and of the lag.
STATS_INTERVAL = 1.0
LAG_INTERVAL = 0.1


class NSQDataLossError(NSQError):
    """``fail_on_data_loss``: nsqd took back messages of a micro-batch before Spark committed
    it (their timeout passed, or their connection closed); they will be delivered again."""


SOURCE_SCHEMA = StructType(
    [
        StructField("id", StringType(), False),
        StructField("body", BinaryType(), False),
        StructField("timestamp", TimestampType(), False),
        StructField("attempts", IntegerType(), False),
        StructField("topic", StringType(), False),
        StructField("channel", StringType(), False),
        StructField("nsqd", StringType(), False),
    ]
)

# The core's Deliver handle carries the message's fields itself (by name: its layout is the
# core's business).
_delivery = attrgetter("delivery")
_address = attrgetter("address")
_id = attrgetter("id")
_body = attrgetter("body")
_timestamp = attrgetter("timestamp")
_attempts = attrgetter("attempts")
_taken_back = attrgetter("taken_back")


@dataclass
class NSQInputPartition(InputPartition):
    """One micro-batch (or a slice of it) as an Arrow record batch, shipped to the executor
    that reads it (the messages were read on the driver)."""

    batch: Any  # pyarrow.RecordBatch with SOURCE_SCHEMA's columns


def _redelivery_key(message: Message) -> tuple[str, bytes, int]:
    return message.nsqd_address, message.id, message.attempts


class _Nodes:
    """Which nsqd each message of a batch came from, without a Python loop over the batch
    when they all came from one nsqd (the common case, however many connections)."""

    __slots__ = ("codes", "names")

    def __init__(self, deliveries: Sequence[Any]) -> None:
        addresses = list(map(_address, deliveries))
        # One address object per connection: a handful, however large the batch.
        objects = dict(zip(map(id, addresses), addresses, strict=True))
        spelled = {key: str(address) for key, address in objects.items()}
        #: The nsqd addresses, sorted.
        self.names: list[str] = sorted(set(spelled.values()))
        #: Each message's index in :attr:`names`; None when there is one name.
        self.codes: list[int] | None = None
        if len(self.names) > 1:
            index = {key: self.names.index(name) for key, name in spelled.items()}
            self.codes = list(map(index.__getitem__, map(id, addresses)))

    def ids_by_node(self, ids: list[bytes]) -> dict[str, list[bytes]]:
        if self.codes is None:
            return {self.names[0]: ids} if ids else {}
        groups: list[list[bytes]] = [[] for _ in self.names]
        appends = [group.append for group in groups]
        for code, message_id in zip(self.codes, ids, strict=True):
            appends[code](message_id)
        return dict(zip(self.names, groups, strict=True))


def _offset(seq: int, messages: Sequence[Message]) -> dict[str, Any]:
    """Batch ``seq``'s end offset: its number and, per nsqd, a digest of its ids."""
    deliveries = list(map(_delivery, messages))
    ids = list(map(_id, deliveries))
    return _offset_of(seq, ids, _Nodes(deliveries))


def _offset_of(seq: int, ids: list[bytes], nodes: _Nodes) -> dict[str, Any]:
    return {"batch": seq, "count": len(ids), "nsqd": batch_digests(nodes.ids_by_node(ids))}


@dataclass
class _Held:
    """A batch taken from nsqd, waiting for Spark's commit (then FIN'd)."""

    messages: list[Message]
    deliveries: list[Any]
    nodes: _Nodes
    taken_at: float = 0.0  # when the batch was taken (monotonic)


def _record_batch(
    deliveries: Sequence[Any],
    names: list[str],
    codes: Sequence[int] | None,
    topic: str,
    channel: str,
) -> Any:
    """Messages as one Arrow record batch of SOURCE_SCHEMA, built column by column (``names``
    and ``codes``: their nsqd, as in :class:`_Nodes`)."""
    import pyarrow as pa
    import pyarrow.compute as pc

    n = len(deliveries)
    timestamps = pa.array(list(map(_timestamp, deliveries)), pa.int64())
    if codes is None:
        node_column = pa.repeat(names[0], n) if n else pa.array([], pa.string())
    else:
        node_column = pa.array(names, pa.string()).take(pa.array(codes, pa.int32()))
    columns = [
        pa.array(list(map(_id, deliveries)), pa.binary()).cast(pa.string()),
        pa.array(list(map(_body, deliveries)), pa.binary()),
        pc.divide(timestamps, 1000).cast(pa.timestamp("us", "UTC")),
        pa.array(list(map(_attempts, deliveries)), pa.int32()),
        pa.repeat(topic, n),
        pa.repeat(channel, n),
        node_column,
    ]
    return pa.RecordBatch.from_arrays(columns, schema=_arrow_schema())


def _arrow_schema() -> Any:
    global _ARROW_SCHEMA
    if _ARROW_SCHEMA is None:
        import pyarrow as pa

        types = [pa.string(), pa.binary(), pa.timestamp("us", "UTC"), pa.int32()]
        types += [pa.string()] * 3
        _ARROW_SCHEMA = pa.schema(
            [
                pa.field(name, kind, nullable=False)
                for name, kind in zip(SOURCE_SCHEMA.fieldNames(), types, strict=True)
            ]
        )
    return _ARROW_SCHEMA


_ARROW_SCHEMA: Any = None


def row_overhead(topic: str, channel: str, names: Sequence[str]) -> int:
    """Bytes a row adds to its Arrow batch besides its body: the id (16), the offsets of the
    variable-size columns (4 each), timestamp (8), attempts (4), and the topic, channel and
    nsqd texts repeated on every row."""
    longest = max(map(len, names), default=0)
    return 16 + 4 * 5 + 8 + 4 + len(topic) + len(channel) + longest


def split_bounds(sizes: Sequence[int], parts: int, cap: int) -> list[tuple[int, int]]:
    """``[(start, end), ...]`` slices of rows of ``sizes`` bytes: ``parts`` even slices by
    count (fewer when there are fewer rows), each cut further so that none is above ``cap``
    bytes unless it is one row alone."""
    n = len(sizes)
    if n == 0:
        return []
    parts = max(1, min(parts, n))
    even = [(k * n // parts, (k + 1) * n // parts) for k in range(parts)]
    if sum(sizes) <= cap:
        return even
    ends = [0, *accumulate(sizes)]  # ends[j] - ends[i]: bytes of rows i..j-1
    bounds = []
    for i, stop in even:
        while i < stop:
            j = stop
            if ends[j] - ends[i] > cap:
                j = max(i + 1, bisect_right(ends, ends[i] + cap, i + 1, j + 1) - 1)
            bounds.append((i, j))
            i = j
    return bounds


class NSQStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """See the module docstring. Built on the driver (and, empty, on executors for ``read``)."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self._consumer: SourceConsumer | None = None
        # batch number -> messages held for it (FIN'd once Spark committed the batch)
        self._batches: dict[int, _Held] = {}
        self._replayed: set[int] = set()
        self._filter: RedeliveryFilter[Message] | None = None
        self._filter_started = 0.0
        self._checked_at = 0.0  # the filter's last /stats check
        self._first_call = True
        self._available_now = False
        self._ran_dry = False  # the last batch closed before it was full
        #: availableNow: per nsqd, the messages its channel held at the start (None: /stats
        #: could not be read, the run ends at the first empty trigger instead)
        self._target: dict[str, int] | None = None
        self._received: Counter[str] = Counter()  # per nsqd, while there is a target
        self._view: NSQDView | None = None
        self._baseline: dict[str, ChannelCounts] = {}  # counts when the source started
        self._lag: dict[str, Any] | None = None
        self._lag_at = 0.0
        #: messages of committed batches nsqd had taken back before the commit (read again)
        self.taken_back = 0
        self._oversized_logged = False

    def __getstate__(self) -> dict[str, Any]:  # never ship connections to executors
        return {"options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["options"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"NSQStreamReader({self.options!r})"

    # --- driver: start ----------------------------------------------------------------------

    def _nsqd_view(self) -> NSQDView:
        if self._view is None:
            options = self.options
            self._view = NSQDView(
                topic=options.topic,
                channel=options.channel,
                nsqd=options.nsqd,
                nsqd_http=options.nsqd_http,
                lookupd=options.lookupd,
                timeout=min(options.connect_timeout, 5.0),
                context=options.https_context(),
            )
        return self._view

    def initialOffset(self) -> dict[str, Any]:
        return {"batch": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.options.max_messages_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        """availableNow on a queue: read what the channel holds now, then stop.

        The first trigger reads each nsqd's channel depth (``/stats``: queued, plus what a
        closed connection still holds until its timeout); the run ends once that many messages
        came from each nsqd (or nsqd shows none left to deliver). Without ``/stats`` it ends
        at the first trigger that finds nothing (``linger`` long after a batch that did not
        fill)."""
        self._available_now = True

    def _begin(self, start: dict[str, Any], seq: int) -> None:
        """The first trigger of this run: set up the redelivery filter, subscribe, check that
        a message always fits in a task, and (availableNow) note what the channel holds."""
        reserve = 0
        digests = digests_from_offset(start, MESSAGE_ID_SIZE)
        if digests and seq not in self._replayed:
            # Batch `seq` was committed by an earlier run: its redeliveries are dropped.
            self._filter = RedeliveryFilter(digests, _redelivery_key, gone=_taken_back)
            self._filter_started = time.monotonic()
            reserve = self._filter.expected()
        consumer = SourceConsumer(self.options, reserve)
        consumer.start()
        self._consumer = consumer
        now = time.monotonic()
        view = self._nsqd_view()
        nodes = view.nodes(now)
        self._check_message_size(view, nodes, now)
        for address in nodes:
            counts = view.counts(address, now)
            if counts is not None:
                self._baseline[address] = counts
        if self._available_now:
            self._target = self._targets(consumer, nodes)

    def _check_message_size(self, view: NSQDView, nodes: list[str], now: float) -> None:
        """Before anything is read: refuse a configuration in which a message nsqd accepts
        would not fit in a task (``max_partition_bytes``; nsqd's ``--max-msg-size``)."""
        cap = self.options.max_partition_bytes
        overhead = row_overhead(self.options.topic, self.options.channel, nodes)
        for address in nodes:
            largest = view.max_msg_size(address, now)
            if largest is None or largest + overhead <= cap:
                continue
            if largest + overhead > PARTITION_BYTES_CEILING:
                advice = (
                    f"messages that large cannot travel in a Spark task (the ceiling is "
                    f"{PARTITION_BYTES_CEILING} bytes, a quarter of spark.rpc.message.maxSize's "
                    "default): lower nsqd's --max-msg-size"
                )
            else:
                advice = f"set .option('max_partition_bytes', '{largest + overhead}') or more"
            raise NSQOptionError(
                f"nsq source: nsqd {address} accepts messages of up to {largest} bytes "
                f"(--max-msg-size) but a task carries at most max_partition_bytes={cap} bytes "
                f"of rows, and a message cannot be split between tasks; {advice}"
            )

    def _targets(self, consumer: SourceConsumer, nodes: list[str]) -> dict[str, int] | None:
        """availableNow: per nsqd, how many messages its channel may deliver now (queued, plus
        in flight at a closed connection); None when some connected nsqd cannot tell."""
        connected = set(consumer.connected())
        targets: dict[str, int] = {}
        for address in nodes:
            counts = self._baseline.get(address)
            if counts is not None:
                targets[address] = counts.may_still_deliver
            elif address in connected:
                _log.warning(
                    "nsq source: cannot read /stats of nsqd %s (give its HTTP address with "
                    "option nsqd_http): availableNow ends at the first trigger that finds "
                    "nothing, possibly before the channel is empty",
                    address,
                    extra=fields(topic=self.options.topic, channel=self.options.channel),
                )
                return None
            # neither subscribed nor answering: nothing can come from it
        _log.info(
            "nsq source: availableNow reads %s",
            targets,
            extra=fields(topic=self.options.topic, channel=self.options.channel),
        )
        return targets

    # --- driver: triggers -------------------------------------------------------------------

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        seq = int(start.get("batch", 0))
        if self._first_call:
            self._first_call = False
            self._begin(start, seq)
        consumer = self._consumer
        if consumer is None:  # availableNow ended (Spark may still ask, for a no-data batch)
            return start
        self._finish_through(seq)
        max_rows = self.options.max_messages_per_trigger
        if isinstance(limit, ReadMaxRows):
            max_rows = max(1, min(max_rows, limit.max_rows))
        elif not isinstance(limit, ReadAllAvailable):
            _log.warning(
                "nsq source ignores read limit %r",
                limit,
                extra=fields(topic=self.options.topic, channel=self.options.channel),
            )
        remaining: int | None = None
        if self._target is not None:
            remaining = self._remaining()
            if remaining == 0:
                # What the channel held at the start is read; what the filter still holds
                # (it could not be matched) is read in a last batch.
                taken = []
                if self._filter is not None:
                    taken = self._filter.settle_all()
                    self._log_released(taken)
                    self._filter_done()
                return self._new_batch(seq, taken) if taken else self._no_data(start)
            max_rows = min(max_rows, remaining)
        taken = self._take(consumer, max_rows, remaining)
        self._ran_dry = len(taken) < max_rows
        if not taken:
            return self._no_data(start)
        return self._new_batch(seq, taken)

    def _no_data(self, start: dict[str, Any]) -> dict[str, Any]:
        """No new batch. With availableNow that ends the run: close the connections now, so
        that the FINs of the last batch reach nsqd (Spark kills this process right after) and
        what was fetched ahead goes back to the channel at once."""
        if self._available_now:
            self.stop()
        return start

    def _new_batch(self, seq: int, taken: list[Message]) -> dict[str, Any]:
        end = seq + 1
        deliveries = list(map(_delivery, taken))
        nodes = _Nodes(deliveries)
        self._batches[end] = _Held(taken, deliveries, nodes, time.monotonic())
        return _offset_of(end, list(map(_id, deliveries)), nodes)

    def _take(
        self, consumer: SourceConsumer, max_rows: int, remaining: int | None
    ) -> list[Message]:
        """Up to ``max_rows`` messages for a batch (see :meth:`SourceConsumer.take`), without
        the committed batch's redeliveries."""
        options = self.options
        taken: list[Message] = []
        wait = options.wait_timeout
        if self._available_now and self._target is None and self._ran_dry:
            wait = options.linger
        while True:
            prefetch = min(max_rows, options.max_in_flight - max_rows)
            if remaining is not None:  # availableNow: fetch ahead no more than is left
                prefetch = min(prefetch, remaining - max_rows)
            got = consumer.take(max_rows - len(taken), wait, options.linger, prefetch=prefetch)
            arrived = bool(got)
            if got and self._target is not None:
                self._count(got)
            if self._filter is not None:
                got = self._sift(consumer, got)
            taken += got
            if len(taken) >= max_rows or (arrived and taken):
                break
            if arrived:  # only redeliveries of the committed batch came: look again
                wait = options.linger
                continue
            # nothing came within the wait
            if self._filter is not None:
                taken += self._check_filter(force=True)
                if taken:
                    break
            if self._target is not None and self._more_may_come():
                wait = options.wait_timeout
                continue
            break
        return taken

    def _count(self, got: list[Message]) -> None:
        """Count what came from each nsqd (one address object per connection: a handful)."""
        addresses = list(map(_address, map(_delivery, got)))
        objects = dict(zip(map(id, addresses), addresses, strict=True))
        for key, count in Counter(map(id, addresses)).items():
            self._received[str(objects[key])] += count

    def _remaining(self) -> int:
        assert self._target is not None
        return sum(max(0, n - self._received[a]) for a, n in self._target.items())

    def _more_may_come(self) -> bool:
        """availableNow, after a wait that brought nothing: whether an nsqd we still expect
        messages from shows some it may deliver (queued and not paused, or in flight at a
        closed connection: back after their timeout)."""
        assert self._target is not None
        view = self._nsqd_view()
        now = time.monotonic()
        for address, wanted in self._target.items():
            if self._received[address] >= wanted:
                continue
            counts = view.counts(address, now)
            if counts is None:
                continue
            if counts.orphaned or (counts.depth and not counts.paused):
                return True
            self._target[address] = self._received[address]  # nothing more will come
        return False

    # --- driver: the redelivery filter --------------------------------------------------------

    def _sift(self, consumer: SourceConsumer, got: list[Message]) -> list[Message]:
        """After a restart: drop (FIN) the redeliveries of the committed batch; keep the rest."""
        assert self._filter is not None
        fresh, committed, released = self._filter.offer(got, time.monotonic())
        if committed:
            consumer.finish(committed)
            _log.warning(
                "nsq source: %d messages of a batch committed before the restart came again; "
                "FIN'd and dropped",
                len(committed),
                extra=fields(topic=self.options.topic, channel=self.options.channel),
            )
        self._log_released(released)
        if self._filter.active:
            released += self._check_filter(force=False)
        else:
            self._filter_done()
        return fresh + released

    def _check_filter(self, force: bool) -> list[Message]:
        """Stop filtering the nsqd from which no more of the committed batch can come: its
        channel has nothing queued and nothing in flight at a closed connection (``/stats``),
        or, when its /stats cannot be read, no candidate came for REDELIVERY_PATIENCE seconds
        and msg_timeout has passed since the start. Returns what was set aside for them (read
        after all: it could not be matched)."""
        flt = self._filter
        assert flt is not None
        now = time.monotonic()
        if not force and now - self._checked_at < STATS_INTERVAL:
            return []
        self._checked_at = now
        flt.forget_gone()
        view = self._nsqd_view()
        released: list[Message] = []
        for address in flt.addresses():
            counts = view.counts(address, now)
            if counts is None:
                last = flt.last_candidate_at(address) or self._filter_started
                window = (self.options.msg_timeout or 60.0) + REDELIVERY_PATIENCE
                if now - self._filter_started < window or now - last < REDELIVERY_PATIENCE:
                    continue
            elif counts.may_still_deliver:
                continue
            released += flt.settle(address)
        self._log_released(released)
        if not flt.active:
            self._filter_done()
        return released

    def _filter_done(self) -> None:
        flt = self._filter
        assert flt is not None
        _log.warning(
            "nsq source: done with the batch committed before the restart: %d of its "
            "messages came again and were dropped, %d messages that may be its were read "
            "again",
            flt.matched,
            flt.released,
            extra=fields(topic=self.options.topic, channel=self.options.channel),
        )
        self._filter = None

    def _log_released(self, released: list[Message]) -> None:
        if released:
            _log.warning(
                "nsq source: %d redelivered messages could not be matched to the batch "
                "committed before the restart; they are read again (at-least-once: up to %d "
                "duplicates so far)",
                len(released),
                self._filter.released if self._filter is not None else len(released),
                extra=fields(topic=self.options.topic, channel=self.options.channel),
            )

    # --- driver: partitions, commit, progress ---------------------------------------------------

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        first, last = int(start.get("batch", 0)), int(end.get("batch", 0))
        held: list[_Held] = []
        for seq in range(first + 1, last + 1):
            batch = self._batches.get(seq)
            if batch is None:
                # Replay of a batch from an earlier run: nsqd redelivers its messages instead.
                self._replayed.add(seq)
                _log.warning(
                    "nsq source: batch %d was not committed before the restart; its messages "
                    "are redelivered by nsqd in later batches",
                    seq,
                    extra=fields(topic=self.options.topic, channel=self.options.channel),
                )
                continue
            if batch.messages:
                held.append(batch)
        if not held:
            return []
        if len(held) == 1:
            deliveries, nodes = held[0].deliveries, held[0].nodes
        else:  # Spark asked for several batches at once: one list, one set of names
            deliveries = [d for batch in held for d in batch.deliveries]
            nodes = _Nodes(deliveries)
        options = self.options
        topic, channel, names, codes = options.topic, options.channel, nodes.names, nodes.codes
        overhead = row_overhead(topic, channel, names)
        sizes = list(map(add, map(len, map(_body, deliveries)), repeat(overhead)))
        bounds = split_bounds(sizes, options.partitions, options.max_partition_bytes)
        self._warn_oversized(sizes, bounds)
        return [
            NSQInputPartition(
                _record_batch(
                    deliveries[i:j],
                    names,
                    None if codes is None else codes[i:j],
                    topic,
                    channel,
                )
            )
            for i, j in bounds
        ]

    def _warn_oversized(self, sizes: list[int], bounds: list[tuple[int, int]]) -> None:
        cap = self.options.max_partition_bytes
        if self._oversized_logged:
            return
        for i, j in bounds:
            if j == i + 1 and sizes[i] > cap:
                self._oversized_logged = True
                _log.warning(
                    "nsq source: a message of %d bytes is above max_partition_bytes=%d: it "
                    "travels in a task of its own",
                    sizes[i],
                    cap,
                    extra=fields(topic=self.options.topic, channel=self.options.channel),
                )
                return

    def commit(self, end: dict[str, Any]) -> None:
        self._finish_through(int(end.get("batch", 0)))

    def _finish_through(self, seq: int) -> None:
        done = [n for n in self._batches if n <= seq]
        consumer = self._consumer
        if not done or consumer is None:
            return
        batches = [self._batches.pop(n) for n in sorted(done)]
        messages = [message for held in batches for message in held.messages]
        # nsqd never keeps a message longer than its max_msg_timeout after sending it,
        # TOUCH or not: a FIN later than that comes too late (nsqd says so only afterwards).
        now = time.monotonic()
        cap = consumer.max_msg_timeout
        late = 0
        for held in batches:
            if now - held.taken_at > cap / 2:  # else none was received long enough ago
                late += sum(
                    1 for m in held.messages if not m.taken_back and now - m.received_at > cap
                )
        sent = consumer.finish(messages) - late
        if sent < len(messages):
            lost = len(messages) - sent
            self.taken_back += lost
            text = (
                "nsq source: %d of %d messages of committed batches (through %d) had been "
                "taken back by nsqd before Spark committed them (their timeout passed, or "
                "their connection closed): nsqd delivers them again, so they are read twice"
            )
            if self.options.fail_on_data_loss:
                raise NSQDataLossError(
                    text % (lost, len(messages), seq) + " (fail_on_data_loss=true)"
                )
            _log.warning(
                "nsq source: %d of %d messages of committed batches (through %d) had been "
                "taken back by nsqd before Spark committed them (their timeout passed, or "
                "their connection closed): nsqd delivers them again, so they are read twice",
                lost,
                len(messages),
                seq,
                extra=fields(topic=self.options.topic, channel=self.options.channel, count=lost),
            )

    def reportLatestOffset(self) -> dict[str, Any] | None:
        """The lag, for the query's progress (``sources[].latestOffset``): what the channel
        holds on each nsqd (``depth``, ``in_flight``, ``deferred``), REQs and timeouts on the
        channel since this source started, and the messages of committed batches nsqd had
        taken back before their commit. Read at most every STATS_INTERVAL seconds."""
        now = time.monotonic()
        if self._lag is not None and now - self._lag_at < STATS_INTERVAL:
            return self._lag
        view = self._nsqd_view()
        per_node: dict[str, dict[str, int]] = {}
        totals = Counter[str]()
        for address in self._known_nodes(now):
            counts = view.counts(address, now)
            if counts is None:
                continue
            base = self._baseline.setdefault(address, counts)
            entry = {
                "depth": counts.depth,
                "in_flight": counts.in_flight,
                "deferred": counts.deferred,
                "requeued": counts.requeued - base.requeued,
                "timed_out": counts.timed_out - base.timed_out,
            }
            per_node[address] = entry
            totals.update(entry)
        self._lag_at = now
        if not per_node:
            self._lag = None
            return None
        self._lag = {
            "depth": totals["depth"],
            "in_flight": totals["in_flight"],
            "deferred": totals["deferred"],
            "requeued_since_start": totals["requeued"],
            "timed_out_since_start": totals["timed_out"],
            "taken_back_before_commit": self.taken_back,
            "nsqd": per_node,
        }
        return self._lag

    def _known_nodes(self, now: float) -> list[str]:
        if self._consumer is None:
            return sorted(self._baseline) or self._nsqd_view().nodes(now)
        known = set(self._baseline) | set(self._consumer.connected())
        return sorted(known)

    def stop(self) -> None:
        """REQ what is held (Spark may not have committed it) and close the connections.

        pyspark 4.3 ends a query by killing the source's process without calling this; then
        nsqd takes the held messages back after ``msg_timeout`` (20 s by default)."""
        consumer, self._consumer = self._consumer, None
        self._batches.clear()
        if consumer is not None:
            consumer.close()

    # --- executors --------------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, NSQInputPartition)
        return iter([partition.batch])

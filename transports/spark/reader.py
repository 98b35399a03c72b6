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

Offsets: ``{"batch": N, "count": n, "nsqd": {"host:port": digest}}``, where a digest is the
count, id range and hash of the ids the batch took from that nsqd (see ``_redelivery``): a few
hundred bytes whatever the batch size. The digest lets a restarted query recognise the
redeliveries of a batch that was committed but whose FINs were not sent (the query stopped
between its commit and the next trigger): they are FIN'd and dropped, never read again. A
batch found in the offset log but not committed is replayed by Spark through
``partitions()``; the source cannot rebuild it (nsqd took the messages back), so it answers
with no rows and the messages come again, redelivered by nsqd, in later batches.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from operator import attrgetter
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

from nsq_sansio.frames import MESSAGE_ID_SIZE
from transports.sync import Message

from ._options import ReadOptions
from ._redelivery import RedeliveryFilter, batch_digests, digests_from_offset
from ._source import SourceConsumer

__all__ = ["SOURCE_SCHEMA", "NSQStreamReader"]

_log = logging.getLogger("transports.spark.reader")

#: After a restart, how long the redeliveries of the last committed batch may trickle in
#: (since the last one) before the ones set aside are read after all (as duplicates).
REDELIVERY_PATIENCE = 10.0

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


class NSQStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """See the module docstring. Built on the driver (and, empty, on executors for ``read``)."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self._consumer: SourceConsumer | None = None
        # batch number -> messages held for it (FIN'd once Spark committed the batch)
        self._batches: dict[int, _Held] = {}
        self._replayed: set[int] = set()
        self._filter: RedeliveryFilter[Message] | None = None
        self._first_call = True
        self._available_now = False
        self._ran_dry = False  # the last batch closed before it was full

    def __getstate__(self) -> dict[str, Any]:  # never ship connections to executors
        return {"options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["options"])  # type: ignore[misc]

    # --- driver -----------------------------------------------------------------------------

    def _consumer_started(self) -> SourceConsumer:
        if self._consumer is None:
            consumer = SourceConsumer(self.options)
            consumer.start()
            self._consumer = consumer
        return self._consumer

    def initialOffset(self) -> dict[str, Any]:
        return {"batch": 0}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.options.max_messages_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        """availableNow on a queue: read what is there, then stop.

        A queue has no "latest offset" to stop at: ``latestOffset`` returning its ``start``
        (nothing arrived within ``wait_timeout``) is what ends the run, as Spark expects. After
        a batch that did not fill (the channel ran dry within ``linger``), the next trigger
        waits only ``linger``: what was available has been read."""
        self._available_now = True

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        consumer = self._consumer_started()
        seq = int(start.get("batch", 0))
        if self._first_call:
            self._first_call = False
            digests = digests_from_offset(start, MESSAGE_ID_SIZE)
            if digests and seq not in self._replayed:
                # Batch `seq` was committed by an earlier run: its redeliveries are dropped.
                window = (self.options.msg_timeout or 60.0) + REDELIVERY_PATIENCE
                self._filter = RedeliveryFilter(
                    digests,
                    _redelivery_key,
                    patience=REDELIVERY_PATIENCE,
                    give_up_at=time.monotonic() + window,
                )
        self._finish_through(seq)
        max_rows = self.options.max_messages_per_trigger
        if isinstance(limit, ReadMaxRows):
            max_rows = max(1, min(max_rows, limit.max_rows))
        elif not isinstance(limit, ReadAllAvailable):
            _log.warning("nsq source ignores read limit %r", limit)
        taken: list[Message] = []
        wait = self.options.wait_timeout
        if self._available_now and self._ran_dry:
            wait = self.options.linger
        while True:
            room = self.options.max_in_flight - max_rows
            if self._filter is not None:
                room -= len(self._filter.pending())
            prefetch = min(max_rows, room)  # fetched while Spark runs this batch
            got = consumer.take(max_rows - len(taken), wait, self.options.linger, prefetch=prefetch)
            arrived = bool(got)
            if self._filter is not None:
                got = self._sift(consumer, got)
            taken += got
            if taken or not arrived or len(taken) >= max_rows:
                break
            wait = self.options.linger  # only redeliveries of a committed batch came
        self._ran_dry = len(taken) < max_rows
        if not taken:
            return start
        end = seq + 1
        deliveries = list(map(_delivery, taken))
        nodes = _Nodes(deliveries)
        self._batches[end] = _Held(taken, deliveries, nodes)
        return _offset_of(end, list(map(_id, deliveries)), nodes)

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
            )
        if released:
            _log.warning(
                "nsq source: %d redelivered messages could not be matched to the batch "
                "committed before the restart; they are read again (at-least-once)",
                len(released),
            )
        if not self._filter.active:
            self._filter = None
        return fresh + released

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
        count = min(self.options.partitions, len(deliveries))
        step = -(-len(deliveries) // count)
        topic, channel, names, codes = (
            self.options.topic,
            self.options.channel,
            nodes.names,
            nodes.codes,
        )
        return [
            NSQInputPartition(
                _record_batch(
                    deliveries[i : i + step],
                    names,
                    None if codes is None else codes[i : i + step],
                    topic,
                    channel,
                )
            )
            for i in range(0, len(deliveries), step)
        ]

    def commit(self, end: dict[str, Any]) -> None:
        self._finish_through(int(end.get("batch", 0)))

    def _finish_through(self, seq: int) -> None:
        done = [n for n in self._batches if n <= seq]
        if not done or self._consumer is None:
            return
        messages = [held for n in sorted(done) for held in self._batches.pop(n).messages]
        sent = self._consumer.finish(messages)
        if sent < len(messages):
            _log.warning(
                "nsq source: %d of %d messages of committed batches could not be FIN'd "
                "(nsqd took them back: connection closed or timed out): nsqd will deliver "
                "them again",
                len(messages) - sent,
                len(messages),
            )

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

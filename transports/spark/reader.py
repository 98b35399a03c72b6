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
batch late and not at all on an idle stream, FINs too, idempotently.) Until then a background
thread answers nsqd's heartbeats and TOUCHes every message held (``touch_interval``, by default
a third of nsqd's msg_timeout), so nothing times out while Spark works or idles between
triggers.

Offsets: ``{"batch": N, "ids": {"nsqd:port": "<16-char ids concatenated>"}}``. The ids of the
batch let a restarted query recognise redeliveries of a batch that was committed but whose FINs
were not sent (the query stopped between its commit and the next trigger): they are FIN'd and
dropped, never read again. A batch found in the offset log but not committed is replayed by
Spark through ``partitions()``; the source cannot rebuild it (nsqd took the messages back), so
it answers with no rows and the messages come again, redelivered by nsqd, in later batches.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
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

from ._consumer import HeldMessage, SourceConsumer
from ._options import ReadOptions

__all__ = ["SOURCE_SCHEMA", "NSQStreamReader"]

_log = logging.getLogger("transports.spark.reader")

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


@dataclass
class NSQInputPartition(InputPartition):
    """One micro-batch (or a slice of it) as an Arrow record batch, shipped to the executor
    that reads it (the messages were read on the driver)."""

    batch: Any  # pyarrow.RecordBatch with SOURCE_SCHEMA's columns


def _ids_of(messages: Sequence[HeldMessage]) -> dict[str, str]:
    by_node: dict[str, list[str]] = {}
    for held in messages:
        by_node.setdefault(held.address, []).append(held.message.id.decode("ascii"))
    return {address: "".join(ids) for address, ids in sorted(by_node.items())}


def _split_ids(offset: dict[str, Any]) -> set[tuple[str, bytes]]:
    found: set[tuple[str, bytes]] = set()
    for address, joined in (offset.get("ids") or {}).items():
        data = joined.encode("ascii")
        for i in range(0, len(data), MESSAGE_ID_SIZE):
            found.add((address, data[i : i + MESSAGE_ID_SIZE]))
    return found


class NSQStreamReader(DataSourceStreamReader, SupportsTriggerAvailableNow):
    """See the module docstring. Built on the driver (and, empty, on executors for ``read``)."""

    def __init__(self, options: ReadOptions) -> None:
        self.options = options
        self._consumer: SourceConsumer | None = None
        # batch number -> (start offset, messages held for it)
        self._batches: dict[int, list[HeldMessage]] = {}
        self._replayed: set[int] = set()
        self._committed_ids: set[tuple[str, bytes]] = set()
        self._first_call = True

    def __getstate__(self) -> dict[str, Any]:  # never ship connections to executors
        return {"options": self.options}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(state["options"])  # type: ignore[misc]

    # --- driver -----------------------------------------------------------------------------

    def _consumer_started(self) -> SourceConsumer:
        if self._consumer is None:
            o = self.options
            consumer = SourceConsumer(
                o.topic,
                o.channel,
                nsqd=o.nsqd,
                lookupd=o.lookupd,
                max_in_flight=o.max_in_flight,
                config=o.consumer_config(),
                connect_timeout=o.connect_timeout,
                lookupd_poll_interval=o.lookupd_poll_interval,
                touch_interval=o.touch_interval,
            )
            consumer.start()
            self._consumer = consumer
        return self._consumer

    def initialOffset(self) -> dict[str, Any]:
        return {"batch": 0, "ids": {}}

    def getDefaultReadLimit(self) -> ReadLimit:
        return ReadMaxRows(self.options.max_messages_per_trigger)

    def prepareForTriggerAvailableNow(self) -> None:
        """availableNow on a queue: read until the channel stays empty for ``wait_timeout``.

        A queue has no "latest offset" to stop at: ``latestOffset`` returning its ``start``
        (nothing arrived within ``wait_timeout``) is what ends the run, as Spark expects."""

    def latestOffset(self, start: dict[str, Any], limit: ReadLimit) -> dict[str, Any]:
        consumer = self._consumer_started()
        seq = int(start.get("batch", 0))
        if self._first_call:
            self._first_call = False
            if seq not in self._replayed:
                # Batch `seq` was committed by an earlier run: its redeliveries are dropped.
                self._committed_ids = _split_ids(start)
        self._finish_through(seq)
        max_rows = self.options.max_messages_per_trigger
        if isinstance(limit, ReadMaxRows):
            max_rows = max(1, min(max_rows, limit.max_rows))
        elif not isinstance(limit, ReadAllAvailable):
            _log.warning("nsq source ignores read limit %r", limit)
        taken: list[HeldMessage] = []
        wait = self.options.wait_timeout
        while len(taken) < max_rows:
            got = consumer.take(max_rows - len(taken), wait, self.options.linger)
            if not got:
                break
            fresh: list[HeldMessage] = []
            stale: list[HeldMessage] = []
            for held in got:
                key = (held.address, held.message.id)
                (stale if key in self._committed_ids else fresh).append(held)
            if stale:
                consumer.finish(stale)  # committed in an earlier run: FIN, never read again
                self._committed_ids.difference_update((h.address, h.message.id) for h in stale)
            taken += fresh
            if fresh:
                break
            wait = self.options.linger
        if not taken:
            return start
        end = seq + 1
        self._batches[end] = taken
        return {"batch": end, "ids": _ids_of(taken)}

    def partitions(self, start: dict[str, Any], end: dict[str, Any]) -> Sequence[InputPartition]:
        first, last = int(start.get("batch", 0)), int(end.get("batch", 0))
        messages: list[HeldMessage] = []
        for seq in range(first + 1, last + 1):
            held = self._batches.get(seq)
            if held is None:
                # Replay of a batch from an earlier run: nsqd redelivers its messages instead.
                self._replayed.add(seq)
                _log.warning(
                    "nsq source: batch %d was not committed before the restart; its messages "
                    "are redelivered by nsqd in later batches",
                    seq,
                )
                continue
            messages += held
        if not messages:
            return []
        count = min(self.options.partitions, len(messages))
        step = -(-len(messages) // count)
        return [
            NSQInputPartition(self._record_batch(messages[i : i + step]))
            for i in range(0, len(messages), step)
        ]

    def _record_batch(self, messages: Sequence[HeldMessage]) -> Any:
        import pyarrow as pa

        n = len(messages)
        columns = [
            pa.array([h.message.id.decode("ascii") for h in messages], pa.string()),
            pa.array([h.message.body for h in messages], pa.binary()),
            pa.array([h.message.timestamp // 1000 for h in messages], pa.timestamp("us", "UTC")),
            pa.array([h.message.attempts for h in messages], pa.int32()),
            pa.array([self.options.topic] * n, pa.string()),
            pa.array([self.options.channel] * n, pa.string()),
            pa.array([h.address for h in messages], pa.string()),
        ]
        schema = pa.schema(
            [
                pa.field(name, column.type, nullable=False)
                for name, column in zip(SOURCE_SCHEMA.fieldNames(), columns, strict=True)
            ]
        )
        return pa.RecordBatch.from_arrays(columns, schema=schema)

    def commit(self, end: dict[str, Any]) -> None:
        self._finish_through(int(end.get("batch", 0)))

    def _finish_through(self, seq: int) -> None:
        done = [n for n in self._batches if n <= seq]
        if not done or self._consumer is None:
            return
        messages = [held for n in sorted(done) for held in self._batches.pop(n)]
        sent = self._consumer.finish(messages)
        if sent < len(messages):
            _log.warning(
                "nsq source: %d of %d messages of committed batches could not be FIN'd "
                "(their connection closed): nsqd will deliver them again",
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
            consumer.close(requeue=True)

    # --- executors --------------------------------------------------------------------------

    def read(self, partition: InputPartition) -> Iterator[Any]:
        assert isinstance(partition, NSQInputPartition)
        return iter([partition.batch])

"""The sink: every partition publishes its rows with MPUB, in batches bounded by count and bytes.

Runs on executors (``write``) and on the driver (``commit`` / ``abort``). Each task has its own
:class:`transports.sync.Producer` over the given (or lookupd-discovered) nsqd, which pipelines
up to ``max_pending`` MPUBs and fails over to another nsqd when a connection dies. A publish nsqd
refuses (``E_BAD_MESSAGE``, ``E_BAD_TOPIC``...) fails the task with nsqd's error, and so the job:
rows are never dropped silently. NSQ has no transactions: what a failed task published before
the error stays published, and a retried task publishes its rows again (at-least-once).
"""

from __future__ import annotations

import base64
import datetime
import decimal
import json
import logging
import random
import ssl
import urllib.error
import urllib.request
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from pyspark.sql.datasource import (
    DataSourceArrowWriter,
    DataSourceStreamArrowWriter,
    DataSourceStreamWriter,
    DataSourceWriter,
    WriterCommitMessage,
)
from pyspark.sql.types import BinaryType, StringType, StructType

from nsq_sansio.discovery import LookupdAddress, parse_lookup_response
from nsq_sansio.errors import NSQError
from transports._common.logs import fields

from ._nsqd_http import read_capped
from ._options import NSQOptionError, WriteOptions

__all__ = [
    "NSQArrowWriter",
    "NSQCommitMessage",
    "NSQPublishError",
    "NSQStreamArrowWriter",
    "NSQStreamWriter",
    "NSQWriter",
    "check_write_schema",
]

_log = logging.getLogger("nsq_sansio.spark.writer")

#: Bytes MPUB adds per message (its 4-byte size), used for the batch_bytes bound.
_PER_MESSAGE_OVERHEAD = 4


class NSQPublishError(RuntimeError):
    """A partition could not publish its rows; the message carries nsqd's error."""


@dataclass(frozen=True)
class NSQCommitMessage(WriterCommitMessage):
    """What one partition published."""

    partition_id: int
    messages: int
    batches: int


def check_write_schema(schema: StructType, serialization: str) -> None:
    """Raise :class:`NSQOptionError` unless the DataFrame can be published as asked."""
    names = [f.name for f in schema.fields]
    if serialization == "json":
        if not names:
            raise NSQOptionError("nsq sink: the DataFrame has no columns to serialise")
        return
    body = [f for f in schema.fields if f.name.lower() == "body"]
    if not body:
        raise NSQOptionError(
            f"nsq sink needs a column 'body' (binary or string); the DataFrame has {names}. "
            "Rename or build one (e.g. F.to_json(F.struct('*')).alias('body')), or set "
            ".option('serialization', 'json') to publish each row as a JSON object"
        )
    others = [n for n in names if n.lower() != "body"]
    if others:
        raise NSQOptionError(
            f"nsq sink publishes only the 'body' column, but the DataFrame also has {others}: "
            "select('body') first, or set .option('serialization', 'json') to publish each "
            "whole row as a JSON object"
        )
    if not isinstance(body[0].dataType, (BinaryType, StringType)):
        raise NSQOptionError(
            "nsq sink: column 'body' must be binary or string, not "
            + body[0].dataType.simpleString()
        )


def lookup_nodes(
    lookupd: Sequence[str], timeout: float, context: ssl.SSLContext | None = None
) -> list[str]:
    """Every nsqd TCP address the lookupd know (``GET /nodes``, answers parsed by the core,
    read up to 4 MiB as the core's own lookupd client does), unioned. Raises
    :class:`NSQError` when no lookupd answered; an empty list means they answered with no
    nsqd. Called once per write, on the driver."""
    found: dict[str, None] = {}
    errors: list[str] = []
    for text in lookupd:
        address = LookupdAddress.parse(text)
        try:
            with urllib.request.urlopen(
                f"{address}/nodes", timeout=timeout, context=context
            ) as response:
                status, body = response.status, read_capped(response, f"{address}/nodes")
        except urllib.error.HTTPError as exc:
            try:
                status, body = exc.code, read_capped(exc, f"{address}/nodes")
            except (OSError, ValueError) as error:
                errors.append(f"{address}: {error}")
                continue
            finally:
                exc.close()
        except (OSError, ValueError) as exc:  # ValueError: an answer over the size limit
            errors.append(f"{address}: {exc}")
            continue
        answer = parse_lookup_response(address, status, body)
        if hasattr(answer, "error"):
            errors.append(f"{address}: {answer.error}")
            continue
        for producer in answer.producers:
            found[str(producer)] = None
    if errors and len(errors) == len(lookupd):
        raise NSQError("no nsqlookupd answered: " + "; ".join(errors))
    return list(found)


def resolve_nsqd(options: WriteOptions) -> tuple[str, ...]:
    """The nsqd to publish to: the given ones, plus every nsqd the lookupd know."""
    addresses = list(options.nsqd)
    if options.lookupd:
        try:
            found = lookup_nodes(options.lookupd, options.connect_timeout, options.https_context())
        except Exception as exc:
            if not addresses:
                raise NSQPublishError(f"nsq sink: {exc}") from exc
            found = []
        addresses += [a for a in found if a not in addresses]
        if not addresses:
            raise NSQPublishError(
                f"nsq sink: the nsqlookupd {list(options.lookupd)} know no nsqd to publish to"
            )
    return tuple(addresses)


def _json_default(value: Any) -> Any:
    if isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
        return value.isoformat()
    if isinstance(value, decimal.Decimal):
        return str(value)
    if isinstance(value, (bytes, bytearray, memoryview)):
        return base64.b64encode(bytes(value)).decode("ascii")
    if hasattr(value, "asDict"):
        return value.asDict(recursive=True)
    raise TypeError(f"cannot serialise {type(value).__name__} to JSON")


def _json_body(record: dict[str, Any]) -> bytes:
    return json.dumps(record, default=_json_default, separators=(",", ":")).encode()


def _as_body(value: Any) -> bytes:
    if value is None:
        raise NSQPublishError("nsq sink: a row has a null 'body' (NSQ messages cannot be empty)")
    if isinstance(value, str):
        return value.encode()
    return bytes(value)


def _batched(bodies: Iterable[bytes], count: int, size: int) -> Iterator[list[bytes]]:
    """Group bodies into MPUB batches of at most ``count`` messages and ``size`` bytes."""
    batch: list[bytes] = []
    total = 0
    for body in bodies:
        cost = len(body) + _PER_MESSAGE_OVERHEAD
        if batch and (len(batch) >= count or total + cost > size):
            yield batch
            batch, total = [], 0
        batch.append(body)
        total += cost
    if batch:
        yield batch


class _Publisher:
    """One task's producer: pipelined MPUBs, failures surfaced with nsqd's error."""

    def __init__(self, options: WriteOptions, nsqd: Sequence[str], partition_id: int) -> None:
        from transports.sync import Producer

        self._options = options
        order = list(nsqd)
        random.Random(partition_id).shuffle(order)  # spread partitions over the nsqd
        self._producer = Producer(
            order,
            max_pending=options.max_pending,
            timeout=options.timeout,
            **options.client_kwargs(),
        )
        self._pending: deque[tuple[Any, int]] = deque()  # (publish future, messages)
        self.partition_id = partition_id
        self.messages = 0
        self.batches = 0

    def publish_all(self, bodies: Iterable[bytes]) -> NSQCommitMessage:
        options = self._options
        try:
            for batch in _batched(bodies, options.batch_size, options.batch_bytes):
                self._check_done(block=len(self._pending) >= options.max_pending)
                future = self._producer.multi_publish_async(options.topic, batch)
                self._pending.append((future, len(batch)))
            while self._pending:
                self._check_done(block=True)
        except NSQPublishError:
            raise
        except Exception as exc:
            raise self._error(exc) from exc
        finally:
            self._producer.close(timeout=options.timeout)
        return NSQCommitMessage(self.partition_id, self.messages, self.batches)

    def _check_done(self, block: bool) -> None:
        while self._pending and (block or self._pending[0][0].done()):
            future, count = self._pending.popleft()
            try:
                future.result(self._options.timeout + 5.0)
            except Exception as exc:
                raise self._error(exc) from exc
            self.messages += count
            self.batches += 1
            block = False

    def _error(self, exc: BaseException) -> NSQPublishError:
        return NSQPublishError(
            f"nsq sink: partition {self.partition_id} failed publishing to topic "
            f"{self._options.topic!r} after {self.messages} messages were acknowledged: "
            f"{type(exc).__name__}: {exc}"
        )


def _partition_id() -> int:
    from pyspark import TaskContext

    context = TaskContext.get()
    return context.partitionId() if context is not None else 0


def _row_bodies(rows: Iterator[Any], serialization: str) -> Iterator[bytes]:
    if serialization == "json":
        for row in rows:
            yield _json_body(row.asDict(recursive=True))
    else:
        for row in rows:
            yield _as_body(row[0])


def _arrow_bodies(batches: Iterator[Any], serialization: str) -> Iterator[bytes]:
    import pyarrow as pa

    for record_batch in batches:
        if record_batch.num_rows == 0:
            continue
        if serialization == "json":
            for record in record_batch.to_pylist():
                yield _json_body(record)
            continue
        column = record_batch.column(0)
        if column.null_count:
            raise NSQPublishError(
                "nsq sink: a row has a null 'body' (NSQ messages cannot be empty)"
            )
        if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
            wide = pa.types.is_large_string(column.type)
            column = column.cast(pa.large_binary() if wide else pa.binary())
        yield from column.to_pylist()


def _report(topic: str, messages: Sequence[WriterCommitMessage | None], what: str) -> int:
    done = [m for m in messages if isinstance(m, NSQCommitMessage)]
    total = sum(m.messages for m in done)
    per_partition = {m.partition_id: m.messages for m in done}
    failed = sum(1 for m in messages if m is None)
    _log.warning(
        "nsq sink %s: %d messages published to %r by %d partitions %s%s",
        what,
        total,
        topic,
        len(done),
        per_partition,
        f"; {failed} partitions failed (what they published before failing stays published)"
        if failed
        else "",
        extra=fields(topic=topic, count=total),
    )
    return total


class NSQWriter(DataSourceWriter):
    """Batch write, row by row (``arrow=false``)."""

    def __init__(self, options: WriteOptions, nsqd: tuple[str, ...]) -> None:
        self.options = options
        self.nsqd = nsqd
        self.published: dict[int, int] = {}

    def _publish(self, bodies: Iterable[bytes]) -> NSQCommitMessage:
        return _Publisher(self.options, self.nsqd, _partition_id()).publish_all(bodies)

    def write(self, iterator: Iterator[Any]) -> NSQCommitMessage:
        return self._publish(_row_bodies(iterator, self.options.serialization))

    def commit(self, messages: list[WriterCommitMessage | None]) -> None:
        self.published = {
            m.partition_id: m.messages for m in messages if isinstance(m, NSQCommitMessage)
        }
        _report(self.options.topic, messages, "commit")

    def abort(self, messages: list[WriterCommitMessage | None]) -> None:
        _report(self.options.topic, messages, "abort")


class NSQArrowWriter(NSQWriter, DataSourceArrowWriter):
    """Batch write from Arrow record batches (the default, ``arrow=true``): faster."""

    def write(self, iterator: Iterator[Any]) -> NSQCommitMessage:
        return self._publish(_arrow_bodies(iterator, self.options.serialization))


class NSQStreamWriter(DataSourceStreamWriter):
    """Streaming write: each micro-batch's partitions publish like a batch write.

    A replayed micro-batch (after a failure) publishes again: NSQ is at-least-once, and the
    consumers downstream must tolerate duplicates. ``commit`` only reports, so repeating it for
    the same batch id is harmless.
    """

    def __init__(self, options: WriteOptions, nsqd: tuple[str, ...]) -> None:
        self.options = options
        self.nsqd = nsqd

    def _publish(self, bodies: Iterable[bytes]) -> NSQCommitMessage:
        return _Publisher(self.options, self.nsqd, _partition_id()).publish_all(bodies)

    def write(self, iterator: Iterator[Any]) -> NSQCommitMessage:
        return self._publish(_row_bodies(iterator, self.options.serialization))

    def commit(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _report(self.options.topic, messages, f"commit of micro-batch {batchId}")

    def abort(self, messages: list[WriterCommitMessage | None], batchId: int) -> None:
        _report(self.options.topic, messages, f"abort of micro-batch {batchId}")


class NSQStreamArrowWriter(NSQStreamWriter, DataSourceStreamArrowWriter):
    """Streaming write from Arrow record batches (the default)."""

    def write(self, iterator: Iterator[Any]) -> NSQCommitMessage:
        return self._publish(_arrow_bodies(iterator, self.options.serialization))

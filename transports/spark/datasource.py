"""``NSQDataSource``: the "nsq" format for Spark's Python Data Source API."""

from __future__ import annotations

from typing import Any

from pyspark.sql.datasource import (
    DataSource,
    DataSourceReader,
    DataSourceStreamReader,
    DataSourceStreamWriter,
    DataSourceWriter,
)
from pyspark.sql.types import StructType

from ._options import NSQOptionError, ReadOptions, WriteOptions
from .reader import SOURCE_SCHEMA, NSQStreamReader
from .writer import (
    NSQArrowWriter,
    NSQStreamArrowWriter,
    NSQStreamWriter,
    NSQWriter,
    check_write_schema,
    resolve_nsqd,
)

__all__ = ["NSQDataSource"]


class NSQDataSource(DataSource):
    """NSQ as a Spark source (streaming) and sink (batch and streaming). See docs/spark.md."""

    def __init__(self, options: dict[str, str]) -> None:
        super().__init__(options)
        self.options: Any = options

    @classmethod
    def name(cls) -> str:
        return "nsq"

    def schema(self) -> StructType:
        return SOURCE_SCHEMA

    def reader(self, schema: StructType) -> DataSourceReader:
        raise NSQOptionError(
            "nsq is a queue, not a table: batch reads (spark.read.format('nsq')) are not "
            "supported. Use spark.readStream.format('nsq') with options topic, channel and "
            "nsqd or lookupd; .trigger(availableNow=True) reads what is queued and stops."
        )

    def writer(self, schema: StructType, overwrite: bool) -> DataSourceWriter:
        if overwrite:
            raise NSQOptionError(
                "nsq sink: mode 'overwrite' is meaningless for a queue; use .mode('append')"
            )
        options = WriteOptions.parse(self.options)
        check_write_schema(schema, options.serialization)
        nsqd = resolve_nsqd(options)
        return (NSQArrowWriter if options.arrow else NSQWriter)(options, nsqd)

    def streamWriter(self, schema: StructType, overwrite: bool) -> DataSourceStreamWriter:
        options = WriteOptions.parse(self.options)
        check_write_schema(schema, options.serialization)
        nsqd = resolve_nsqd(options)
        return (NSQStreamArrowWriter if options.arrow else NSQStreamWriter)(options, nsqd)

    def streamReader(self, schema: StructType) -> DataSourceStreamReader:
        options = ReadOptions.parse(self.options)
        if schema is not None and schema.fieldNames() != SOURCE_SCHEMA.fieldNames():
            raise NSQOptionError(
                f"nsq source has a fixed schema {SOURCE_SCHEMA.simpleString()}; do not pass "
                f".schema(...) (got {schema.simpleString()})"
            )
        return NSQStreamReader(options)
